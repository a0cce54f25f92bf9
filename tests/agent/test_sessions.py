"""Sessions that do not go the plain way: a failing capture, a second request while one is
active, a cancel, a bad request. Training always goes on."""
from __future__ import annotations

import re
from pathlib import Path

from tests.agent.protocol import load_trace, logs, wait_for, wait_for_state, write_request


def test_failed_capture_leaves_training_running(stepscope_dir: Path, start_job) -> None:
    (stepscope_dir / "request.json").write_text("{not json")
    # A directory where rank 0's trace must go: its export fails, rank 1's does not.
    (stepscope_dir / "s-fail" / "rank-0.trace.json.gz").mkdir(parents=True)
    job = start_job(2, "--steps", "300", "--step-sleep-ms", "5")
    wait_for(lambda: logs(job).count("cannot read") == 2, 30, "both ranks to report the unreadable request")
    write_request(stepscope_dir, "s-fail", waitSteps=1, steps=2)
    assert job.wait(60) == [0, 0], logs(job)
    failed = wait_for_state(stepscope_dir, "s-fail", 0, ("failed",), timeout=5)
    assert failed["error"].startswith("trace export failed: IsADirectoryError"), failed
    assert failed["capturedSteps"] == 2 and failed["trace"] is None
    assert wait_for_state(stepscope_dir, "s-fail", 1, ("done",), timeout=5)["trace"] == "rank-1.trace.json.gz"
    output = logs(job)
    assert "300 steps in" in output and output.count("steps in") == 2
    assert "trace export failed in session s-fail" in output


def test_second_request_is_refused_and_cancel_keeps_the_capture(stepscope_dir: Path, start_job) -> None:
    write_request(stepscope_dir, "s-first", waitSteps=1, steps=50)
    job = start_job(2, "--steps", "0", "--step-sleep-ms", "20")
    for rank in (0, 1):
        wait_for_state(stepscope_dir, "s-first", rank, ("capturing",))
    write_request(stepscope_dir, "s-second", waitSteps=0, steps=1)
    for rank in (0, 1):
        refused = wait_for_state(stepscope_dir, "s-second", rank, ("refused",), timeout=10)
        assert "session s-first is still active" in refused["error"]
        assert refused["startStep"] is None and refused["trace"] is None
    write_request(stepscope_dir, "s-first", action="cancel")
    for rank in (0, 1):
        cancelled = wait_for_state(stepscope_dir, "s-first", rank, ("cancelled",), timeout=10)
        assert 0 < cancelled["capturedSteps"] < 50
        assert cancelled["endStep"] - cancelled["startStep"] == cancelled["capturedSteps"]
        events = load_trace(stepscope_dir / "s-first" / cancelled["trace"])
        steps = sorted(int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))))
        assert steps == list(range(cancelled["startStep"], cancelled["endStep"]))
    assert all(code is None for code in job.wait(0.1)), "training goes on after refusing and cancelling"
