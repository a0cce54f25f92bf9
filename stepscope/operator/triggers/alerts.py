"""Fire a ProfileTrigger from an Alertmanager webhook: POST /v1/alerts/<namespace>/<trigger> with
Alertmanager's JSON payload (version 4) and `Authorization: Bearer <token>`.

Why a bearer token, and which: Alertmanager cannot sign a body (its webhook_config sends only
basic auth, a bearer token or a client certificate), and "from within the cluster" would let
any pod of any tenant fire any trigger. The token is HMAC-SHA256(the namespace's sidecar key,
"stepscope.io/alerts/v1"), so it fires the triggers of one namespace only; whoever can read that
namespace's key Secret can compute it but could sign sidecar requests there already, and the token
does not give the key back. A replayed token can do no more than fire, which the trigger's
cooldown and hourly cap bound.

The port is reachable from any pod, so the token is checked from the headers before the body is
read, and the server is bounded (stepscope.bounded_http: body cap, connections in all and per
peer, a total deadline per connection).

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
from email.message import Message
from typing import Any

from stepscope.bounded_http import BoundedHandler, BoundedHTTPServer, RateLimitedLog, Refused
from stepscope.operator import kube
from stepscope.operator.sessions.status import now_iso
from stepscope.operator.settings import GROUP, VERSION
from stepscope.operator.triggers import policy as triggers

ALERT_ANNOTATION = "stepscope.io/alert"
MAX_BODY = 1 << 20  # Alertmanager groups alerts; a megabyte is thousands of them
# Alertmanager posts one notification per group at a time, from one or a few replicas.
MAX_CONNECTIONS = 32
MAX_PER_PEER = 8
DEADLINE_S = 10.0
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


def authorize(path: str, headers: Mapping[str, str] | Message, key_for: Callable[[str], bytes]) -> tuple[str, str]:
    """The trigger (namespace, name) a request may fire, from its path and token alone, before
    its body is read; an AlertError says why not."""
    match = _PATH.match(path)
    if not match:
        raise AlertError(404, "POST /v1/alerts/<namespace>/<ProfileTrigger name>")
    namespace, name = match.group(1), match.group(3)
    scheme, _, token = (headers.get("Authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), alert_token(key_for(namespace)).encode()):
        raise AlertError(401, f"missing or wrong bearer token for namespace {namespace} (see docs/security.md: the alert token)")
    return namespace, name


def receive(namespace: str, name: str, body: bytes, annotate: Callable[[str, str, str], None]) -> dict[str, Any]:
    """Take the payload of an authorized request; what to answer (an AlertError says why not)."""
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


def serve(host: str, port: int, key_for: Callable[[str], bytes], *, max_connections: int = MAX_CONNECTIONS,
          max_per_peer: int = MAX_PER_PEER, deadline_s: float = DEADLINE_S) -> BoundedHTTPServer:
    """Serve the endpoint from a daemon thread; returns the server (its port when 0 was asked)."""

    class Handler(BoundedHandler):
        def do_POST(self) -> None:
            try:
                namespace, name = authorize(self.path, self.headers, key_for)
                answer = receive(namespace, name, self.read_body(MAX_BODY), annotate_trigger)
                self.send_json(202 if answer["fired"] else 200, answer)
            except AlertError as exc:
                if exc.status == 401:
                    self.server.refusals.warning("alerts endpoint: refused %.200s from %s: %s", self.path, self.client_address[0], exc.message)
                self.refuse(Refused(exc.status, exc.message))
            except Refused as exc:
                self.refuse(exc)
            except Exception as exc:  # noqa: BLE001 - any API server error: Alertmanager retries a 5xx
                status = getattr(exc, "status", None)
                if status == 404:
                    self.send_json(404, {"error": "no such ProfileTrigger"})
                else:
                    log.warning("alert for %s not taken: %s", self.path, kube.describe(exc))
                    self.send_json(503, {"error": f"not taken, retry: {kube.describe(exc)}"})

    server = BoundedHTTPServer((host, port), Handler, max_connections=max_connections, max_per_peer=max_per_peer,
                               deadline_s=deadline_s, refusals=RateLimitedLog(log))
    threading.Thread(target=server.serve_forever, name="stepscope-alerts", daemon=True).start()
    return server
