"""The sidecar's control endpoint (docs/wire.md): PUT/GET/DELETE /v1/sessions/{id}, GET /v1/telemetry,
GET /healthz and GET /metrics. Every request but /healthz and /metrics (for Prometheus, which does
not sign) must carry a valid signature; the body is read before verifying because the signature
covers it, and is bounded so an unauthenticated client cannot exhaust memory."""
from __future__ import annotations

import json
import logging
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from stepscope.sidecar.metrics import exposition
from stepscope.sidecar.sessions import SessionManager
from stepscope.sidecar.telemetry import StepTelemetry
from stepscope.signing import SignatureError, Verifier

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
_SESSION_PATH = re.compile(r"^/v1/sessions/([^/]+)$")
TELEMETRY_PATH = "/v1/telemetry"


class ControlServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], manager: SessionManager, verifier: Verifier, telemetry: StepTelemetry) -> None:
        super().__init__(address, ControlHandler)
        self.manager = manager
        self.telemetry = telemetry
        self.verifier = verifier

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        assert isinstance(host, str)  # bound to a host name or address, never bytes
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"


class ControlHandler(BaseHTTPRequestHandler):
    server: ControlServer
    protocol_version = "HTTP/1.1"
    server_version = "stepscope-sidecar"
    # A client that stops sending mid-request must not hold a handler thread forever.
    timeout = 30

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            self._reply(200, {"ok": True})
            return
        if path == "/metrics":
            self._send(200, *exposition(self.server.telemetry))
            return
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_POST(self) -> None:
        self._reply(405, {"error": "use PUT, GET or DELETE on /v1/sessions/{id}"})

    def _handle(self, method: str) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._reply(413, {"error": f"Content-Length must be a number of bytes up to {MAX_BODY}"})
            return
        body = self.rfile.read(length) if length else b""
        try:
            self.server.verifier.verify(method, self.path, body, self.headers)
        except SignatureError as exc:
            log.warning("refused %s %s from %s: %s", method, self.path, self.client_address[0], exc)
            self._reply(401, {"error": str(exc)})
            return
        path = urlsplit(self.path).path
        if path == TELEMETRY_PATH and method == "GET":
            self._reply(200, self.server.telemetry.to_dict(pod=self.server.manager.pod, node=self.server.manager.node))
            return
        match = _SESSION_PATH.match(path)
        if not match:
            self._reply(404, {"error": f"no such endpoint {urlsplit(self.path).path}"})
            return
        session_id = unquote(match.group(1))
        manager = self.server.manager
        if method == "PUT":
            try:
                payload = json.loads(body or b"null")
            except ValueError:
                self._reply(400, {"error": "the body is not JSON"})
                return
            self._reply(*manager.put(session_id, payload))
            return
        result = manager.get(session_id) if method == "GET" else manager.delete(session_id)
        if result is None:
            self._reply(404, {"error": f"no session {session_id} on this sidecar"})
        else:
            self._reply(200, result)

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.client_address[0], format % args)
