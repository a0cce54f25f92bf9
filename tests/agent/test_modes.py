"""Loops without an optimizer (stepscope.step()) and captures by duration instead of steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stepscope.sidecar.bootstrap import install_bootstrap, training_env
from tests.agent.protocol import load_trace, logs, profiler_steps, wait_for_state, write_request


def test_step_mode_then_a_duration_capture(stepscope_dir: Path, start_job) -> None:
    """Without an optimizer, stepscope.step() marks the steps; a durationSeconds capture in a loop
    with steps starts and stops at step boundaries, on the training thread."""
    write_request(stepscope_dir, "s-manual", waitSteps=2, steps=3)
    job = start_job(2, "--steps", "0", "--step-sleep-ms", "10", "--no-optimizer")
    for rank in (0, 1):
        state = wait_for_state(stepscope_dir, "s-manual", rank, ("done",))
        assert state["capturedSteps"] == 3 and state["startStep"] == state["triggerStep"] + 2
        events = load_trace(stepscope_dir / "s-manual" / state["trace"])
        assert profiler_steps(events) == list(range(state["startStep"], state["endStep"]))
        assert not any(e.get("name", "").startswith("Optimizer.step") for e in events)
    write_request(stepscope_dir, "s-duration", waitSteps=1, steps=None, durationSeconds=0.3)
    for rank in (0, 1):
        state = wait_for_state(stepscope_dir, "s-duration", rank, ("done",))
        assert state["endTime"] - state["startTime"] >= 0.3 and state["capturedSteps"] >= 1
        assert "watchdog" not in state["message"]
        events = load_trace(stepscope_dir / "s-duration" / state["trace"])
        assert profiler_steps(events) == list(range(state["startStep"], state["endStep"]))
        assert any(e.get("cat") == "cpu_op" for e in events)
    assert all(code is None for code in job.wait(0.1)), logs(job)


STEPLESS_LOOP = """
import time, torch
torch.set_num_threads(1)

def stepless_work(x):
    return (x @ x).relu().sum()

x = torch.randn(32, 32)
deadline = time.monotonic() + {seconds}
while time.monotonic() < deadline:
    stepless_work(x)
    time.sleep(0.002)
"""


def test_duration_mode_without_steps_records_every_thread_from_the_watchdog(
    stepscope_dir: Path, tmp_path: Path
) -> None:
    install_bootstrap(stepscope_dir)
    write_request(stepscope_dir, "s-stepless", waitSteps=3, steps=None, durationSeconds=0.5)
    script = tmp_path / "stepless.py"
    script.write_text(STEPLESS_LOOP.format(seconds=60))
    env = {
        **training_env(stepscope_dir),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "PATH": "/usr/bin:/bin",
        "STEPSCOPE_FIRST_STEP_GRACE_SECONDS": "1",
    }
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        state = wait_for_state(stepscope_dir, "s-stepless", 0, ("done", "failed"), timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert state["state"] == "done", state
    assert state["step"] == 0 and state["capturedSteps"] == 0
    assert "watchdog thread" in state["message"] and "waitSteps=3 ignored" in state["message"]
    assert 0.5 <= state["endTime"] - state["startTime"] < 2.5
    events = load_trace(stepscope_dir / "s-stepless" / state["trace"])
    work = [e for e in events if e.get("cat") == "python_function" and e["name"].endswith(": stepless_work")]
    assert work, "the main thread's Python functions are recorded"
    main_tid = work[0]["tid"]
    assert [e for e in events if e.get("cat") == "cpu_op" and e["tid"] == main_tid and e["name"] == "aten::mm"], (
        "the watchdog's profiler records every thread's operators, the training thread's too"
    )


STALLS_AFTER_STEPS = """
import time, torch
torch.set_num_threads(1)
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
for _ in range(20):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.01)
time.sleep(60)  # a data loader that stops delivering, or the pause between epochs: no step boundary comes
"""


def test_a_duration_capture_ends_on_time_when_the_loop_stops_stepping(stepscope_dir: Path, tmp_path: Path) -> None:
    """Started at a step boundary, the capture's duration runs out while the loop waits: the watchdog
    ends it then, without the next step, and the trace holds the training thread's operators."""
    install_bootstrap(stepscope_dir)
    write_request(stepscope_dir, "s-stall", waitSteps=2, steps=None, durationSeconds=2.0)
    script = tmp_path / "stalls.py"
    script.write_text(STALLS_AFTER_STEPS)
    env = {**training_env(stepscope_dir), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_state(stepscope_dir, "s-stall", 0, ("capturing",), timeout=30)
        state = wait_for_state(stepscope_dir, "s-stall", 0, ("done", "failed"), timeout=10)
        assert proc.poll() is None, "the loop is still waiting: no step ended the capture"
    finally:
        proc.kill()
        proc.communicate()
    assert state["state"] == "done" and state["error"] is None, state
    assert state["step"] == 20 and state["endStep"] == 20 and state["startStep"] == state["triggerStep"] + 2, state
    assert 2.0 <= state["endTime"] - state["startTime"] < 3.5, state
    assert "watchdog" in state["message"], state
    events = load_trace(stepscope_dir / "s-stall" / state["trace"])
    # Step 20, in progress when the duration ran out, is there up to the end of the capture.
    assert profiler_steps(events) == list(range(state["startStep"], 21))
    assert any(e.get("name") == "aten::addmm" for e in events)
