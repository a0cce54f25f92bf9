"""The sidecar's side of the shared directory (docs/wire.md, "sidecar <-> agent"): it writes
request.json and reads the agents' registry and per-rank state files."""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.files import write_atomically

REQUEST_VERSION = 1
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def valid_session_id(session_id: str) -> bool:
    """Session ids become folder names, so only plain names are allowed."""
    return bool(_SESSION_ID.match(session_id))


def write_json_atomic(path: Path, value: dict[str, Any]) -> None:
    write_atomically(path, lambda out: out.write(json.dumps(value).encode()))


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's object, or None when it is absent or unreadable (the next poll tries again)."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Agent:
    rank: int
    local_rank: int
    world_size: int
    pid: int
    host: str
    step: int
    heartbeat: float


def agents(stepscope_dir: Path) -> dict[int, Agent]:
    """Every registered training process of this pod by rank, live or not (see Agent.heartbeat)."""
    found: dict[int, Agent] = {}
    for path in sorted((stepscope_dir / "agents").glob("rank-*.json")):
        entry = read_json(path)
        if not entry:
            continue
        try:
            found[int(entry["rank"])] = Agent(int(entry["rank"]), int(entry.get("localRank", -1)), int(entry.get("worldSize", 0)),
                                              int(entry.get("pid", 0)), str(entry.get("host", "")), int(entry.get("step", 0)),
                                              float(entry["heartbeat"]))
        except (KeyError, TypeError, ValueError):
            continue
    return found


def session_dir(stepscope_dir: Path, session_id: str) -> Path:
    return stepscope_dir / session_id


def metrics_file(stepscope_dir: Path, session_id: str) -> Path:
    """Where the node's GPU samples of a session wait for their upload: the sidecar's own folder,
    as the session folder belongs to the agents (possibly another user)."""
    return stepscope_dir / "sidecar" / session_id / "gpu-metrics.csv.gz"


def rank_states(stepscope_dir: Path, session_id: str) -> dict[int, dict[str, Any]]:
    """Every rank's latest state file of the session, by rank."""
    states: dict[int, dict[str, Any]] = {}
    for path in session_dir(stepscope_dir, session_id).glob("rank-*.state.json"):
        state = read_json(path)
        if state and isinstance(state.get("rank"), int) and state.get("session") == session_id:
            states[state["rank"]] = state
    return states


def local_file(stepscope_dir: Path, session_id: str, name: Any) -> Path | None:
    """A file the agent named in its state, if it is a plain name in the session folder and exists."""
    if not isinstance(name, str) or not _PLAIN_NAME.match(name):
        return None
    path = session_dir(stepscope_dir, session_id) / name
    return path if path.is_file() else None


def write_request(stepscope_dir: Path, session_id: str, action: str, capture: dict[str, Any], hang_timeout_s: int) -> None:
    write_json_atomic(stepscope_dir / "request.json", {
        "version": REQUEST_VERSION, "session": session_id, "action": action, "capture": capture,
        "hangTimeoutSeconds": hang_timeout_s, "issuedAt": time.time(),
    })
