"""Signed HTTP client for the sidecar's control endpoint (docs/wire.md), used by the operator and
`stepscope capture`. Standard library only, so the operator needs no HTTP dependency for it.

Whatever answers on a pod's port is not trusted: a reply over MAX_REPLY bytes is refused unread,
and `timeout` is the whole request's deadline (connect, send, every byte of the reply), so a
peer that drips its answer cannot hold the caller longer. It speaks to the sidecar directly, never
through a proxy: an HTTP_PROXY meant for the object store must not receive signed triggers and
the store credentials in their body.

`request_async` is the same request on the caller's event loop (the operator's fan-out to
thousands of sidecars): one connection per request, no thread, the same caps and deadline."""

from __future__ import annotations

import asyncio
import errno
import http.client
import json
import os
import socket
import time
import urllib.parse
from typing import Any, NamedTuple

from stepscope.bounded_http import WATCHDOG
from stepscope.contracts.sidecar_api import SessionRequest
from stepscope.signing import sign, target

# The largest answer of the wire API (a session with its ranks, or 64 step times per local rank)
# is tens of KiB; a megabyte is room for many more ranks and no room for an attack.
MAX_REPLY = 1 << 20
# The status line and headers of an answer (the sidecar sends five short ones).
MAX_HEAD = 16 << 10
TELEMETRY_PATH = "/v1/telemetry"


class _Prepared(NamedTuple):
    host: str
    port: int
    to: str  # signing.target(host, port)
    path: str
    data: bytes | None
    headers: dict[str, str]


class SidecarError(Exception):
    """The sidecar refused a request or could not be reached (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class SidecarClient:
    def __init__(self, base_url: str, key: bytes, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = key
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"SidecarClient({self.base_url!r})"

    def put_session(self, session_id: str, body: SessionRequest | dict[str, Any]) -> dict[str, Any]:
        """PUT a session: the request as the contract encodes it, or any JSON object (what a peer
        the sidecar must not trust may send)."""
        data = body.to_json() if isinstance(body, SessionRequest) else json.dumps(body).encode()
        return self._request("PUT", self.session_path(session_id), data)

    def get_session(self, session_id: str) -> dict[str, Any]:
        return self._request("GET", self.session_path(session_id))

    def delete_session(self, session_id: str) -> dict[str, Any]:
        return self._request("DELETE", self.session_path(session_id))

    def get_telemetry(self) -> dict[str, Any]:
        """Every local rank's step telemetry (docs/wire.md, GET /v1/telemetry)."""
        return self._request("GET", TELEMETRY_PATH)

    def healthz(self) -> bool:
        """True when the sidecar answers {"ok": true}; False when it is unreachable or unwell."""
        try:
            return bool(self._request("GET", "/healthz", signed=False).get("ok"))
        except SidecarError:
            return False

    @staticmethod
    def session_path(session_id: str) -> str:
        return "/v1/sessions/" + urllib.parse.quote(session_id, safe="")

    def _prepare(self, method: str, path: str, data: bytes | None, signed: bool) -> _Prepared:
        parts = urllib.parse.urlsplit(self.base_url)
        try:
            host, port, path = parts.hostname, parts.port or 80, parts.path + path
        except ValueError:  # a port that is not a number
            host = None
        if parts.scheme != "http" or not host:
            raise SidecarError(0, f"the sidecar's address must be http://HOST:PORT, not {self.base_url!r}")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        to = target(host, port)
        if signed:
            headers.update(sign(self._key, method, path, data or b"", to=to))
        return _Prepared(host, port, to, path, data, headers)

    def _unreachable(self, exc: BaseException, late: bool) -> SidecarError:
        reason = f"no complete answer within {self.timeout:g} s" if late else (str(exc) or type(exc).__name__)
        return SidecarError(0, f"sidecar at {self.base_url} unreachable: {reason}")

    def _request(self, method: str, path: str, data: bytes | None = None, *, signed: bool = True) -> dict[str, Any]:
        req = self._prepare(method, path, data, signed)
        deadline = time.monotonic() + self.timeout
        conn = http.client.HTTPConnection(req.host, req.port, timeout=self.timeout)
        try:
            conn.connect()
            assert conn.sock is not None  # connect() made it
            with WATCHDOG.watching(conn.sock, deadline):
                conn.request(method, req.path, body=req.data, headers=req.headers)
                response = conn.getresponse()
                raw = _read_capped(response)
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(exc, time.monotonic() >= deadline) from None
        finally:
            conn.close()
        return _answer(response.status, response.reason, raw)

    async def request_async(self, method: str, path: str, data: bytes | None = None) -> dict[str, Any]:
        """A signed request (put_session's, get_session's, ... : `session_path`; `data` the encoded
        body) on the running event loop, within `timeout` in all."""
        req = self._prepare(method, path, data, True)
        body = req.data or b""
        head = "".join(
            (
                f"{method} {req.path} HTTP/1.1\r\nHost: {req.to}\r\nConnection: close\r\n",
                f"Content-Length: {len(body)}\r\n",
                *(f"{k}: {v}\r\n" for k, v in req.headers.items()),
                "\r\n",
            )
        )
        loop = asyncio.get_running_loop()
        try:
            status, reason, raw = await _Exchange(loop, head.encode() + body, loop.time() + self.timeout).run(
                req.host, req.port
            )
        except TimeoutError as exc:
            raise self._unreachable(exc, True) from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise self._unreachable(exc, False) from None
        return _answer(status, reason, raw)


