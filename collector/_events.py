"""The event API of a `collector.Handoff`, apart from collector/tracer.py (which owns the
state, the lock and the OTel calls): one method per event of the state table, each
`self.transition(event, at, **attrs)` (the table in collector/contract.py decides
legality), and the receiver's count of the tool calls its results report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading
    from datetime import datetime

    from typing_extensions import Unpack

    from collector._attrs import TransitionAttrs

__all__ = ["EventMethods"]


class EventMethods:
    """Mixed into Handoff, which provides `transition` and `_lock`, and sets `_tool_calls`
    (the count, this class's own slot) to None when it is built."""

    __slots__ = ("_tool_calls",)
    _tool_calls: int | None

    if TYPE_CHECKING:
        _lock: threading.Lock

        def transition(
            self, event: str, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]
        ) -> str: ...

    # -- the tool calls results report (handoff.tool_calls, against max_tool_calls) ---------

    def count_tool_call(self, n: int = 1) -> int:
        """Count `n` (int >= 0) more tool calls used for this handoff; returns the total. From
        the first call on (even of 0), every result (prepare, commit, resolve_committed)
        carries the total as `handoff.tool_calls` unless the call passes `tool_calls=`
        itself. ValueError on a bad n."""
        if type(n) is not int or n < 0:
            raise ValueError(f"n: expected an int >= 0, got {type(n).__name__} {n!r}")
        with self._lock:
            self._tool_calls = (self._tool_calls or 0) + n
            return self._tool_calls

    @property
    def tool_calls(self) -> int | None:
        """The tool calls counted so far with count_tool_call (None: never counted)."""
        return self._tool_calls

    # -- one method per event ---------------------------------------------------------------

    def accept(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("accept", at, **attrs)

    def reject(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("reject", at, **attrs)

    def expire(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("expire", at, **attrs)

    def timeout(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("timeout", at, **attrs)

    def start(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("start", at, **attrs)

    def prepare(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("prepare", at, **attrs)

    def commit(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("commit", at, **attrs)

    def fail(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("fail", at, **attrs)

    def verify(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("verify", at, **attrs)

    def verify_fail(
        self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]
    ) -> str:
        return self.transition("verify_fail", at, **attrs)

    def resolve_committed(
        self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]
    ) -> str:
        return self.transition("resolve_committed", at, **attrs)

    def resolve_failed(
        self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]
    ) -> str:
        return self.transition("resolve_failed", at, **attrs)

    def cancel(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("cancel", at, **attrs)

    def escalate(self, at: datetime | int | None = None, **attrs: Unpack[TransitionAttrs]) -> str:
        return self.transition("escalate", at, **attrs)
