"""The input filter: redacts sensitive envelope text before it leaves the process in a span.

Applied once per handoff, at `create` (never per transition). Two mechanisms:
- regex patterns over free text (objective, reply_contract, parent_state, constraint values):
  API keys and tokens, bearer credentials, JWTs, `password=...`-style assignments, emails;
- field names: a constraint key that contains one of the names (case-insensitive, `-` and
  `_` ignored: `apiKey`, `api-key`, `API_KEY`) has its whole value replaced.
The objective itself never leaves the process: spans carry its SHA-256 and a filtered
summary truncated to `max_summary_chars` characters (default 200, "…" marks a cut).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

__all__ = ["DEFAULT_FIELD_NAMES", "DEFAULT_PATTERNS", "REDACTED", "InputFilter"]

REDACTED: Final = "[REDACTED]"

_ASSIGN: Final = (
    r"(?i)(?<![\w])((?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|client[_-]?secret"
    r"|private[_-]?key|auth)\s*[:=]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;]+)"
)
_BEARER: Final = r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"
_JWT: Final = r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
_SK: Final = r"\b(?:sk|pk|rk)-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_]{16,}"  # OpenAI / Stripe-style keys
_GH: Final = r"\b(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{20,}"  # GitHub tokens
_SLACK: Final = r"\bxox[abprs]-[A-Za-z0-9-]{10,}"
_AWS: Final = r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # AWS access key ids
_GOOGLE: Final = r"\bAIza[0-9A-Za-z_-]{35}\b"
_PEM: Final = r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
_EMAIL: Final = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"

#: Default secret patterns: `key = value` assignments of secrets (the key is kept), bearer
#: credentials, JWTs, API keys/tokens (OpenAI/Stripe-style, GitHub, Slack, AWS, Google),
#: PEM private keys, email addresses.
DEFAULT_PATTERNS: Final[tuple[str, ...]] = (
    _ASSIGN,
    _BEARER,
    _JWT,
    _SK,
    _GH,
    _SLACK,
    _AWS,
    _GOOGLE,
    _PEM,
    _EMAIL,
)

_ASSIGN_WORDS: Final = ("pass", "pwd", "secret", "token", "key", "auth")
#: Entries of each per-filter memo (text -> redacted text, key -> sensitive) before it is reset.
_MEMO_MAX: Final = 4096
#: Texts longer than this are never memoized (characters).
_MEMO_TEXT_MAX: Final = 2048

# Cheap necessary conditions of the default patterns (text, lower-cased text) -> bool: a
# pattern whose literal cannot occur is not run. Only for these exact pattern strings.
_GUARDS: Final[dict[str, Callable[[str, str], bool]]] = {
    _ASSIGN: lambda t, low: ("=" in t or ":" in t) and any(k in low for k in _ASSIGN_WORDS),
    _BEARER: lambda _t, low: "bearer" in low,
    _JWT: lambda t, _l: "eyJ" in t,
    _SK: lambda t, _l: "k-" in t,
    _GH: lambda t, _l: "gh" in t and "_" in t,
    _SLACK: lambda t, _l: "xox" in t,
    _AWS: lambda t, _l: "AKIA" in t or "ASIA" in t,
    _GOOGLE: lambda t, _l: "AIza" in t,
    _PEM: lambda t, _l: "PRIVATE KEY" in t,
    _EMAIL: lambda t, _l: "@" in t,
}

#: Default sensitive field names (matched as substrings of normalized constraint keys).
DEFAULT_FIELD_NAMES: Final[tuple[str, ...]] = (
    "password",
    "passwd",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "privatekey",
    "authorization",
    "credential",
    "cookie",
    "session",
    "email",
    "ssn",
)


def _norm_key(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "").replace(" ", "")


class InputFilter:
    """Redacts secrets from text and mappings; hashes and summarizes objectives.

    `patterns`: regexes whose matches are replaced by `replacement` (a pattern with a
    first capture group ending in `=`/`:` keeps that group, i.e. the key). `field_names`:
    mapping keys containing one of them (normalized) get their whole value replaced.
    Pass `patterns=()` / `field_names=()` to disable either. Limits: `max_summary_chars`
    characters of summary (>= 1); nested mappings/lists are walked up to depth 32 (deeper
    values are replaced whole). Results for short texts and keys are memoized per filter
    (templates repeat), at most 4096 entries each. Thread-safe.
    """

    __slots__ = (
        "_field_names",
        "_key_memo",
        "_regexes",
        "_text_memo",
        "max_summary_chars",
        "replacement",
    )

    def __init__(
        self,
        *,
        patterns: Iterable[str] = DEFAULT_PATTERNS,
        field_names: Iterable[str] = DEFAULT_FIELD_NAMES,
        replacement: str = REDACTED,
        max_summary_chars: int = 200,
    ) -> None:
        if isinstance(patterns, str):
            raise TypeError("patterns: expected an iterable of regex strings, got a single str")
        if isinstance(field_names, str):
            raise TypeError("field_names: expected an iterable of names, got a single str")
        if (
            isinstance(max_summary_chars, bool)
            or not isinstance(max_summary_chars, int)
            or max_summary_chars < 1
        ):
            raise ValueError(
                f"max_summary_chars: must be an integer >= 1, got {max_summary_chars!r}"
            )
        regexes = []
        for p in patterns:
            try:
                regexes.append((re.compile(p), _GUARDS.get(p)))
            except re.error as exc:
                raise ValueError(f"patterns: invalid regex {p!r}: {exc}") from None
        self._regexes = tuple(regexes)
        self._field_names = tuple(_norm_key(n) for n in field_names)
        self.replacement = replacement
        self.max_summary_chars = max_summary_chars
        self._text_memo: dict[str, str] = {}
        self._key_memo: dict[str, bool] = {}

    def _sub(self, m: re.Match[str]) -> str:
        if m.re.groups >= 2 and m.group(1) is not None and m.group(1).rstrip().endswith((":", "=")):
            return m.group(1) + self.replacement
        return self.replacement

    def redact_text(self, text: str) -> str:
        """`text` with every pattern match replaced."""
        hit = self._text_memo.get(text)
        if hit is not None:
            return hit
        out = text
        low = text.lower()
        for rx, guard in self._regexes:
            if guard is None or guard(out, low):
                out = rx.sub(self._sub, out)
        if len(text) <= _MEMO_TEXT_MAX:
            if len(self._text_memo) >= _MEMO_MAX:
                self._text_memo.clear()
            self._text_memo[text] = out
        return out

    def is_sensitive_key(self, key: str) -> bool:
        """True when the normalized key contains one of the sensitive field names."""
        hit = self._key_memo.get(key)
        if hit is None:
            k = _norm_key(key)
            hit = any(n in k for n in self._field_names)
            if len(self._key_memo) >= _MEMO_MAX:
                self._key_memo.clear()
            self._key_memo[key] = hit
        return hit

    def redact(self, value: Any, _depth: int = 0) -> Any:
        """A redacted copy of a JSON-like value (str / Mapping / list / tuple / scalars)."""
        t = type(value)
        if t is str:
            return self.redact_text(value)
        if t is int or t is float or t is bool or value is None:
            return value
        if _depth >= 32:
            return self.replacement
        if t is dict or isinstance(value, Mapping):
            return {
                k: (
                    self.replacement
                    if isinstance(k, str) and self.is_sensitive_key(k)
                    else self.redact(v, _depth + 1)
                )
                for k, v in value.items()
            }
        if t is list or t is tuple:
            return [self.redact(v, _depth + 1) for v in value]
        if isinstance(value, str):
            return self.redact_text(str(value))
        return value

    def summary(self, text: str) -> str:
        """The filtered text cut to `max_summary_chars` characters ("…" ends a cut one)."""
        red = self.redact_text(text)
        if len(red) <= self.max_summary_chars:
            return red
        return red[: self.max_summary_chars - 1] + "…"

    @staticmethod
    def digest(text: str) -> str:
        """`sha256:<hex>` of the UTF-8 text (of the raw, unfiltered objective)."""
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
