"""The SLO rules file: YAML -> validated Rule objects, every refusal with its line.

The schema is a pydantic model (docs/alerts.md lists every field). The YAML is composed
into nodes once, so a pydantic error location (`slos`, 0, `target`) maps back to the line
of that value in the file (`yaml` node marks); a missing field points at its rule.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "ANOMALY_PREFIX",
    "RATE_OBJECTIVES",
    "RATIO_OBJECTIVES",
    "BurnRateModel",
    "RuleModel",
    "RulesError",
    "RulesFile",
    "fmt_duration",
    "parse",
    "parse_duration",
]

#: Ratio objectives: (numerator, denominator) counts of analytics.metrics.RATES; bad = den - num.
RATIO_OBJECTIVES: Final = ("p_accept", "p_execute", "p_evidence", "p_commit", "p_e2e")
#: Rate objectives: bad = numerator, total = denominator (settled handoffs).
RATE_OBJECTIVES: Final = ("unknown_rate", "escalation_rate")
ANOMALY_PREFIX: Final = "anomaly:"

_DURATION = re.compile(r"^([0-9]+)([smhdw])$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


class RulesError(ValueError):
    """A rules file refused: `problems` are (line, reason) pairs, line 1-based (0 = unknown).
    str() is one `path:line: reason` per problem."""

    def __init__(self, path: str, problems: Sequence[tuple[int, str]]) -> None:
        self.path = path
        self.problems = tuple(problems)
        super().__init__("\n".join(f"{path}:{line}: {reason}" for line, reason in self.problems))


def parse_duration(text: str) -> timedelta:
    """'30d' -> 30 days: a positive integer and one unit s, m, h, d or w. ValueError otherwise."""
    m = _DURATION.match(str(text).strip()) if isinstance(text, str) else None
    if not m or int(m.group(1)) == 0:
        raise ValueError(
            f"duration {text!r}: expected a positive whole number and a unit "
            "s, m, h, d or w, e.g. 30d, 6h, 5m"
        )
    return timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])


def fmt_duration(d: timedelta) -> str:
    """The shortest spelling of a duration in d/h/m/s parts: 30d, 1h, 2h24m, 72s -> 1m12s."""
    s = int(d.total_seconds())
    if s <= 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    return "".join(parts)


def _duration(v: Any) -> timedelta:
    if not isinstance(v, str):
        raise ValueError(
            f"duration {v!r}: expected a whole number and a unit s, m, h, d or w, e.g. 30d, 6h, 5m"
        )
    return parse_duration(v)


Duration = Annotated[timedelta, BeforeValidator(_duration)]


def _objectives() -> tuple[str, ...]:
    from analytics.anomaly_kinds import ANOMALY_KINDS

    return (*RATIO_OBJECTIVES, *RATE_OBJECTIVES, *(ANOMALY_PREFIX + k for k in ANOMALY_KINDS))


class BurnRateModel(BaseModel):
    """One window pair of `burn_rates:`."""

    model_config = ConfigDict(extra="forbid")

    severity: Literal["page", "ticket"]
    long: Duration
    short: Duration
    factor: float = Field(gt=0)


class RuleModel(BaseModel):
    """One entry of `slos:`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    objective: str
    target: float
    window: Duration = timedelta(days=30)
    where: dict[str, str] = Field(default_factory=dict)
    burn_rates: list[BurnRateModel] | None = None
    description: str = ""

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: str) -> str:
        known = _objectives()
        if v not in known:
            raise ValueError(
                f"unknown objective {v!r}; choose from {', '.join(known[:7])} or "
                f"{ANOMALY_PREFIX}KIND with KIND one of "
                f"{', '.join(k[len(ANOMALY_PREFIX) :] for k in known[7:])}"
            )
        return v

    @field_validator("target", mode="before")
    @classmethod
    def _target(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1:
            raise ValueError(
                f"target must be a number strictly between 0 and 1 (the fraction of good "
                f"events, e.g. 0.999), got {v!r}"
            )
        return v

    @field_validator("where")
    @classmethod
    def _where(cls, v: dict[str, str]) -> dict[str, str]:
        from analytics._sql.cohort import DIMENSIONS

        for k in v:
            if k not in DIMENSIONS:
                raise ValueError(f"unknown dimension {k!r}; choose from {', '.join(DIMENSIONS)}")
        return v


class RulesFile(BaseModel):
    """The whole file: `slos:`, a list of rules."""

    model_config = ConfigDict(extra="forbid")

    slos: list[RuleModel]


# ------------------------------------------------------------------ YAML node lookup


def _line(node: yaml.Node | None) -> int:
    return node.start_mark.line + 1 if node is not None else 0


def _child(node: yaml.Node, key: str | int) -> tuple[yaml.Node | None, yaml.Node | None]:
    """(key node, value node) of `key` under a mapping or sequence node, Nones if absent."""
    if isinstance(node, yaml.MappingNode) and isinstance(key, str):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return k, v
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
        return None, node.value[key]
    return None, None


def _locate(root: yaml.Node, loc: tuple[Any, ...], *, key: bool = False) -> int:
    """Line of the node at `loc` (of its key with key=True); the deepest existing parent's line
    when the path stops early (a missing field: the mapping that lacks it)."""
    node = root
    for part in loc:
        k, v = _child(node, part)
        if v is None:
            break
        node = k if (key and k is not None and part == loc[-1]) else v
    return _line(node)


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _reason(err: Any) -> str:
    loc = tuple(err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"{_where(loc[:-1]) or 'file'}: missing required field {loc[-1]!r}"
    if err["type"] == "extra_forbidden":
        return f"{_where(loc[:-1]) or 'file'}: unknown field {loc[-1]!r}"
    if err["type"] == "string_pattern_mismatch" and loc[-1] == "name":
        msg = "a name is letters, digits, '_', '.' or '-' (at most 64), starting with a letter or digit"
    return f"{_where(loc)}: {msg}"


def _duplicate_keys(node: yaml.Node) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value in seen:
                    out.append((_line(k), f"key {k.value!r} given twice"))
                seen.add(k.value)
            out += _duplicate_keys(v)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            out += _duplicate_keys(v)
    return out


def parse(text: str, *, path: str = "<rules>") -> list[tuple[RuleModel, int]]:
    """The validated entries of a YAML rules document, each with its line; RulesError listing
    every (line, reason) found."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RulesError(
            path, [(mark.line + 1 if mark else 0, f"not valid YAML: {problem}")]
        ) from None
    if root is None or not isinstance(data, dict):
        raise RulesError(path, [(_line(root) or 1, "expected a mapping with a `slos:` list")])
    problems = _duplicate_keys(root)
    if problems:
        raise RulesError(path, problems)
    try:
        model = RulesFile.model_validate(data)
    except ValidationError as exc:
        errs = exc.errors()
        raise RulesError(
            path,
            [
                (_locate(root, tuple(e["loc"]), key=e["type"] == "extra_forbidden"), _reason(e))
                for e in errs
            ],
        ) from None
    return _checked(model, root, path)


def _checked(model: RulesFile, root: yaml.Node, path: str) -> list[tuple[RuleModel, int]]:
    """The checks across fields and entries: unique names, window pairs that fit."""
    problems: list[tuple[int, str]] = []
    first: dict[str, int] = {}
    for i, m in enumerate(model.slos):
        at = ("slos", i)
        if m.name in first:
            problems.append(
                (
                    _locate(root, (*at, "name")),
                    f"slos[{i}].name: duplicate SLO name {m.name!r} (first at line {first[m.name]})",
                )
            )
        first.setdefault(m.name, _locate(root, (*at, "name")))
        for j, b in enumerate(m.burn_rates or ()):
            line = _locate(root, (*at, "burn_rates", j))
            if b.short >= b.long:
                problems.append(
                    (
                        line,
                        f"slos[{i}].burn_rates[{j}]: short window {fmt_duration(b.short)} "
                        f"must be shorter than long window {fmt_duration(b.long)}",
                    )
                )
            if b.long > m.window:
                problems.append(
                    (
                        line,
                        f"slos[{i}].burn_rates[{j}]: long window {fmt_duration(b.long)} is "
                        f"longer than the SLO window {fmt_duration(m.window)}",
                    )
                )
        if m.burn_rates is not None and not m.burn_rates:
            problems.append(
                (
                    _locate(root, (*at, "burn_rates")),
                    f"slos[{i}].burn_rates: empty; omit it for the defaults",
                )
            )
    if problems:
        raise RulesError(path, problems)
    return [(m, _locate(root, ("slos", i))) for i, m in enumerate(model.slos)]
