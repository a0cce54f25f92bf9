"""Signed HTTP client for the sidecar's control endpoint (docs/wire.md), used by the operator and
`stepscope capture`. Standard library only, so the operator needs no HTTP dependency for it."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from stepscope.signing import sign

# The sidecar is a pod address or localhost, never behind a proxy: an HTTP_PROXY meant for the
# object store must not receive signed triggers and the store credentials in their body.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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

    def put_session(self, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("PUT", self._session_path(session_id), body)

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

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *, signed: bool = True) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if signed:
            headers.update(sign(self._key, method, path, data))
        request = urllib.request.Request(self.base_url + path, data=data if body is not None else None, method=method, headers=headers)
        try:
            with _DIRECT.open(request, timeout=self.timeout) as response:
                return _json(response.read())
        except urllib.error.HTTPError as exc:
            payload = _json(exc.read())
            raise SidecarError(exc.code, str(payload.get("error") or exc.reason)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SidecarError(0, f"sidecar at {self.base_url} unreachable: {reason}") from None


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {"error": raw[:200].decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}