class _Exchange:
    """One request and its answer on a non-blocking socket, driven by the event loop's reader and
    writer callbacks and one timer: no transport, stream or task of its own, which at tens of
    thousands of requests a fan-out was most of the operator's CPU. The answer's head is refused
    past MAX_HEAD bytes, its body past MAX_REPLY, the whole exchange at `deadline` (loop time)."""

    __slots__ = ("loop", "out", "deadline", "received", "head", "done", "sock", "fd", "watching")

    def __init__(self, loop: asyncio.AbstractEventLoop, request: bytes, deadline: float) -> None:
        self.loop, self.out, self.deadline = loop, memoryview(request), deadline
        self.received = bytearray()
        self.head: tuple[int, str, int | None] | None = None
        self.done: asyncio.Future[tuple[int, str, bytes]] = loop.create_future()
        self.sock: socket.socket | None = None
        self.fd = -1  # the loop is given the descriptor: given the socket, it formats its repr on every call
        self.watching = ""  # "writer" or "reader": what the loop watches the socket for

    async def run(self, host: str, port: int) -> tuple[int, str, bytes]:
        timer = self.loop.call_at(self.deadline, self._expire)
        try:
            address = await self._address(host, port)
            family = socket.AF_INET6 if len(address) == 4 else socket.AF_INET
            self.sock = sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
            self.fd = sock.fileno()
            error = sock.connect_ex(address)
            if error not in (0, errno.EINPROGRESS):
                raise OSError(error, os.strerror(error))
            self._writable()  # on the loopback the connection is up at once; elsewhere the send waits for it
            return await self.done
        finally:
            timer.cancel()
            if self.watching == "writer":
                self.loop.remove_writer(self.fd)
            elif self.watching == "reader":
                self.loop.remove_reader(self.fd)
            if self.sock is not None:
                self.sock.close()

    async def _address(self, host: str, port: int) -> tuple[Any, ...]:
        """A pod IP as it is; a name (the CLI's localhost) through the loop's resolver, bounded
        by the same deadline."""
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                socket.inet_pton(family, host)
            except OSError:
                continue
            return (host, port) if family == socket.AF_INET else (host, port, 0, 0)
        found = await asyncio.wait_for(
            self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), self.deadline - self.loop.time()
        )
        return tuple(found[0][4])

    def _fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    def _expire(self) -> None:
        self._fail(TimeoutError())

    def _writable(self) -> None:
        """Send what is left of the request; while the connection is being made the send would
        block, and a connection that failed raises its error here (ECONNREFUSED, ...)."""
        assert self.sock is not None
        try:
            self.out = self.out[self.sock.send(self.out) :]
        except BlockingIOError:
            self._watch("writer")
            return
        except OSError as exc:
            self._fail(exc)
            return
        self._watch("writer" if self.out else "reader")

    def _watch(self, what: str) -> None:
        """Have the loop call _writable or _readable when the socket is ready for it."""
        if what == self.watching:
            return
        if self.watching == "writer":
            self.loop.remove_writer(self.fd)
        if what == "writer":
            self.loop.add_writer(self.fd, self._writable)
        else:
            self.loop.add_reader(self.fd, self._readable)
        self.watching = what

    def _readable(self) -> None:
        assert self.sock is not None
        try:
            chunk = self.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(exc)
            return
        self.received += chunk
        try:
            answer = self._answer(ended=not chunk)
        except (http.client.HTTPException, ValueError) as exc:
            self._fail(exc)
            return
        if answer is not None and not self.done.done():
            self.done.set_result(answer)
        elif not chunk:
            self._fail(http.client.IncompleteRead(bytes(self.received[:80])))

    def _answer(self, ended: bool) -> tuple[int, str, bytes] | None:
        """The answer once it is complete, None while more is to come; HTTPException for one over
        the caps or not HTTP."""
        if self.head is None:
            end = self.received.find(b"\r\n\r\n", 0, MAX_HEAD)
            if end < 0:
                if len(self.received) >= MAX_HEAD:
                    raise http.client.HTTPException(f"the answer's head is over {MAX_HEAD} bytes")
                return None
            self.head = _parse_head(bytes(self.received[: end + 4]))
            del self.received[: end + 4]
        status, reason, length = self.head
        if len(self.received) > MAX_REPLY or (length is not None and length > MAX_REPLY):
            raise http.client.HTTPException(f"the answer is over {MAX_REPLY} bytes")
        if length is not None and len(self.received) >= length:
            return status, reason, bytes(self.received[:length])
        return (status, reason, bytes(self.received)) if ended and length is None else None


