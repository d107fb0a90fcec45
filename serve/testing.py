"""Run `handoffs serve` as a subprocess for tests, demos and benchmarks.

chDB lets a process open one data path in its lifetime, so a serve with its own store
always runs in a child process. `start_serve` picks free ports, waits (with a deadline,
no fixed sleeps) until GET /health answers, and returns a ServeHandle.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["ServeHandle", "free_port", "start_serve", "wait_until"]

_T = TypeVar("_T")


def wait_until(
    cond: Callable[[], _T | None], timeout: float, what: str, *, every: float = 0.05
) -> _T:
    """Check `cond` every `every` seconds until it returns something truthy, and return that;
    TimeoutError naming `what` after `timeout` seconds. The one way tests wait for a state."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS may hand it out again later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on host:port (a socket in TIME_WAIT does not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


@dataclass(slots=True)
class ServeHandle:
    otlp_url: str  # http://127.0.0.1:P (POST {otlp_url}/v1/traces)
    query_url: str  # http://127.0.0.1:Q, ClickHouse HTTP, read-only
    store_dir: Path
    database: str
    process: subprocess.Popen
    log_path: Path
    otlp_port: int
    query_port: int
    tokens: str | None = None
    grpc_port: int = 0  # OTLP/gRPC (TraceService/Export) on 127.0.0.1; 0 = off
    #: the read token client() sends (as the password); None = none
    query_token: str | None = None

    @property
    def grpc_target(self) -> str:
        """127.0.0.1:P, a gRPC channel target (grpc.insecure_channel, the OTLP gRPC exporter)."""
        if not self.grpc_port:
            raise RuntimeError("this serve runs without OTLP/gRPC (grpc_port=0)")
        return f"127.0.0.1:{self.grpc_port}"

    def health(self, timeout: float = 5.0, *, wait_s: float = 0.0) -> dict:
        """GET /health; with `wait_s`, serve answers once every acknowledged request is
        stored (or after `wait_s` seconds)."""
        query = f"?wait_s={wait_s:g}" if wait_s else ""
        with urllib.request.urlopen(
            f"{self.otlp_url}/health{query}", timeout=timeout + wait_s
        ) as r:
            return json.loads(r.read())

    @property
    def query_auth(self) -> tuple[str, str] | None:
        """`query_token` as HTTP basic auth (`requests`' `auth=`), None without one."""
        return ("reader", self.query_token) if self.query_token is not None else None

    def client(self, **kwargs: Any) -> Client:
        """A clickhouse-connect HTTP client on the query port (read-only), sending
        `query_token` as its password unless `password=` is given."""
        import clickhouse_connect

        if self.query_token is not None:
            kwargs.setdefault("password", self.query_token)
        return clickhouse_connect.get_client(
            host="127.0.0.1", port=self.query_port, database=self.database, **kwargs
        )

    def wait_stored(self, timeout: float = 60.0, poll_s: float = 0.05) -> dict:
        """Wait until nothing is queued and the spool has no backlog; returns the last health
        document. Serve itself waits (`/health?wait_s=`, up to 10 s per request): polling
        every few ms took CPU from the serve being measured (bench/ingest_throughput.py).
        `poll_s`: the pause between two such requests when one ends with work left."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            h = self.health(wait_s=round(min(max(left, 0.0), 10.0), 3))
            if h["queued"] == 0 and h["spool_backlog_bytes"] == 0:
                return h
            if time.monotonic() >= deadline:
                raise TimeoutError(f"serve still has work queued after {timeout}s: {h}")
            time.sleep(poll_s)

    def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM (drain, exit 0) and wait; returns the exit code. Idempotent."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL: a crash, nothing drained."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class _PortTaken(RuntimeError):
    """serve could not bind a port that was free when it was picked."""


def start_serve(
    tmp_path: str | Path,
    tokens: str | None = None,
    *,
    otlp_port: int | None = None,
    query_port: int | None = None,
    grpc_port: int | None = None,
    **kwargs: Any,
) -> ServeHandle:
    """Start `handoffs serve --store chdb://<store_dir>` and wait until /health answers.

    `tokens` is 'token=tenant,...' (None = no auth); `query_tokens` the query port's read
    tokens, the same form with `*` for every tenant (ServeHandle.client() then sends the
    first one); None = serve's default, an operator token it keeps in
    `<store_dir>/query-token`, which the handle reads and client() sends;
    `query_port_open` runs the port without tokens. Ports None pick free ones; `grpc_port`
    0 runs serve without OTLP/gRPC. Reusing `store_dir` (and the ports)
    restarts serve on the same store, e.g. after kill(). Raises RuntimeError with serve's log
    when it exits or does not answer within `timeout` seconds.

    A port picked here is free when picked, but another process (a parallel test worker)
    may bind it before serve does: serve then exits naming it, and it is started again on
    newly picked ports, up to five times. Ports the caller gives are never changed.
    """
    for attempt in range(5):
        try:
            return _start_once(
                tmp_path,
                tokens,
                otlp_port=otlp_port or free_port(),
                query_port=query_port or free_port(),
                grpc_port=free_port() if grpc_port is None else grpc_port,
                picked=(otlp_port is None, query_port is None, grpc_port is None),
                **kwargs,
            )
        except _PortTaken:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def _start_once(
    tmp_path: str | Path,
    tokens: str | None = None,
    *,
    otlp_port: int,
    query_port: int,
    grpc_port: int,
    picked: tuple[bool, bool, bool],
    store_dir: str | Path | None = None,
    database: str = "handoffs",
    query_tokens: str | None = None,
    query_port_open: bool = False,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 90.0,
) -> ServeHandle:
    """One start of serve on these ports (start_serve); _PortTaken when serve exits
    because a port in `picked` (OTLP, query, gRPC) was bound by someone else meanwhile."""
    tmp = Path(tmp_path)
    store = Path(store_dir) if store_dir else tmp / "data"
    # Otherwise /health could be answered by whatever already listens there (another serve)
    # while this one fails to bind.
    for what, port in (("OTLP", otlp_port), ("query", query_port), ("gRPC", grpc_port)):
        if not port:
            continue
        if port_in_use(port):
            raise RuntimeError(
                f"{what} port {port} on 127.0.0.1 is in use (another serve or demo?); "
                "stop it or pick another port"
            )
    log_path = tmp / f"serve-{otlp_port}-{int(time.time() * 1000)}.log"
    cmd = [
        sys.executable,
        "-m",
        "handoffs",
        "serve",
        "--store",
        f"chdb://{store}",
        "--database",
        database,
        "--otlp-port",
        str(otlp_port),
        "--query-port",
        str(query_port),
        # gRPC off through the environment: a serve of a tree without gRPC (bench/_paired)
        # refuses the flag and ignores the variable
        *(("--grpc-port", str(grpc_port)) if grpc_port else ()),
        *extra_args,
    ]
    if tokens:
        cmd += ["--tokens", tokens]
    if query_port_open:
        cmd += ["--query-port-open"]
    full_env = {**os.environ, **(env or {})}
    if not grpc_port:
        full_env["HANDOFFS_GRPC_PORT"] = "0"
    if tokens is None:
        full_env.pop("HANDOFFS_TOKENS", None)
    if query_tokens:
        # in the environment, not argv: other local users can read a process's argv
        full_env["HANDOFFS_QUERY_TOKENS"] = query_tokens
    elif "HANDOFFS_QUERY_TOKENS" not in (env or {}):
        full_env.pop("HANDOFFS_QUERY_TOKENS", None)
    if "HANDOFFS_QUERY_PORT_OPEN" not in (env or {}):
        full_env.pop("HANDOFFS_QUERY_PORT_OPEN", None)
    # the log may sit in the store directory (handoffs demo): this user's alone, like it
    with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=full_env)
    handle = ServeHandle(
        otlp_url=f"http://127.0.0.1:{otlp_port}",
        query_url=f"http://127.0.0.1:{query_port}",
        store_dir=store,
        database=database,
        process=proc,
        log_path=log_path,
        otlp_port=otlp_port,
        query_port=query_port,
        tokens=tokens,
        grpc_port=grpc_port,
        query_token=query_tokens.split(",")[0].partition("=")[0] if query_tokens else None,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = handle.log()
            names = ("(OTLP HTTP)", "(query)", "(OTLP gRPC)")
            taken = any(
                was_picked and f"port {port} {name} is in use" in log
                for was_picked, port, name in zip(
                    picked, (otlp_port, query_port, grpc_port), names, strict=True
                )
            ) or (all(picked) and ("Address already in use" in log or "cannot bind" in log))
            error = _PortTaken if taken else RuntimeError
            raise error(f"serve exited with {proc.returncode}:\n{log}")
        try:
            handle.health(timeout=2)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.05)
            continue
        # /health answers as soon as the server thread runs; serve prints its start-up
        # line (addresses, spool, auth) just after: a caller may read it from the log
        if "OTLP http" in handle.log():
            if handle.query_token is None and not (
                query_port_open
                or full_env.get("HANDOFFS_QUERY_TOKENS")
                or full_env.get("HANDOFFS_QUERY_PORT_OPEN") == "1"
            ):
                handle.query_token = _generated_token(store)
            return handle
        time.sleep(0.01)
    handle.kill()
    raise RuntimeError(
        f"serve did not start (answer /health, print its addresses) within {timeout}s:\n"
        f"{handle.log()}"
    )


def _generated_token(store: Path) -> str | None:
    """The read token serve keeps in the store when it was given none (None: the port is
    open, or serve was given its tokens through the environment)."""
    from foundation.read_token import TOKEN_FILE

    try:
        return (store / TOKEN_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------- building requests
