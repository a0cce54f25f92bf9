"""session.json in the session's store folder: the spec snapshot and the timeline of phases, so a
report read months later says what was asked and what happened, without the cluster."""
from __future__ import annotations

import json
import logging
import time
from typing import Any

from stepscope.contracts import layout
from stepscope.contracts.session import SessionSpec

log = logging.getLogger(__name__)


def destination(spec: SessionSpec, namespace: str, name: str, uid: str) -> str:
    return spec.storage.uri.rstrip("/") + "/" + layout.session_prefix(namespace, name, uid)


def open_destination(spec: SessionSpec, dest: str, credentials: dict[str, Any] | None, *, ambient_credentials: bool = False) -> Any:
    """The session's folder in its store, by default with the session's credentials only, never
    the identity of the process (the operator's own cloud role)."""
    from stepscope.storage import open_store  # boto3 loads only when a session needs a store
    return open_store(dest, endpoint=spec.storage.endpoint, region=spec.storage.region, credentials=credentials,
                      ambient_credentials=ambient_credentials)


class SessionRecord:
    def __init__(self, store: Any, body: dict[str, Any]) -> None:
        self._store = store
        self._body = body
        self._timeline: list[dict[str, Any]] = []

    def load(self) -> None:
        """Continue the timeline an earlier operator process wrote."""
        try:
            if self._store.exists(layout.session_json()):
                self._timeline = list(json.loads(self._store.get_bytes(layout.session_json())).get("timeline") or [])
        except Exception as exc:  # noqa: BLE001 - a damaged record must not stop the session; it is rewritten below
            log.warning("session.json unreadable, starting a new timeline: %s", exc)

    def read_json(self, key: str) -> dict[str, Any] | None:
        """A JSON object the session's folder holds at `key` (the analysis Job's result), or None
        where it is absent, unreadable or no object."""
        try:
            value = json.loads(self._store.get_bytes(key)) if self._store.exists(key) else None
        except Exception as exc:  # noqa: BLE001 - the caller reports a missing result in its own words
            log.warning("%s unreadable: %s", key, exc)
            return None
        return value if isinstance(value, dict) else None

    def append(self, phase: str, message: str) -> None:
        """Record a transition and rewrite session.json (raises when the store is unreachable)."""
        if self._timeline and self._timeline[-1].get("phase") == phase:
            return
        self._timeline.append({"time": time.time(), "phase": phase, "message": message})
        self._store.put_bytes(layout.session_json(), json.dumps({**self._body, "timeline": self._timeline}, indent=1).encode())
