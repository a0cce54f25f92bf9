"""`stepscope demo`: the whole single-machine path in about a minute, on the CPU.

A 4-rank gloo training starts the zero-code way (the agent comes from the sidecar's bootstrap on
PYTHONPATH; the training script never imports stepscope), one rank slowed inside a Python function
named `augment_batch_slowly`. A real sidecar daemon runs beside it; `stepscope capture` triggers 3
steps through the sidecar's signed HTTP API into a local file:// store and diagnoses them.
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

from stepscope import capture
from stepscope.launch import LocalJob, free_port, launch_ranks
from stepscope.sidecar_client import SidecarClient, SidecarError

RANKS = 4
SLOW_RANK = 2
STARTUP_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", type=Path, default=Path("demo-output"), metavar="DIR",
                        help="where the run's shared directory, logs and captured session go (default %(default)s, replaced each run)")
    parser.add_argument("--slow-ms", type=float, default=60.0, help="extra CPU work per step on the slow rank (default %(default)s)")
    parser.add_argument("--steps", type=int, default=3, help="steps to capture (default %(default)s)")
    parser.add_argument("--wait", type=int, default=3, help="steps to let pass before capturing (default %(default)s)")


def _stage(started: float, text: str) -> None:
    print(f"[{time.monotonic() - started:5.1f}s] {text}", flush=True)


def _start_sidecar(run_dir: Path, port: int, key: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "STEPSCOPE_HMAC_KEY": key, "POD_NAME": "demo-pod", "NODE_NAME": os.uname().nodename}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "stepscope.cli", "sidecar", "--dir", str(run_dir), "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=run_dir,
                                start_new_session=True)


def _wait_until(what: str, ready, deadline: float, watched: list[subprocess.Popen], logs: list[Path]) -> None:
    """Poll `ready()` until it holds; a process that died meanwhile ends the demo with its log's tail."""
    while not ready():
        for proc, log in zip(watched, logs):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"{what}: {log.stem} exited with code {proc.returncode} before it was ready:\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready after {STARTUP_TIMEOUT_S:.0f} s; logs: {', '.join(map(str, logs))}")
        time.sleep(0.2)


def _ranks_stepping(run_dir: Path) -> bool:
    """Every rank has registered with the agent's heartbeat and completed a step."""
    records = []
    for path in (run_dir / "agents").glob("rank-*.json"):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            return False
    return len(records) == RANKS and all(r.get("step", 0) > 0 for r in records)


def _sidecar_up(client: SidecarClient) -> bool:
    try:
        return client.healthz()
    except SidecarError:
        return False


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    out = args.output_dir.expanduser().resolve()
    if out.exists():
        shutil.rmtree(out)
    run_dir, logs, store = out / "shared", out / "logs", out / "session"
    for folder in (run_dir, logs, store):
        folder.mkdir(parents=True)
    key = secrets.token_hex(32)
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    _stage(started, f"starting the sidecar on {url} (shared directory {run_dir})")
    sidecar = _start_sidecar(run_dir, port, key, logs / "sidecar.log")
    job: LocalJob | None = None
    try:
        client = SidecarClient(url, key.encode())
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        _wait_until("sidecar", lambda: _sidecar_up(client), deadline, [sidecar], [logs / "sidecar.log"])
        _stage(started, f"starting {RANKS} gloo ranks of stepscope/workload.py, unchanged; rank {SLOW_RANK} is slowed "
                        f"by {args.slow_ms:g} ms a step inside augment_batch_slowly()")
        job = launch_ranks(RANKS, run_dir, ["--steps", "0", "--slow-rank", str(SLOW_RANK), "--slow-ms", str(args.slow_ms)],
                           log_dir=logs)
        _wait_until("training", lambda: _ranks_stepping(run_dir), deadline, [sidecar, *job.processes],
                    [logs / "sidecar.log", *job.logs])
        _stage(started, f"all {RANKS} ranks are training with the agent loaded; capturing {args.steps} steps through the sidecar")
        os.environ["STEPSCOPE_HMAC_KEY"] = key
        # Through capture's own parser, so that the demo takes capture's defaults for every option it does not set.
        parser = argparse.ArgumentParser(prog="stepscope capture")
        capture.add_arguments(parser)
        capture_args = parser.parse_args(["--wait", str(args.wait), "--steps", str(args.steps), "--output-dir", str(store),
                                          "--save-raw-trace", "all", "--analyze", "--sidecar", url, "--timeout", "120", "--hang-timeout", "60"])
        code = capture.run(capture_args)
    except RuntimeError as exc:
        print(f"stepscope demo: {exc}", file=sys.stderr)
        return 1
    finally:
        if job is not None:
            job.terminate()
        sidecar.terminate()
        try:
            sidecar.wait(30)
        except subprocess.TimeoutExpired:
            sidecar.kill()
    _stage(started, f"done; logs in {logs}, the session (traces, summaries, report) in {store}")
    return code
