"""Bounds on what a network peer can make stepscope hold, for its HTTP servers (the sidecar's
control endpoint, the operator's Alertmanager endpoint) and its client of the sidecars.

Anyone on the pod network reaches these ports, so before anything is authenticated a peer must
not be able to make a process read, buffer or wait without limit:
- a body is read only after its Content-Length is checked against a cap (a negative, malformed or
  chunked length is refused, never read "to the end");
- every connection, and every client request, has a TOTAL deadline: a watchdog shuts its socket
  down when the deadline passes, so a peer that sends (or answers) one byte every few seconds is
  cut off as surely as one that sends nothing (a per-read timeout alone never fires on it);
- a server serves at most `max_connections` connections at once and `max_per_peer` from one
  address; past that a connection is answered 503 and closed at once (no thread, no read), so one
  pod cannot take every slot from the operator;
- refusals are logged at most once per interval, with the count of those not logged.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 39\r\n"
    b'Connection: close\r\n\r\n{"error": "too many connections, retry"}'
)


class Refused(Exception):
    """A request refused before (or instead of) reading its body: the status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def body_length(headers: Any, limit: int) -> int:
    """The body's length from the request headers, at most `limit`; Refused says why not. No
    Content-Length is an empty body; a chunked body is refused (its size is unknown up front)."""
    if headers.get("Transfer-Encoding"):
        raise Refused(411, "send the body with a Content-Length, not a Transfer-Encoding")
    values = headers.get_all("Content-Length") if hasattr(headers, "get_all") else [headers.get("Content-Length")]
    values = [v for v in values or [] if v is not None]
    if not values:
        return 0
    text = values[0].strip()
    if len(set(values)) > 1 or not text.isascii() or not text.isdigit():
        raise Refused(400, "Content-Length must be one number of bytes")
    length = int(text)
    if length > limit:
        raise Refused(413, f"the body is over {limit} bytes")
    return length


class RateLimitedLog:
    """At most one line per `interval_s`; the next line says how many were left out."""

    def __init__(
        self, logger: logging.Logger, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger, self._interval_s, self._clock = logger, interval_s, clock
        self._last = float("-inf")
        self._skipped = 0
        self._lock = threading.Lock()

    def warning(self, message: str, *args: object) -> None:
        with self._lock:
            now = self._clock()
            if now - self._last < self._interval_s:
                self._skipped += 1
                return
            skipped, self._skipped, self._last = self._skipped, 0, now
        suffix = f" ({skipped} more since the last such line)" if skipped else ""
        self._logger.warning(message + suffix, *args)


def expired(deadlines: dict[Any, float], now: float) -> list[Any]:
    """The watched items whose deadline has passed."""
    return [item for item, deadline in deadlines.items() if deadline <= now]


class Watchdog:
    """Shuts a socket down (both ways) when its deadline passes: a thread blocked reading or
    writing it returns at once. One thread serves every socket of the process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._deadlines: dict[socket.socket, float] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, sock: socket.socket, deadline: float) -> Iterator[None]:
        """`sock` is shut down if the block is still running at `deadline` (of the clock)."""
        with self._cond:
            self._deadlines[sock] = deadline
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stepscope-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._deadlines.pop(sock, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = self._clock()
                for sock in expired(self._deadlines, now):
                    del self._deadlines[sock]
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass  # closed meanwhile: nothing left to stop
                self._cond.wait(min(self._deadlines.values(), default=now + 60.0) - now)


WATCHDOG = Watchdog()


class ConnectionSlots:
    """The connections open, in all and per peer address; one more is admitted while both are
    under their caps."""

    def __init__(self, max_connections: int, max_per_peer: int) -> None:
        self.max_connections, self.max_per_peer = max_connections, max_per_peer
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def admit(self, peer: str) -> bool:
        with self._lock:
            if sum(self._open.values()) >= self.max_connections or self._open[peer] >= self.max_per_peer:
                return False
            self._open[peer] += 1
            return True

    def release(self, peer: str) -> None:
        with self._lock:
            self._open[peer] -= 1
            if self._open[peer] <= 0:
                del self._open[peer]

    def __len__(self) -> int:
        with self._lock:
            return sum(self._open.values())

    def refusal(self) -> str:
        return f"over {self.max_connections} connections in all or {self.max_per_peer} from one address"


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with a cap on connections (in all and per peer address) and a total
    deadline per connection; handlers read bodies through BoundedHandler.read_body."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = (
        128  # a burst of connections is accepted (and refused past the cap) rather than left in SYN retries
    )

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        max_connections: int,
        max_per_peer: int,
        deadline_s: float,
        refusals: RateLimitedLog,
        watchdog: Watchdog = WATCHDOG,
    ) -> None:
        self.slots = ConnectionSlots(max_connections, max_per_peer)
        self.deadline_s = deadline_s
        self.refusals = refusals
        self._watchdog = watchdog
        super().__init__(address, handler)

    def connections(self) -> int:
        return len(self.slots)

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = client_address[0]
        if not self.slots.admit(peer):
            self.refusals.warning("refused a connection from %s: %s", peer, self.slots.refusal())
            try:
                request.send(_BUSY, socket.MSG_DONTWAIT)
            except OSError:
                pass  # its buffer is full or it is gone: closing is the answer
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            with self._watchdog.watching(request, time.monotonic() + self.deadline_s):
                super().process_request_thread(request, client_address)
        finally:
            self.slots.release(client_address[0])

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A peer cut off by its deadline or gone mid-request is not a server error.
        log.debug("connection from %s ended with an error", client_address[0], exc_info=True)


class BoundedHandler(BaseHTTPRequestHandler):
    server: BoundedHTTPServer

    def setup(self) -> None:
        # A per-read timeout as well: a blocked read returns at the deadline even without the watchdog.
        super().setup()
        self.connection.settimeout(self.server.deadline_s)

    def read_body(self, limit: int) -> bytes:
        """The request body, after its Content-Length was checked against `limit` (Refused)."""
        length = body_length(self.headers, limit)
        body = self.rfile.read(length) if length else b""
        if len(body) != length:
            raise Refused(400, "the body ended before its Content-Length")
        return body

    def refuse(self, refused: Refused) -> None:
        """Answer a refusal and close: an unread body must not be taken as the next request."""
        self.close_connection = True
        self.send_json(refused.status, {"error": refused.message})

    def send_json(self, status: int, payload: dict[str, Any]) -> None:
        self.send_bytes(status, json.dumps(payload).encode(), "application/json")

    def send_bytes(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.client_address[0], format % args)
