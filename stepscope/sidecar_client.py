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
import http.client
import json
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
        if signed:
            headers.update(sign(self._key, method, path, data or b"", to=target(host, port)))
        return _Prepared(host, port, path, data, headers)

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
        head = [
            f"{method} {req.path} HTTP/1.1",
            f"Host: {target(req.host, req.port)}",
            "Connection: close",
            f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in req.headers.items()),
        ]
        writer = None
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(req.host, req.port, limit=MAX_HEAD)
                writer.write("\r\n".join(head).encode() + b"\r\n\r\n" + body)
                status, reason, length = _parse_head(await reader.readuntil(b"\r\n\r\n"))
                if length is not None and length > MAX_REPLY:
                    raise http.client.HTTPException(f"the answer is over {MAX_REPLY} bytes")
                raw = (
                    await reader.readexactly(length)
                    if length is not None
                    else await _read_to_end(reader, MAX_REPLY + 1)
                )
                if len(raw) > MAX_REPLY:
                    raise http.client.HTTPException(f"the answer is over {MAX_REPLY} bytes")
        except TimeoutError as exc:
            raise self._unreachable(exc, True) from None
        except (
            OSError,
            http.client.HTTPException,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ) as exc:
            raise self._unreachable(exc, False) from None
        finally:
            if writer is not None:
                writer.close()
        return _answer(status, reason, raw)


def _answer(status: int, reason: str, raw: bytes) -> dict[str, Any]:
    if not 200 <= status < 300:
        raise SidecarError(status, str(_json(raw).get("error") or reason))
    return _json(raw)


async def _read_to_end(reader: asyncio.StreamReader, limit: int) -> bytes:
    """What the peer sends until it closes, or the first `limit` bytes of it."""
    chunks: list[bytes] = []
    size = 0
    while size < limit and (chunk := await reader.read(limit - size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


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
