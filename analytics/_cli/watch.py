"""`handoffs watch`: evaluate the SLO rules periodically and POST fire/resolve to a webhook.

The loop is a thin shell: the evaluation and the sender are injected (keyword-only), what to
notify is analytics.slo.burn.decide (pure). A notification whose delivery failed after its
retries leaves that alert's state as it was, so the next evaluation tries it again.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import Message as HTTPMessage
from typing import IO, Any
from urllib.parse import urljoin, urlsplit

from analytics.slo.burn import AlertState, SloStatus, decide, notification_body

__all__ = ["Delivery", "WebhookSender", "check_webhook_url", "run_watch"]

log = logging.getLogger("handoffs.watch")

#: the most of a webhook's answer read (bytes); the connection is closed after it
MAX_RESPONSE_BYTES = 64 * 1024


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect: urlopen would follow a 301/302/303 to a POST as a GET to
    wherever `Location` points (an internal host), and the body is for the webhook alone.
    The 3xx then surfaces as an HTTPError."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def _where(base: str, location: str | None) -> str:
    """`location` (resolved against `base`) as scheme://host[:port] only: its path, query
    and credentials may carry secrets, and its characters are the server's choice."""
    if not location:
        return "no Location"
    try:
        parts = urlsplit(urljoin(base, location))
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "an invalid Location"
    host = "".join(
        ch for ch in (parts.hostname or "") if ch.isascii() and (ch.isalnum() or ch in ".-:")
    )
    scheme = parts.scheme if parts.scheme.isascii() and parts.scheme.isalpha() else "?"
    return f"{scheme}://{host}{port}" if host else f"{scheme}: without a host"


def check_webhook_url(url: str) -> str:
    """`url` if it is an absolute http(s) URL with a host; ValueError saying why otherwise."""
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"webhook URL {url!r}: expected an absolute http:// or https:// URL with a host, "
            "e.g. https://hooks.slack.com/services/..."
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"webhook URL {url!r}: {exc}") from None
    return url


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one POST went: delivered or not, attempts made, last HTTP status, last error."""

    ok: bool
    attempts: int
    status: int | None = None
    error: str | None = None


class WebhookSender:
    """POSTs JSON to a webhook. Retries 5xx, 429 and connection errors with exponential backoff
    (`backoff_s`, doubling, `attempts` in all); a 4xx other than 429 is not retried. A 3xx is
    a failed delivery, not followed and not retried (logged with the target's scheme and host
    only). Reads at most MAX_RESPONSE_BYTES of an answer, then closes the connection; 2xx is
    delivered whatever the body. `timeout_s` bounds each connect and each read, not a whole
    delivery. Backoff waits on `stop`, so a shutdown does not wait for them. Logs every
    failed delivery."""

    def __init__(
        self,
        url: str,
        *,
        attempts: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 10.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.url = check_webhook_url(url)
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.stop = stop or threading.Event()

    def __call__(self, body: Mapping[str, Any]) -> Delivery:
        data = json.dumps(body).encode()
        status: int | None = None
        error: str | None = None
        for attempt in range(1, self.attempts + 1):
            req = urllib.request.Request(
                self.url,
                data=data,
                method="POST",
                headers={"Content-Type": "application/json", "User-Agent": "handoffs-watch"},
            )
            try:
                with _opener.open(req, timeout=self.timeout_s) as resp:
                    resp.read(MAX_RESPONSE_BYTES)  # leaving the block closes the connection
                    return Delivery(True, attempt, resp.status)
            except urllib.error.HTTPError as exc:
                exc.close()  # its body is never read
                status, error = exc.code, f"HTTP {exc.code} {exc.reason}"
                if 300 <= exc.code < 400:
                    where = _where(self.url, exc.headers.get("Location"))
                    error = f"HTTP {exc.code} redirect to {where} not followed"
                    break
                if exc.code < 500 and exc.code != 429:
                    break
            except (urllib.error.URLError, OSError) as exc:
                status, error = None, str(getattr(exc, "reason", exc))
            if attempt < self.attempts and self.stop.wait(self.backoff_s * 2 ** (attempt - 1)):
                break
        log.warning(
            "webhook delivery of %s (%s) failed after %d attempt(s): %s",
            body.get("alert"),
            body.get("state"),
            attempt,
            error,
        )
        return Delivery(False, attempt, status, error)


def run_watch(
    *,
    evaluate: Callable[[datetime], Sequence[SloStatus]],
    send: Callable[[Mapping[str, Any]], Delivery],
    every: timedelta,
    stop: threading.Event,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    evaluations: int | None = None,
    state: Mapping[str, AlertState] | None = None,
) -> dict[str, AlertState]:
    """Evaluate at clock() every `every` until `stop` is set (or `evaluations` ran); send what
    analytics.slo.burn.decide says. An evaluation that raises is logged and skipped (state kept).
    Returns the last notification state."""
    current: dict[str, AlertState] = dict(state or {})
    n = 0
    while not stop.is_set() and (evaluations is None or n < evaluations):
        n += 1
        as_of = clock()
        try:
            statuses = evaluate(as_of)
        except Exception as exc:  # the store went away: keep watching
            log.warning("evaluation at %s failed: %s", as_of.isoformat(), str(exc)[:300])
        else:
            firing = [a.name for st in statuses for a in st.alerts if a.firing]
            log.info(
                "evaluated %d SLO(s) as of %s; firing: %s",
                len(statuses),
                as_of.isoformat(timespec="seconds"),
                ", ".join(firing) or "none",
            )
            new, notes = decide(current, statuses, as_of=as_of)
            for note in notes:
                delivery = send(notification_body(note))
                if not delivery.ok:  # not delivered: the next evaluation decides it again
                    name = note.alert.name
                    if name in current:
                        new[name] = current[name]
                    else:
                        new.pop(name, None)
            current = new
        if evaluations is not None and n >= evaluations:
            break
        stop.wait(every.total_seconds())
    return current
