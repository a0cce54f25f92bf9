"""`stepscope demo`: the whole single-machine path in about a minute, on the CPU.

A 4-rank gloo training starts the zero-code way (the agent comes from the sidecar's bootstrap on
PYTHONPATH; the training script never imports stepscope), one rank slowed inside a Python function
named `augment_batch_slowly`. A real sidecar daemon runs beside it; `stepscope capture` triggers 3
steps through the sidecar's signed HTTP API into a local file:// store and diagnoses them.

`--scenario NAME` runs one of the fault-injection scenarios (stepscope/local/scenarios.py) instead: a
known cause on one rank (or none), captured at the default size, so a user sees what stepscope
says about each kind of problem. `LocalRun` is the part benchmarks/diagnosis_accuracy.py reuses.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from stepscope.local import capture
from stepscope.local.launch import LocalJob, free_port, launch_ranks
from stepscope.local.scenarios import SCENARIOS, Scenario
from stepscope.sidecar_client import SidecarClient, SidecarError

RANKS = 4
SLOW_RANK = 2
STARTUP_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("demo-output"),
        metavar="DIR",
        help="where the run's shared directory, logs and captured session go (default %(default)s, replaced each run)",
    )
    parser.add_argument(
        "--slow-ms", type=float, default=60.0, help="extra CPU work per step on the slow rank (default %(default)s)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steps to capture (default 3; with --scenario capture's default)"
    )
    parser.add_argument("--wait", type=int, default=3, help="steps to let pass before capturing (default %(default)s)")
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default=None,
        help="run a fault-injection scenario instead of the classic demo: "
        + "; ".join(f"{s.name}: {s.description}" for s in SCENARIOS.values()).replace("%", "%%"),
    )
    parser.add_argument("--ranks", type=int, default=RANKS, help="ranks to start (default %(default)s)")


def _stage(started: float, text: str) -> None:
    print(f"[{time.monotonic() - started:5.1f}s] {text}", flush=True)


def _start_sidecar(run_dir: Path, port: int, key: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "STEPSCOPE_HMAC_KEY": key, "POD_NAME": "demo-pod", "NODE_NAME": os.uname().nodename}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepscope.cli",
                "sidecar",
                "--dir",
                str(run_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=run_dir,
            start_new_session=True,
        )


def _wait_until(what: str, ready, deadline: float, watched: list[subprocess.Popen], logs: list[Path]) -> None:
    """Poll `ready()` until it holds; a process that died meanwhile ends the demo with its log's tail."""
    while not ready():
        for proc, log in zip(watched, logs):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(
                    f"{what}: {log.stem} exited with code {proc.returncode} before it was ready:\n{tail}"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready after {STARTUP_TIMEOUT_S:.0f} s; logs: {', '.join(map(str, logs))}")
        time.sleep(0.2)


def _heartbeat_steps(run_dir: Path) -> list[int] | None:
    """Each registered rank's step count from the agent's heartbeat; None while one is unreadable."""
    records = []
    for path in (run_dir / "agents").glob("rank-*.json"):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None
    return [int(r.get("step", 0)) for r in records]


def _ranks_at(run_dir: Path, ranks: int, step: int) -> bool:
    """Every rank has registered with the agent's heartbeat and completed `step` steps."""
    steps = _heartbeat_steps(run_dir)
    return steps is not None and len(steps) == ranks and all(s >= step for s in steps)


def _sidecar_up(client: SidecarClient) -> bool:
    try:
        return client.healthz()
    except SidecarError:
        return False


class LocalRun:
    """A sidecar daemon and a gloo job of workload.py beside it, in `out`/shared and `out`/logs;
    `capture` takes a capture through the sidecar's signed API like `stepscope capture` does."""

    def __init__(self, out: Path, ranks: int, workload_args: list[str], started: float | None = None) -> None:
        self.out, self.ranks, self.workload_args = out, ranks, workload_args
        self.started = time.monotonic() if started is None else started
        self.run_dir, self.logs = out / "shared", out / "logs"
        self.key = secrets.token_hex(32)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.sidecar: subprocess.Popen | None = None
        self.job: LocalJob | None = None

    def start(self, stepping: int = 1) -> None:
        """Start both and return once every rank has made `stepping` steps with the agent loaded."""
        for folder in (self.run_dir, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        self.sidecar = _start_sidecar(
            self.run_dir, int(self.url.rsplit(":", 1)[1]), self.key, self.logs / "sidecar.log"
        )
        client = SidecarClient(self.url, self.key.encode())
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        _wait_until("sidecar", lambda: _sidecar_up(client), deadline, [self.sidecar], [self.logs / "sidecar.log"])
        self.job = launch_ranks(self.ranks, self.run_dir, self.workload_args, log_dir=self.logs)
        _wait_until(
            "training",
            lambda: _ranks_at(self.run_dir, self.ranks, stepping),
            deadline + STARTUP_TIMEOUT_S,
            [self.sidecar, *self.job.processes],
            [self.logs / "sidecar.log", *self.job.logs],
        )

    def capture(
        self,
        store: Path,
        *,
        steps: int | None,
        wait: int,
        analyze: bool,
        hang_timeout: int = 60,
        hardware_metrics: bool = True,
    ) -> int:
        """`stepscope capture` through capture's own parser, so every option not set here keeps
        capture's default (the capture size included, when `steps` is None)."""
        os.environ["STEPSCOPE_HMAC_KEY"] = self.key
        parser = argparse.ArgumentParser(prog="stepscope capture")
        capture.add_arguments(parser)
        argv = [
            "--wait",
            str(wait),
            "--output-dir",
            str(store),
            "--save-raw-trace",
            "all",
            "--sidecar",
            self.url,
            "--timeout",
            "120",
            "--hang-timeout",
            str(hang_timeout),
        ]
        argv += [] if hardware_metrics else ["--no-hardware-metrics"]
        argv += ["--steps", str(steps)] if steps is not None else []
        return capture.run(parser.parse_args(argv + (["--analyze"] if analyze else [])))

    def stop(self) -> None:
        if self.job is not None:
            self.job.terminate()
        if self.sidecar is not None:
            self.sidecar.terminate()
            try:
                self.sidecar.wait(30)
            except subprocess.TimeoutExpired:
                self.sidecar.kill()

    def __enter__(self) -> LocalRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _start_text(scenario: Scenario | None, ranks: int, slow_ms: float) -> str:
    if scenario is None:
        return (
            f"starting {ranks} gloo ranks of stepscope/local/workload.py, unchanged; rank {SLOW_RANK} is slowed "
            f"by {slow_ms:g} ms a step inside augment_batch_slowly()"
        )
    slow = sorted(scenario.slow_ranks(ranks))
    where = f" on rank{'s' if len(slow) > 1 else ''} {', '.join(map(str, slow))}" if slow else ""
    return (
        f"starting {ranks} gloo ranks of stepscope/local/workload.py, unchanged; scenario {scenario.name}{where}: "
        f"{scenario.description}"
    )


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    out = args.output_dir.expanduser().resolve()
    if out.exists():
        shutil.rmtree(out)
    scenario = SCENARIOS[args.scenario] if args.scenario else None
    if scenario is None:
        if args.ranks <= SLOW_RANK:
            print(
                f"stepscope demo: the classic demo slows rank {SLOW_RANK}: --ranks must be above {SLOW_RANK}",
                file=sys.stderr,
            )
            return capture.EXIT_USAGE
        workload = ["--steps", "0", "--slow-rank", str(SLOW_RANK), "--slow-ms", str(args.slow_ms)]
        steps: int | None = 3 if args.steps is None else args.steps
    else:
        if args.ranks < scenario.min_ranks:
            print(
                f"stepscope demo: scenario {scenario.name} needs --ranks {scenario.min_ranks} or more", file=sys.stderr
            )
            return capture.EXIT_USAGE
        workload, steps = scenario.workload_args(args.ranks), args.steps
    store = out / "session"
    local = LocalRun(out, args.ranks, workload, started)
    try:
        _stage(started, f"starting the sidecar on {local.url} (shared directory {local.run_dir})")
        _stage(started, _start_text(scenario, args.ranks, args.slow_ms))
        hung = scenario is not None and scenario.fault == "hang"
        # A hung rank stops the step count at the step it blocks in (workload's --hang-at-step 4).
        local.start(stepping=5 if hung else 1)
        _stage(
            started,
            f"all {args.ranks} ranks are training with the agent loaded; capturing "
            f"{steps if steps is not None else 'the default number of'} steps through the sidecar",
        )
        code = local.capture(
            store, steps=steps, wait=1 if hung else args.wait, analyze=True, hang_timeout=5 if hung else 60
        )
    except RuntimeError as exc:
        print(f"stepscope demo: {exc}", file=sys.stderr)
        return 1
    finally:
        local.stop()
    _stage(started, f"done; logs in {local.logs}, the session (traces, summaries, report) in {store}")
    return code
