"""A real sidecar on 127.0.0.1 (free port) and training processes simulated through the shared
directory exactly as docs/wire.md has the agent write it."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient
from tests.agent.protocol import wait_for as eventually

KEY = b"sidecar-test-key-0123456789abcdef"


def write_json(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


class SimulatedRanks:
    """Training processes as the sidecar sees them: registry heartbeats every 0.2 s (stoppable per
    rank, like a process that died) and per-session state files written on demand."""

    def __init__(self, stepscope_dir: Path, world_size: int) -> None:
        self.dir = stepscope_dir
        self.world_size = world_size
        self.alive = set(range(world_size))
        self.steps = dict.fromkeys(range(world_size), 10)
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        for rank in range(self.world_size):
            if rank in self.alive:
                write_json(
                    self.dir / "agents" / f"rank-{rank}.json",
                    {
                        "rank": rank,
                        "localRank": rank,
                        "worldSize": self.world_size,
                        "pid": 1000 + rank,
                        "host": "node-a",
                        "step": self.steps[rank],
                        "heartbeat": time.time(),
                        "startedAt": time.time() - 60,
                    },
                )

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._beat()

    def kill(self, rank: int) -> None:
        self.alive.discard(rank)
        (self.dir / "agents" / f"rank-{rank}.json").unlink(missing_ok=True)

    def state(
        self,
        session: str,
        rank: int,
        state: str,
        *,
        trace_from: Path | None = None,
        stacks: bool = False,
        error: str | None = None,
        gpu: tuple[int, str] = (-1, ""),
        degraded: list[str] | None = None,
    ) -> None:
        folder = self.dir / session
        folder.mkdir(exist_ok=True)  # the agent makes the session folder, not the sidecar
        trace = None
        if trace_from is not None:
            trace = f"rank-{rank}.trace.json.gz"
            shutil.copyfile(trace_from, folder / trace)
        stacks_name = None
        if stacks:
            stacks_name = f"rank-{rank}.stacks.json"
            write_json(
                folder / stacks_name,
                {
                    "version": 1,
                    "rank": rank,
                    "pid": 1000 + rank,
                    "host": "node-a",
                    "session": session,
                    "step": 12,
                    "secondsSinceStep": 301.0,
                    "time": time.time(),
                    "threads": [
                        {
                            "id": 1,
                            "name": "MainThread",
                            "main": True,
                            "frames": [{"file": "train.py", "line": 10, "function": "all_reduce"}],
                        }
                    ],
                },
            )
        self.steps[rank] += 1
        write_json(
            folder / f"rank-{rank}.state.json",
            {
                "version": 1,
                "session": session,
                "rank": rank,
                "localRank": rank,
                "worldSize": self.world_size,
                "pid": 1000 + rank,
                "host": "node-a",
                "state": state,
                "step": self.steps[rank],
                "triggerStep": 10,
                "startStep": 15,
                "endStep": 17,
                "capturedSteps": 2,
                "startTime": time.time() - 1,
                "endTime": time.time(),
                "updatedAt": time.time(),
                "trace": trace,
                "stacks": stacks_name,
                "error": error,
                "message": f"simulated {state}",
                "gpu": gpu[0],
                "gpuUuid": gpu[1],
                "degraded": degraded or [],
            },
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture()
def stepscope_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture()
def sidecar(stepscope_dir: Path) -> Iterator[Sidecar]:
    running = Sidecar(
        stepscope_dir,
        KEY,
        host="127.0.0.1",
        port=0,
        pod="pod-a",
        node="node-a",
        poll_interval_s=0.05,
        upload_attempts=2,
        upload_base_delay_s=0.05,
        stale_after_s=2.0,
    ).start()
    yield running
    running.shutdown(5)


@pytest.fixture()
def client(sidecar: Sidecar) -> SidecarClient:
    return SidecarClient(sidecar.url, KEY, timeout=5)


@pytest.fixture()
def ranks(stepscope_dir: Path) -> Iterator[SimulatedRanks]:
    simulated = SimulatedRanks(stepscope_dir, 2)
    yield simulated
    simulated.close()


def wait_for(
    client: SidecarClient, session: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20.0
) -> dict[str, Any]:
    """Poll GET until `predicate(status)` holds; the last status goes into the failure message."""
    last: list[dict[str, Any]] = [{}]

    def probe() -> dict[str, Any] | None:
        last[0] = client.get_session(session)
        return last[0] if predicate(last[0]) else None

    try:
        return eventually(probe, timeout, "the condition")
    except AssertionError:
        raise AssertionError(
            f"condition not reached in {timeout} s; last status: {json.dumps(last[0], indent=1)}"
        ) from None