def _answer(status: int, reason: str, raw: bytes) -> dict[str, Any]:
    if not 200 <= status < 300:
        raise SidecarError(status, str(_json(raw).get("error") or reason))
    return _json(raw)


def _parse_head(head: bytes) -> tuple[int, str, int | None]:
    """(status, reason, Content-Length or None) of an answer's head; HTTPException for one that is
    not HTTP/1.x or whose body has no size that can be bounded up front but its end."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not (code.isdigit() and len(code) == 3):
        raise http.client.HTTPException(f"not an HTTP answer: {lines[0][:80]!r}")
    fields = [line.partition(":") for line in lines[1:] if line]
    lengths = {value.strip() for name, _, value in fields if name.strip().lower() == "content-length"}
    if any(name.strip().lower() == "transfer-encoding" for name, _, _ in fields):
        raise http.client.HTTPException("a chunked answer (the sidecar sends a Content-Length)")
    if len(lengths) > 1 or (lengths and not next(iter(lengths)).isdigit()):
        raise http.client.HTTPException(f"a bad Content-Length: {sorted(lengths)}")
    return int(code), reason, int(lengths.pop()) if lengths else None


def _read_capped(response: http.client.HTTPResponse) -> bytes:
    """The reply's body, refused (http.client.HTTPException) past MAX_REPLY bytes without reading on."""
    declared = response.getheader("Content-Length")
    if declared and declared.strip().isdigit() and int(declared) > MAX_REPLY:
        raise http.client.HTTPException(f"the answer is over {MAX_REPLY} bytes")
    raw = response.read(MAX_REPLY + 1)
    if len(raw) > MAX_REPLY:
        raise http.client.HTTPException(f"the answer is over {MAX_REPLY} bytes")
    return raw


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {"error": raw[:200].decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}
