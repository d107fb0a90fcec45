"""Untrusted text made safe to show: ids and names come from agents' spans, not from us.

`terminal_safe` escapes what a terminal would act on or display misleadingly — C0 and C1
control characters (ESC starts ANSI/OSC sequences that recolour, retitle or hide output),
DEL, and the Unicode bidirectional controls (an RTL override makes `exe.txt` read as
`txt.exe`) — as visible `\\xNN` / `\\uNNNN` escapes. `html_safe` does the same after HTML
escaping. `markdown_link_text` also escapes Markdown's link syntax. All are pure.
"""

from __future__ import annotations

import html
import re
from typing import Final

__all__ = ["BIDI_CONTROLS", "html_safe", "markdown_link_text", "terminal_safe"]

#: Unicode bidirectional formatting characters (UAX #9): embeddings, overrides, isolates, marks.
BIDI_CONTROLS: Final = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_UNSAFE: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + "".join(sorted(BIDI_CONTROLS)) + "]")
_UNSAFE_ONE_LINE: Final = re.compile("[\x00-\x1f\x7f-\x9f" + "".join(sorted(BIDI_CONTROLS)) + "]")
_MARKDOWN: Final = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~])")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal_safe(text: object, *, one_line: bool = False) -> str:
    """`str(text)` with control and bidi characters as visible escapes. Newlines and tabs
    stay unless `one_line` (then they are escaped too: one value, one line)."""
    return (_UNSAFE_ONE_LINE if one_line else _UNSAFE).sub(_escape, str(text))


def html_safe(text: object) -> str:
    """`text` HTML-escaped (quotes included), controls and bidi characters as escapes."""
    return html.escape(terminal_safe(text, one_line=True), quote=True)


def markdown_link_text(text: object) -> str:
    """`text` for the label of a Markdown link: one line, controls escaped, Markdown's own
    syntax backslash-escaped so an id cannot open a link, an image or an HTML tag."""
    return _MARKDOWN.sub(r"\\\1", terminal_safe(text, one_line=True))
