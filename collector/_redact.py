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
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["DEFAULT_FIELD_NAMES", "DEFAULT_PATTERNS", "REDACTED", "InputFilter"]

REDACTED: Final = "[REDACTED]"

#: Default secret patterns. Each is applied case-sensitively unless it carries (?i).
DEFAULT_PATTERNS: Final[tuple[str, ...]] = (
    # key = value / key: value assignments of secrets (keeps the key, hides the value)
    r"(?i)(?<![\w])((?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|client[_-]?secret"
    r"|private[_-]?key|auth)\s*[:=]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;]+)",
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}",
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWT
    r"\b(?:sk|pk|rk)-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_]{16,}",  # OpenAI / Stripe-style keys
    r"\b(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{20,}",  # GitHub tokens
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",  # Slack tokens
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bAIza[0-9A-Za-z_-]{35}\b",  # Google API keys
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",  # email addresses
)

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
    characters of summary (>= 1); nested mappings/lists are walked up to depth 32.
    """

    __slots__ = ("_field_names", "_regexes", "max_summary_chars", "replacement")

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
                regexes.append(re.compile(p))
            except re.error as exc:
                raise ValueError(f"patterns: invalid regex {p!r}: {exc}") from None
        self._regexes = tuple(regexes)
        self._field_names = tuple(_norm_key(n) for n in field_names)
        self.replacement = replacement
        self.max_summary_chars = max_summary_chars

    def _sub(self, m: re.Match[str]) -> str:
        if m.re.groups >= 2 and m.group(1) is not None and m.group(1).rstrip().endswith((":", "=")):
            return m.group(1) + self.replacement
        return self.replacement

    def redact_text(self, text: str) -> str:
        """`text` with every pattern match replaced."""
        for rx in self._regexes:
            text = rx.sub(self._sub, text)
        return text

    def is_sensitive_key(self, key: str) -> bool:
        k = _norm_key(key)
        return any(n in k for n in self._field_names)

    def redact(self, value: Any, _depth: int = 0) -> Any:
        """A redacted copy of a JSON-like value (str / Mapping / list / tuple / scalars)."""
        if isinstance(value, str):
            return self.redact_text(value)
        if _depth >= 32:
            return self.replacement
        if isinstance(value, Mapping):
            return {
                k: (
                    self.replacement
                    if isinstance(k, str) and self.is_sensitive_key(k)
                    else self.redact(v, _depth + 1)
                )
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.redact(v, _depth + 1) for v in value]
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
