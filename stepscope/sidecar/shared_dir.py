"""The sidecar's side of the shared directory (docs/wire.md, "sidecar <-> agent"): it writes
request.json and reads the agents' registry and per-rank state files."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.contracts import wire
from stepscope.contracts.session import SessionSpec
from stepscope.contracts.sidecar_api import capture_request
from stepscope.files import write_atomically


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
    collective_wait_s: float | None = None  # DDP's latest sampled gradient all-reduce time (heartbeat's collectiveWait)


def agents(stepscope_dir: Path) -> dict[int, Agent]:
    """Every registered training process of this pod by rank, live or not (see Agent.heartbeat)."""
    found: dict[int, Agent] = {}
    for path in sorted((stepscope_dir / wire.AGENTS_FOLDER).glob("rank-*.json")):
        entry = read_json(path)
        if not entry:
            continue
        try:
            found[int(entry["rank"])] = Agent(int(entry["rank"]), int(entry.get("localRank", -1)), int(entry.get("worldSize", 0)),
                                              int(entry.get("pid", 0)), str(entry.get("host", "")), int(entry.get("step", 0)),
                                              float(entry["heartbeat"]), _collective_wait(entry.get("collectiveWait")))
        except (KeyError, TypeError, ValueError):
            continue
    return found


def _collective_wait(value: Any) -> float | None:
    seconds = value.get("seconds") if isinstance(value, dict) else None
    return float(seconds) if isinstance(seconds, (int, float)) and seconds >= 0 else None


def session_dir(stepscope_dir: Path, session_id: str) -> Path:
    return stepscope_dir / session_id


def metrics_file(stepscope_dir: Path, session_id: str) -> Path:
    """Where the node's GPU samples of a session wait for their upload: the sidecar's own folder,
    as the session folder belongs to the agents (possibly another user)."""
    return stepscope_dir / wire.SIDECAR_FOLDER / session_id / "gpu-metrics.csv.gz"


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
    if not wire.valid_file_name(name):
        return None
    path = session_dir(stepscope_dir, session_id) / name
    return path if path.is_file() else None


def write_request(stepscope_dir: Path, session_id: str, action: str, spec: SessionSpec, start_step: int | None = None) -> None:
    request = capture_request(session_id, action, spec, start_step, time.time())
    write_atomically(stepscope_dir / wire.REQUEST_FILE, lambda out: out.write(request.to_json()))


@dataclass(frozen=True)
class Leftover:
    """A session's files in the shared directory: its folder (the agents') and the sidecar's own."""
    session: str
    paths: tuple[Path, ...]
    size: int
    newest: float  # mtime of its newest file


_NOT_SESSIONS = frozenset({wire.AGENTS_FOLDER, wire.BOOTSTRAP_FOLDER, wire.SIDECAR_FOLDER, wire.TELEMETRY_FOLDER})


def leftovers(stepscope_dir: Path) -> list[Leftover]:
    """Every session's files in the shared directory, oldest first."""
    found = []
    for folder in (stepscope_dir, stepscope_dir / wire.SIDECAR_FOLDER):
        for path in folder.iterdir() if folder.is_dir() else ():
            if path.is_dir() and wire.valid_session_id(path.name) and path.name not in _NOT_SESSIONS:
                found.append(path)
    by_session: dict[str, list[Path]] = {}
    for path in found:
        by_session.setdefault(path.name, []).append(path)
    result = []
    for session, paths in by_session.items():
        size, newest = 0, 0.0
        for path in paths:
            for f in path.rglob("*"):
                try:
                    st = f.stat()
                except OSError:
                    continue
                if f.is_file():
                    size += st.st_size
                newest = max(newest, st.st_mtime)
        result.append(Leftover(session, tuple(paths), size, newest))
    return sorted(result, key=lambda leftover: leftover.newest)
