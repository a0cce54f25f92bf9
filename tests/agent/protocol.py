"""Helpers and fixtures for the agent tests: real rank processes started the zero-code way, and the sidecar's
half of the shared-directory protocol (docs/wire.md) written by hand."""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope.agent.schedstat import STOP_WATCH_LIBRARY
from stepscope.local.launch import LocalJob, launch_ranks
from stepscope.testing.polling import wait_for

# The agent's stop watch, where `make` built it with a C compiler.
needs_stop_watch = pytest.mark.skipif(
    not STOP_WATCH_LIBRARY.exists(), reason=f"the stop watch is not built ({STOP_WATCH_LIBRARY.name}: make builds it)"
)


def write_request(
    directory: Path,
    session: str,
    *,
    action: str = "capture",
    hang_timeout: float = 300,
    version: int = 1,
    start_step: int | None = None,
    **capture: Any,
) -> None:
    """Write request.json atomically, as the sidecar does."""
    body = {
        "waitSteps": 2,
        "steps": 2,
        "durationSeconds": None,
        "activities": ["CPU", "CUDA"],
        "withStack": True,
        "recordShapes": False,
        "profileMemory": False,
        "withFlops": False,
    }
    body.update(capture)
    request = {
        "version": version,
        "session": session,
        "action": action,
        "capture": body,
        "hangTimeoutSeconds": hang_timeout,
        "issuedAt": time.time(),
    }
    if start_step is not None:
        request["startStep"] = start_step
    tmp = directory / ".request.json.tmp"
    tmp.write_text(json.dumps(request))
    os.replace(tmp, directory / "request.json")


def read_state(directory: Path, session: str, rank: int) -> dict[str, Any] | None:
    try:
        return json.loads((directory / session / f"rank-{rank}.state.json").read_text())
    except FileNotFoundError:
        return None


def wait_for_state(
    directory: Path, session: str, rank: int, states: tuple[str, ...], timeout: float = 30
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        state = read_state(directory, session, rank)
        return state if state and state["state"] in states else None

    return wait_for(
        check, timeout, f"rank {rank} of {session} in {states} (now {read_state(directory, session, rank)})"
    )


def load_trace(path: Path) -> list[dict[str, Any]]:
    return load_trace_document(path)["traceEvents"]


def load_trace_document(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def profiler_steps(events: list[dict[str, Any]]) -> list[int]:
    """The N of every ProfilerStep#N annotation, sorted."""
    return sorted(int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))))


def logs(job: LocalJob) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in job.logs if p.exists())


@pytest.fixture
def stepscope_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "stepscope"
    directory.mkdir()
    return directory


@pytest.fixture
def start_job(stepscope_dir: Path, tmp_path: Path) -> Iterator[Callable[..., LocalJob]]:
    """Start ranks of the workload; every job is terminated when the test ends."""
    jobs: list[LocalJob] = []

    def start(world_size: int, *args: str, extra_env: dict[str, str] | None = None) -> LocalJob:
        job = launch_ranks(
            world_size, stepscope_dir, list(args), extra_env=extra_env, log_dir=tmp_path / f"logs-{len(jobs)}"
        )
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.terminate()
