"""Public names of a package loaded on first use (PEP 562), one helper for every package.

`handoffs --help` and serve's start must not pay for pandas, clickhouse-connect or protobuf
that only some names need, so each package's `__init__` maps its public names to the
modules that define them and lets this install the module-level `__getattr__`/`__dir__`:

    from foundation.lazy import lazy_exports

    _WHERE = {"funnel": "analytics.metrics", ...}
    lazy_exports(__name__, _WHERE)
    __all__ = sorted(_WHERE)

    if TYPE_CHECKING:  # type checkers read imports, not _WHERE
        from analytics.metrics import funnel

A loaded name is cached in the package's namespace, so later lookups are plain attribute
reads. No public name may also name a submodule of its package: importing that submodule
would rebind the package attribute to the module. tests/unit/test_package_faces.py holds
the TYPE_CHECKING imports equal to the table and refuses such a clash. `extras` names the
optional extra a module needs, for an ImportError that says what to install.
"""

from __future__ import annotations

import importlib
import sys
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
