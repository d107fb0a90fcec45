"""Real alternative StoreWriters for Ingestor's `store_writer=` injection point: each wraps
the product's own writer (ingest._store_writer.StoreWriters) and changes one thing — counts
failures, refuses some writes with a real clickhouse-connect error, holds a write, or loses
an answer — so tests drive the shell without monkeypatching it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from clickhouse_connect.driver.exceptions import DatabaseError

from ingest._store_writer import Pending, StoreWriters


class Observed(StoreWriters):
    """The real writer, counting writes that raised (`failures`), with a condition to wait
    on, and the clients each data write went in on (`data_clients`)."""

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition()
        self.failures = 0
        self.data_clients: list[Any] = []

    def _failed(self) -> None:
        with self._cond:
            self.failures += 1
            self._cond.notify_all()

    def wait_failures(self, n: int, timeout: float = 30.0) -> bool:
        """True once `n` writes failed (the Ingestor has recorded the first n - 1)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.failures >= n, timeout)

    def _guard(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:
            self._failed()
            raise

    def write(self, client, database, group, **kw):
        self.before(client, group)
        return self._guard(lambda: super(Observed, self).write(client, database, group, **kw))

    def write_data(self, client, database, group, **kw):
        self.data_clients.append(client)
        self.before(client, group)
        return self._guard(lambda: super(Observed, self).write_data(client, database, group, **kw))

    def before(self, client: Any, group: Sequence[Pending]) -> None:
        """Hook run before each write and data write (subclasses raise or hold here)."""


class Refusing(Observed):
    """Raises a real DatabaseError with ClickHouse error `code` for the first `times` writes
    (forever with times=-1); `after_data`: the group's data go in first, then it raises (the
    answer of a write that got in partly)."""

    def __init__(self, code: int, times: int, *, after_data: bool = False) -> None:
        super().__init__()
        self.code, self.left, self.after_data = code, times, after_data

    def _refuse(self) -> None:
        if self.left == 0:
            return
        self.left -= 1
        raise DatabaseError(f"Code: {self.code}. DB::Exception: refused by test", code=self.code)

    def write(self, client, database, group, **kw):
        def go() -> Any:
            if self.after_data and self.left:
                StoreWriters.write_data(self, client, database, group, token=kw["token"])
            self._refuse()
            return StoreWriters.write(self, client, database, group, **kw)

        return self._guard(go)


class Held(Observed):
    """Holds the first data write on `main` (the Ingestor's own client) until `release` is
    set; `entered` is set once it waits. `lose_other_once`: the first data write on another
    client goes in, then raises as if its answer was lost."""

    def __init__(self, main: Any, *, lose_other_once: bool = False, hold: bool = True) -> None:
        super().__init__()
        self.main = main
        self.entered, self.release = threading.Event(), threading.Event()
        self.lose_other = lose_other_once
        self.hold = hold
        self.lost = 0
        self.during_hold: list[Any] = []  # other clients' data writes while held
        self.others_done = 0  # data writes on other clients that returned or raised

    def wait_others_done(self, n: int, timeout: float = 30.0) -> bool:
        """True once `n` data writes on clients other than `main` ended."""
        with self._cond:
            return self._cond.wait_for(lambda: self.others_done >= n, timeout)

    def _other_done(self) -> None:
        with self._cond:
            self.others_done += 1
            self._cond.notify_all()

    def write_data(self, client, database, group, **kw):
        if client is self.main and self.hold and not self.release.is_set():
            self.entered.set()
            assert self.release.wait(60), "never released"
        elif client is not self.main and not self.release.is_set():
            self.during_hold.append(client)
        if client is self.main:
            return super().write_data(client, database, group, **kw)
        try:
            if self.lose_other:
                self.lose_other = False
                self.lost += 1
                StoreWriters.write_data(self, client, database, group, **kw)
                self.data_clients.append(client)
                raise ConnectionError("connection reset by peer")
            return super().write_data(client, database, group, **kw)
        finally:
            self._other_done()


class Gated(Observed):
    """Holds the first write until `release` is set (`entered` is set once it waits), so the
    requests submitted meanwhile are queued and taken in one round. `refuse_tenant`: every
    write of a group holding a request of that tenant raises a real data error (code 53,
    TYPE_MISMATCH), as a store refusing that request's data would."""

    def __init__(self, *, refuse_tenant: str | None = None) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()
        self.refuse_tenant = refuse_tenant
        self.groups: list[list[str]] = []  # the tenants of each group written or tried

    def before(self, client: Any, group: Sequence[Pending]) -> None:
        self.groups.append([x.decoded.tenant for x in group])
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(60), "never released"
        if self.refuse_tenant in {x.decoded.tenant for x in group}:
            self._failed()
            raise DatabaseError("Code: 53. DB::Exception: refused by test", code=53)
