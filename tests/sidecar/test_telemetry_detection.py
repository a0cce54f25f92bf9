"""The capture conditions (stepscope.detection) over a real sidecar's GET /v1/telemetry, fed by real
torch ranks over gloo started the zero-code way: a job slowed from outside mid-run (its rank 1
stopped and continued, as CPU throttling by a noisy neighbour does) and a job that hangs.
Conditions are scaled to seconds to keep the test short."""
from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.detection import HANG, SLOWDOWN, Conditions, Fire, State, detect, observe
from stepscope.local.launch import LocalJob, launch_ranks
from stepscope.sidecar_client import SidecarClient
from tests.agent.protocol import wait_for

POLL_S = 0.5
# A factor well above what a loaded 2-core machine does to a healthy step, well below the throttle.
CONDITIONS = Conditions(slowdown_factor=2.5, sustained_s=2.0, baseline_window_s=30.0, min_baseline_polls=6, hang_after_s=3.0)


@pytest.fixture()
def jobs(stepscope_dir: Path, tmp_path: Path) -> Iterator[list[LocalJob]]:
    started: list[LocalJob] = []
    yield started
    for job in started:
        job.terminate()


def watch(client: SidecarClient, state: State, seconds: float) -> tuple[State, list[tuple[float, Fire]]]:
    fired = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state, fires = detect(state, observe(time.time(), [client.get_telemetry()]), CONDITIONS)
        fired += [(time.monotonic(), f) for f in fires]
        time.sleep(POLL_S)
    return state, fired


def throttle(pid: int, stop: threading.Event) -> None:
    """Stop the process 150 ms in every 170 ms: a step (20 ms of sleep and some computing) then takes
    about a cycle, several times its healthy time."""
    while not stop.is_set():
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.15)
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.02)
    os.kill(pid, signal.SIGCONT)


def test_a_slowdown_mid_run_fires_and_the_healthy_part_does_not(client: SidecarClient, stepscope_dir: Path, tmp_path: Path,
                                                               jobs: list[LocalJob]) -> None:
    job = launch_ranks(2, stepscope_dir, ["--steps", "0", "--step-sleep-ms", "20"], log_dir=tmp_path / "logs")
    jobs.append(job)
    wait_for(lambda: len(client.get_telemetry()["ranks"]) == 2 and all(r["steps"] > 5 for r in client.get_telemetry()["ranks"]),
             90, "both ranks stepping")
    state, fired = watch(client, State(), 8.0)
    assert fired == [] and state.baseline is not None, state
    baseline = state.baseline
    stop = threading.Event()
    slowed = time.monotonic()
    throttler = threading.Thread(target=throttle, args=(job.processes[1].pid, stop), daemon=True)
    throttler.start()
    try:
        state, fired = watch(client, state, 10.0)
    finally:
        stop.set()
        throttler.join()
    slowdowns = [(when, f) for when, f in fired if f.condition == SLOWDOWN]
    assert slowdowns, (state, fired)
    when, fire = slowdowns[0]
    assert CONDITIONS.sustained_s <= when - slowed <= 8.0 and fire.ranks == (0, 1), fire
    # The slow steps were not learned (a poll of partly slow steps may be).
    assert state.baseline == pytest.approx(baseline, rel=0.2) and state.current[SLOWDOWN] > CONDITIONS.slowdown_factor, state


def test_a_hang_fires_once(client: SidecarClient, stepscope_dir: Path, tmp_path: Path, jobs: list[LocalJob]) -> None:
    jobs.append(launch_ranks(2, stepscope_dir, ["--steps", "0", "--step-sleep-ms", "10", "--hang-rank", "1", "--hang-at-step", "60"],
                             log_dir=tmp_path / "logs"))
    # Watched from shortly before the hang: a loaded machine can take most of the window to start gloo.
    wait_for(lambda: len(ranks := client.get_telemetry()["ranks"]) == 2 and all(r["steps"] >= 40 for r in ranks), 90,
             "both ranks at step 40")
    state, fired = watch(client, State(), 12.0)
    hangs = [f for _, f in fired if f.condition == HANG]
    assert len(hangs) == 1 and hangs[0].ranks == (0, 1) and "no step on any rank" in hangs[0].reason, fired
    assert state.current[HANG] >= CONDITIONS.hang_after_s
