"""Public names of a package loaded on first use (PEP 562), one helper for every package.

`handoffs --help` and serve's start must not pay for pandas, clickhouse-connect or protobuf
that only some names need, so each package's `__init__` maps its public names to the
modules that define them and lets this install the module-level `__getattr__`/`__dir__`:

    from foundation.lazy import lazy_exports

    _WHERE = {"funnel": "analytics.metrics", ...}
    lazy_exports(__name__, _WHERE)

A loaded name is cached in the package's namespace, so later lookups are plain attribute
reads. A public function named like its own submodule (`analytics.anomalies`) stays the
function when the submodule is imported directly, as it would with eager imports. `extras`
names the optional extra a module needs, for an ImportError that says what to install.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, where: Mapping[str, str], *, extras: Mapping[str, str] | None = None
) -> None:
    """Install lazy loading of `where`'s names (name -> absolute module) into `package`.

    `extras` maps a module to the optional extra (`pip install 'handoff-observatory[X]'`)
    its import needs. Unknown names raise AttributeError naming the package.
    """
    module = sys.modules[package]
    needs = dict(extras or {})

    def __getattr__(name: str) -> Any:
        target = where.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            mod = importlib.import_module(target)
        except ImportError as exc:
            if target not in needs:
                raise
            raise ImportError(
                f"{name} needs the optional extra: pip install "
                f"'handoff-observatory[{needs[target]}]' ({exc})"
            ) from exc
        value = getattr(mod, name)
        setattr(module, name, value)  # once: later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(where))

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__dir__ = __dir__  # type: ignore[method-assign]

    class _Package(types.ModuleType):
        # The import system sets a submodule as an attribute of its package last; when the
        # package exports a function of that name, keep the function.
        def __setattr__(self, name: str, value: Any) -> None:
            if isinstance(value, types.ModuleType) and where.get(name) == value.__name__:
                value = getattr(value, name)
            super().__setattr__(name, value)

    module.__class__ = _Package
