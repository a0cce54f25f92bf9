"""Fire a ProfileTrigger from an Alertmanager webhook: POST /v1/alerts/<namespace>/<trigger> with
Alertmanager's JSON payload (version 4) and `Authorization: Bearer <token>`.

Why a bearer token, and which: Alertmanager cannot sign a body (its webhook_config sends only
basic auth, a bearer token or a client certificate), and "from within the cluster" would let
any pod of any tenant fire any trigger. The token is HMAC-SHA256(the namespace's sidecar key,
"stepscope.io/alerts/v1"), so it fires the triggers of one namespace only; whoever can read that
namespace's key Secret can compute it but could sign sidecar requests there already, and the token
does not give the key back. A replayed token can do no more than fire, which the trigger's
cooldown and hourly cap bound.

The endpoint does not act on the alert itself: it writes it into the trigger's annotation
`stepscope.io/alert`, which the trigger's daemon takes at its next poll (so it works whichever
replica answers, and an operator restart loses nothing).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from stepscope.operator import kube, triggers
from stepscope.operator.settings import GROUP, VERSION
from stepscope.operator.status import now_iso

ALERT_ANNOTATION = "stepscope.io/alert"
MAX_BODY = 1 << 20  # Alertmanager groups alerts; a megabyte is thousands of them
_CONTEXT = b"stepscope.io/alerts/v1"
_PATH = re.compile(r"^/v1/alerts/([a-z0-9]([-a-z0-9]*[a-z0-9])?)/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$")

log = logging.getLogger(__name__)


def alert_token(namespace_key: bytes) -> str:
    """The bearer token that fires the triggers of the namespace whose sidecars hold `namespace_key`."""
    return hmac.new(namespace_key, _CONTEXT, hashlib.sha256).hexdigest()


class AlertError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def firing_summary(payload: Any) -> str | None:
    """One line for the trigger's status from an Alertmanager payload: each firing alert's name and
    its summary (or description); None when no alert fires (a resolved notification)."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("alerts"), list):
        raise AlertError(400, "the body is not an Alertmanager webhook payload (a JSON object with an `alerts` list)")
    lines = []
    for alert in payload["alerts"]:
        if not isinstance(alert, Mapping) or alert.get("status") != "firing":
            continue
        labels, notes = alert.get("labels") or {}, alert.get("annotations") or {}
        text = notes.get("summary") or notes.get("description") or ""
        lines.append(f"{labels.get('alertname', 'alert')}" + (f": {text}" if text else ""))
    return "; ".join(lines)[:triggers.MAX_TEXT] if lines else None


def receive(path: str, headers: Mapping[str, str], body: bytes, key_for: Callable[[str], bytes],
            annotate: Callable[[str, str, str], None]) -> dict[str, Any]:
    """Check and take one webhook request; what to answer (an AlertError says why not)."""
    match = _PATH.match(path)
    if not match:
        raise AlertError(404, "POST /v1/alerts/<namespace>/<ProfileTrigger name>")
    namespace, name = match.group(1), match.group(3)
    scheme, _, token = (headers.get("Authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), alert_token(key_for(namespace)).encode()):
        raise AlertError(401, f"missing or wrong bearer token for namespace {namespace} (see docs/security.md: the alert token)")
    try:
        payload = json.loads(body)
    except ValueError:
        raise AlertError(400, "the body is not JSON") from None
    summary = firing_summary(payload)
    if summary is None:
        return {"fired": False, "message": "no firing alert (resolved notifications fire nothing)"}
    annotate(namespace, name, json.dumps({"time": now_iso(), "summary": summary}))
    return {"fired": True, "message": f"ProfileTrigger {namespace}/{name} fires at its next poll"}


def annotate_trigger(namespace: str, name: str, value: str) -> None:
    """Write the alert into the trigger (a 404 when there is none: the API's answer is passed on)."""
    kube.custom().patch_namespaced_custom_object(GROUP, VERSION, namespace, triggers.TRIGGER_PLURAL, name,
                                                 {"metadata": {"annotations": {ALERT_ANNOTATION: value}}})


def serve(host: str, port: int, key_for: Callable[[str], bytes]) -> ThreadingHTTPServer:
    """Serve the endpoint from a daemon thread; returns the server (its port when 0 was asked)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    raise AlertError(413, f"the body is over {MAX_BODY} bytes")
                answer = receive(self.path, dict(self.headers.items()), self.rfile.read(length), key_for, annotate_trigger)
                self._answer(202 if answer["fired"] else 200, answer)
            except AlertError as exc:
                self._answer(exc.status, {"error": exc.message})
            except Exception as exc:  # noqa: BLE001 - any API server error: Alertmanager retries a 5xx
                status = getattr(exc, "status", None)
                if status == 404:
                    self._answer(404, {"error": "no such ProfileTrigger"})
                else:
                    log.warning("alert for %s not taken: %s", self.path, kube.describe(exc))
                    self._answer(503, {"error": f"not taken, retry: {kube.describe(exc)}"})

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("alerts endpoint: " + format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="stepscope-alerts", daemon=True).start()
    return server
