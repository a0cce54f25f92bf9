"""Start N local training ranks the zero-code-change way, as torchrun would, with the agent
bootstrap on their PYTHONPATH."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from stepscope.sidecar.bootstrap import install_bootstrap, training_env

WORKLOAD = Path(__file__).with_name("workload.py")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalJob:
    """The rank processes of one local job; each rank leads its own process group, so terminating
    also ends whatever a rank started (data loader workers, helpers)."""

    def __init__(self, processes: list[subprocess.Popen], logs: list[Path]) -> None:
        self.processes = processes
        self.logs = logs

    def wait(self, timeout: float | None = None) -> list[int | None]:
        """Return codes by rank; None for a rank still running when `timeout` (seconds, total) ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        codes: list[int | None] = []
        for p in self.processes:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                codes.append(p.wait(remaining))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def terminate(self, grace: float = 5.0) -> list[int | None]:
        """SIGTERM every rank's process group, SIGKILL what is left after `grace` seconds."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.processes:
                if p.poll() is None or sig == signal.SIGKILL:
                    try:
                        os.killpg(p.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            if all(code is not None for code in self.wait(grace if sig == signal.SIGTERM else 10.0)):
                break
        return [p.poll() for p in self.processes]

    def __enter__(self) -> LocalJob:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.terminate()


def launch_ranks(
    world_size: int,
    stepscope_dir: Path,
    workload_args: list[str],
    extra_env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    workload: Path = WORKLOAD,
) -> LocalJob:
    """Start `world_size` ranks of `workload` (stepscope/local/workload.py unless another script is
    given; stdout+stderr to `log_dir`/rank-<r>.log when given, else inherited)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    install_bootstrap(Path(stepscope_dir))
    base = dict(os.environ)
    base.update(extra_env or {})
    base.update(training_env(Path(stepscope_dir), base))
    base.setdefault("OMP_NUM_THREADS", "1")
    base["PYTHONUNBUFFERED"] = "1"
    base.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
        }
    )
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen] = []
    logs: list[Path] = []
    try:
        for rank in range(world_size):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0"}
            out = None
            if log_dir is not None:
                logs.append(Path(log_dir) / f"rank-{rank}.log")
                out = open(logs[-1], "wb")
            try:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, str(workload), *workload_args],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT if out else None,
                        start_new_session=True,
                    )
                )
            finally:
                if out is not None:
                    out.close()
    except BaseException:
        LocalJob(processes, logs).terminate()
        raise
    return LocalJob(processes, logs)
