"""What `handoffs watch`'s webhook sender does with a hostile or broken webhook, checked by
effect against real HTTP servers on loopback: a redirect to another listener is not
followed (that listener gets nothing), and an endless 2xx answer costs a bounded read.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from analytics._cli.watch import MAX_RESPONSE_BYTES, WebhookSender
from serve.testing import wait_until

GIB = 1 << 30
CHUNK = b"x" * (64 << 10)  # the one buffer the endless server sends, again and again


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(10)


class _Target(BaseHTTPRequestHandler):
    """The host a redirect points at (an internal service): counts what reaches it."""

    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self._hit()

    def do_POST(self) -> None:
        self._hit()

    def _hit(self) -> None:
        type(self).hits.append(f"{self.command} {self.path}")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Counted(BaseHTTPRequestHandler):
    """A handler counting the POSTs its class answered."""

    posts = 0


def _redirecting(code: int, location: str) -> type[_Counted]:
    class Redirect(_Counted):
        posts = 0

        def do_POST(self) -> None:
            type(self).posts += 1
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(code)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    return Redirect


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failed_delivery_and_is_not_followed(code, caplog):
    _Target.hits = []
    with _serving(_Target) as target:
        location = f"{target}/admin/drop?token=s3cret"
        hook_handler = _redirecting(code, location)
        with (
            _serving(hook_handler) as hook,
            caplog.at_level(logging.WARNING, logger="handoffs.watch"),
        ):
            d = WebhookSender(f"{hook}/hook", attempts=3, backoff_s=0.01)(
                {"alert": "a", "state": "firing"}
            )
    assert _Target.hits == []
    assert hook_handler.posts == 1  # not retried
    assert (d.ok, d.attempts, d.status) == (False, 1, code)
    where = target  # scheme and host:port only
    assert d.error == f"HTTP {code} redirect to {where} not followed"
    assert f"failed after 1 attempt(s): HTTP {code} redirect to {where} not followed" in (
        caplog.text
    )
    assert "s3cret" not in caplog.text and "admin" not in caplog.text


def _tcp_buffer_max(name: str) -> int:
    """The most the kernel buffers on one side of a TCP connection (bytes)."""
    try:
        return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 6 << 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(field)


def _reset_peak_rss() -> bool:
    """Reset VmHWM (the peak RSS) to the current RSS; False where the kernel does not allow."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_endless_2xx_answer_is_read_up_to_the_bound(framing):
    """A 2xx streaming 1 GiB (generated from one 64 KiB buffer, never held): the delivery is
    ok within seconds, the process's peak RSS grows by a few MiB at most, and the server
    can push no more than the bound plus what the kernel buffers before the sender hangs up.
    """
    pytest.importorskip("resource")
    sent = {"bytes": 0, "closed_by_client": False}
    done = threading.Event()

    class Endless(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            # a small send buffer: what was sent is close to what the client took
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            self.send_response(200)
            if framing == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(GIB))
            self.end_headers()
            head = f"{len(CHUNK):x}\r\n".encode()
            try:
                while sent["bytes"] < GIB:
                    if framing == "chunked":
                        self.wfile.write(head + CHUNK + b"\r\n")
                    else:
                        self.wfile.write(CHUNK)
                    sent["bytes"] += len(CHUNK)
                if framing == "chunked":
                    self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                sent["closed_by_client"] = True
            finally:
                done.set()

        def log_message(self, *args: object) -> None:
            pass

    with _serving(Endless) as hook:
        peak_resettable = _reset_peak_rss()
        rss_before = _status_kib("VmRSS")
        t0 = time.monotonic()
        d = WebhookSender(f"{hook}/hook", attempts=1)({"alert": "a", "state": "firing"})
        took = time.monotonic() - t0
        grew_kib = (_status_kib("VmHWM") if peak_resettable else _status_kib("VmRSS")) - (
            rss_before
        )
        wait_until(done.is_set, 30, "the endless server to stop sending")
    assert (d.ok, d.status) == (True, 200)
    assert took < 10, f"the delivery took {took:.1f}s"
    assert grew_kib < 8 * 1024, f"RSS grew by {grew_kib} KiB"
    assert sent["closed_by_client"], sent
    in_flight = _tcp_buffer_max("tcp_rmem") + _tcp_buffer_max("tcp_wmem") + 2 * len(CHUNK)
    assert sent["bytes"] <= MAX_RESPONSE_BYTES + in_flight, sent
    print(
        f"FIGURES webhook_endless_{framing}: took_s={took:.2f} rss_peak_growth_kib={grew_kib} "
        f"server_sent_bytes={sent['bytes']} bound={MAX_RESPONSE_BYTES}"
    )
