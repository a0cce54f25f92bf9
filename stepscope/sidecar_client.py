"""Signed HTTP client for the sidecar's control endpoint (docs/wire.md), used by the operator and
`stepscope capture`. Standard library only, so the operator needs no HTTP dependency for it.

Whatever answers on a pod's port is not trusted: a reply over MAX_REPLY bytes is refused unread,
and `timeout` is the whole request's deadline (connect, send, every byte of the reply), so a
peer that drips its answer cannot hold the caller longer. It speaks to the sidecar directly, never
through a proxy: an HTTP_PROXY meant for the object store must not receive signed triggers and
the store credentials in their body."""
from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from typing import Any

from stepscope.bounded_http import WATCHDOG
from stepscope.contracts.sidecar_api import SessionRequest
from stepscope.signing import sign, target

# The largest answer of the wire API (a session with its ranks, or 64 step times per local rank)
# is tens of KiB; a megabyte is room for many more ranks and no room for an attack.
MAX_REPLY = 1 << 20


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
        return self._request("PUT", self._session_path(session_id), data)

    def get_session(self, session_id: str) -> dict[str, Any]:
        return self._request("GET", self._session_path(session_id))

    def delete_session(self, session_id: str) -> dict[str, Any]:
        return self._request("DELETE", self._session_path(session_id))

    def get_telemetry(self) -> dict[str, Any]:
        """Every local rank's step telemetry (docs/wire.md, GET /v1/telemetry)."""
        return self._request("GET", "/v1/telemetry")

    def healthz(self) -> bool:
        """True when the sidecar answers {"ok": true}; False when it is unreachable or unwell."""
        try:
            return bool(self._request("GET", "/healthz", signed=False).get("ok"))
        except SidecarError:
            return False

    @staticmethod
    def _session_path(session_id: str) -> str:
        return "/v1/sessions/" + urllib.parse.quote(session_id, safe="")

    def _request(self, method: str, path: str, data: bytes | None = None, *, signed: bool = True) -> dict[str, Any]:
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
        deadline = time.monotonic() + self.timeout
        conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        try:
            conn.connect()
            assert conn.sock is not None  # connect() made it
            with WATCHDOG.watching(conn.sock, deadline):
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = _read_capped(response)
        except (OSError, http.client.HTTPException) as exc:
            late = time.monotonic() >= deadline
            reason = f"no complete answer within {self.timeout:g} s" if late else (str(exc) or type(exc).__name__)
            raise SidecarError(0, f"sidecar at {self.base_url} unreachable: {reason}") from None
        finally:
            conn.close()
        if not 200 <= response.status < 300:
            raise SidecarError(response.status, str(_json(raw).get("error") or response.reason))
        return _json(raw)


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
