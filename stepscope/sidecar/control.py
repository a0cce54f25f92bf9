"""The sidecar's control endpoint (docs/wire.md): PUT/GET/DELETE /v1/sessions/{id}, GET /v1/telemetry,
GET /healthz and GET /metrics. Every request but /healthz and /metrics (for Prometheus, which does
not sign) must carry a valid signature for an address this sidecar is reached at. Any pod can reach
the port, so the server is bounded (stepscope.bounded_http): the signature's headers and the
timestamp are checked before the body is read, the body is capped at what the API needs, and
connections are capped in all and per peer, each with a total deadline."""
from __future__ import annotations

import ipaddress
import logging
import re
from urllib.parse import unquote, urlsplit

from stepscope.bounded_http import BoundedHandler, BoundedHTTPServer, RateLimitedLog, Refused
from stepscope.sidecar.prometheus import exposition
from stepscope.sidecar.sessions import SessionManager
from stepscope.sidecar.telemetry import StepTelemetry
from stepscope.signing import SignatureError, Verifier, target

log = logging.getLogger(__name__)

# The largest trigger the ProfileSession schema admits (a selector of 16 expressions of 64 values,
# 32 labels, every string at its maxLength) is about 100 KiB with its credentials.
MAX_BODY = 256 * 1024
# The operator holds one connection per sidecar at a time, a local CLI one, Prometheus and the
# kubelet's probes one each: 8 per address leave room, and a flood from one pod leaves the rest.
MAX_CONNECTIONS = 32
MAX_PER_PEER = 8
# Every request of the wire API takes milliseconds; the operator gives up on one after 5 s.
DEADLINE_S = 10.0
_SESSION_PATH = re.compile(r"^/v1/sessions/([^/]+)$")
TELEMETRY_PATH = "/v1/telemetry"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def accepted_targets(pod_ip: str, host: str, port: int, peer: str) -> frozenset[str]:
    """The addresses a request to this sidecar may have been signed for: its pod IP (and the
    address it is bound to), and for a peer on this host only, the loopback names (the local CLI)."""
    hosts = [h for h in (pod_ip, host) if h and h not in ("0.0.0.0", "::")]
    try:
        local = ipaddress.ip_address(peer.removeprefix("::ffff:")).is_loopback
    except ValueError:
        local = False
    return frozenset(target(h, port) for h in hosts + (list(LOOPBACK) if local else []))


class ControlServer(BoundedHTTPServer):
    def __init__(self, address: tuple[str, int], manager: SessionManager, verifier: Verifier, telemetry: StepTelemetry, *,
                 pod_ip: str = "", max_connections: int = MAX_CONNECTIONS, max_per_peer: int = MAX_PER_PEER,
                 deadline_s: float = DEADLINE_S) -> None:
        super().__init__(address, ControlHandler, max_connections=max_connections, max_per_peer=max_per_peer,
                         deadline_s=deadline_s, refusals=RateLimitedLog(log))
        self.manager = manager
        self.telemetry = telemetry
        self.verifier = verifier
        self.pod_ip = pod_ip

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        assert isinstance(host, str)  # bound to a host name or address, never bytes
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"

    def targets_for(self, peer: str) -> frozenset[str]:
        host, port = self.server_address[:2]
        assert isinstance(host, str)
        return accepted_targets(self.pod_ip, host, port, peer)


class ControlHandler(BoundedHandler):
    server: ControlServer
    protocol_version = "HTTP/1.1"
    server_version = "stepscope-sidecar"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            self.send_json(200, {"ok": True})
            return
        if path == "/metrics":
            self.send_bytes(200, *exposition(self.server.telemetry))
            return
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_POST(self) -> None:
        self.refuse(Refused(405, "use PUT, GET or DELETE on /v1/sessions/{id}"))

    def _handle(self, method: str) -> None:
        verifier = self.server.verifier
        try:
            verifier.check_fresh(self.headers)
            body = self.read_body(MAX_BODY)
            verifier.verify(method, self.path, body, self.headers, targets=self.server.targets_for(self.client_address[0]))
        except SignatureError as exc:
            self.server.refusals.warning("refused %s %.200s from %s: %s", method, self.path, self.client_address[0], exc)
            self.refuse(Refused(401, str(exc)))
            return
        except Refused as exc:
            self.refuse(exc)
            return
        path = urlsplit(self.path).path
        if path == TELEMETRY_PATH and method == "GET":
            self.send_json(200, self.server.telemetry.to_dict(pod=self.server.manager.pod, node=self.server.manager.node))
            return
        match = _SESSION_PATH.match(path)
        if not match:
            self.send_json(404, {"error": f"no such endpoint {urlsplit(self.path).path}"})
            return
        session_id = unquote(match.group(1))
        manager = self.server.manager
        if method == "PUT":
            self.send_json(*manager.put(session_id, body))
            return
        result = manager.get(session_id) if method == "GET" else manager.delete(session_id)
        if result is None:
            self.send_json(404, {"error": f"no session {session_id} on this sidecar"})
        else:
            self.send_json(200, result)
