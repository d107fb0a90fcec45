"""Real alternative WriteBackends for Ingestor's `backend=` injection point: each wraps the
product's own backend (ingest._backend.Backends, built on the client and database given)
and changes one thing — counts failures, refuses some writes with a real clickhouse-connect
error, holds a write, or loses an answer — so tests drive the writer without monkeypatching
it. `on(client)` gives the same double on another connection (its state shared), as the
writer asks for when it writes two groups' data at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from clickhouse_connect.driver.exceptions import DatabaseError

from ingest._backend import Backends, Group, WriteBackend
from ingest._inserts import BatchResult

#: the Ingestor's default source, which the tests using these doubles keep
SOURCE = "otlp-http"


class Observed:
    """The real backend, counting writes that raised (`failures`), with a condition to wait
    on, and the clients each data write went in on (`data_clients`)."""

    def __init__(self, client: Any, database: str) -> None:
        self.client = client
        self.inner: WriteBackend = Backends(client, database, source=SOURCE)
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

    # the WriteBackend methods, on this double's own client
    def on(self, client: Any) -> WriteBackend:
        return _On(self, client)

    def data(self, group: Group) -> None:
        self.data_on(self.client, self.inner, group)

    def chain(self, group: Group, prev_chain: str) -> list[BatchResult]:
        return self.inner.chain(group, prev_chain)

    def write(self, group: Group, prev_chain: str) -> list[BatchResult]:
        result: list[BatchResult] = self.write_on(self.client, self.inner, group, prev_chain)
        return result

    # what a double changes: each step given its connection and the real backend on it
    def write_on(self, client: Any, inner: WriteBackend, group: Group, prev_chain: str) -> Any:
        self.before(client, group)
        return self._guard(lambda: inner.write(group, prev_chain))

    def data_on(self, client: Any, inner: WriteBackend, group: Group) -> None:
        self.data_clients.append(client)
        self.before(client, group)
        self._guard(lambda: inner.data(group))

    def before(self, client: Any, group: Group) -> None:
        """Hook run before each write and data write (subclasses raise or hold here)."""


class _On:
    """A double on another connection: the real backend on it, the double's hooks and state."""

    def __init__(self, double: Observed, client: Any) -> None:
        self.double, self.client, self.inner = double, client, double.inner.on(client)

    def on(self, client: Any) -> WriteBackend:
        return self.double.on(client)

    def data(self, group: Group) -> None:
        self.double.data_on(self.client, self.inner, group)

    def chain(self, group: Group, prev_chain: str) -> list[BatchResult]:
        return self.inner.chain(group, prev_chain)

    def write(self, group: Group, prev_chain: str) -> list[BatchResult]:
        result: list[BatchResult] = self.double.write_on(self.client, self.inner, group, prev_chain)
        return result


class Refusing(Observed):
    """Raises a real DatabaseError with ClickHouse error `code` for the first `times` writes
    (forever with times=-1); `after_data`: the group's data go in first, then it raises (the
    answer of a write that got in partly)."""

    def __init__(
        self, client: Any, database: str, code: int, times: int, *, after_data: bool = False
    ) -> None:
        super().__init__(client, database)
        self.code, self.left, self.after_data = code, times, after_data

    def _refuse(self) -> None:
        if self.left == 0:
            return
        self.left -= 1
        raise DatabaseError(f"Code: {self.code}. DB::Exception: refused by test", code=self.code)

    def write_on(self, client: Any, inner: WriteBackend, group: Group, prev_chain: str) -> Any:
        def go() -> Any:
            if self.after_data and self.left:
                inner.data(group)
            self._refuse()
            return inner.write(group, prev_chain)

        return self._guard(go)


class Held(Observed):
    """Holds the first data write on its own client (the Ingestor's) until `release` is
    set; `entered` is set once it waits. `lose_other_once`: the first data write on another
    client goes in, then raises as if its answer was lost."""

    def __init__(
        self, client: Any, database: str, *, lose_other_once: bool = False, hold: bool = True
    ) -> None:
        super().__init__(client, database)
        self.entered, self.release = threading.Event(), threading.Event()
        self.lose_other = lose_other_once
        self.hold = hold
        self.lost = 0
        self.during_hold: list[Any] = []  # other clients' data writes while held
        self.others_done = 0  # data writes on other clients that returned or raised

    def wait_others_done(self, n: int, timeout: float = 30.0) -> bool:
        """True once `n` data writes on clients other than the Ingestor's ended."""
        with self._cond:
            return self._cond.wait_for(lambda: self.others_done >= n, timeout)

    def _other_done(self) -> None:
        with self._cond:
            self.others_done += 1
            self._cond.notify_all()

    def data_on(self, client: Any, inner: WriteBackend, group: Group) -> None:
        main = client is self.client
        if main and self.hold and not self.release.is_set():
            self.entered.set()
            assert self.release.wait(60), "never released"
        elif not main and not self.release.is_set():
            self.during_hold.append(client)
        if main:
            return super().data_on(client, inner, group)
        try:
            if self.lose_other:
                self.lose_other = False
                self.lost += 1
                inner.data(group)
                self.data_clients.append(client)
                raise ConnectionError("connection reset by peer")
            return super().data_on(client, inner, group)
        finally:
            self._other_done()


class Gated(Observed):
    """Holds the first write until `release` is set (`entered` is set once it waits), so the
    requests submitted meanwhile are queued and taken in one round. `refuse_tenant`: every
    write of a group holding a request of that tenant raises a real data error (code 53,
    TYPE_MISMATCH), as a store refusing that request's data would."""

    def __init__(self, client: Any, database: str, *, refuse_tenant: str | None = None) -> None:
        super().__init__(client, database)
        self.entered, self.release = threading.Event(), threading.Event()
        self.refuse_tenant = refuse_tenant
        self.groups: list[list[str]] = []  # the tenants of each group written or tried

    def before(self, client: Any, group: Group) -> None:
        self.groups.append([x.decoded.tenant for x in group.members])
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(60), "never released"
        if self.refuse_tenant in {x.decoded.tenant for x in group.members}:
            self._failed()
            raise DatabaseError("Code: 53. DB::Exception: refused by test", code=53)
