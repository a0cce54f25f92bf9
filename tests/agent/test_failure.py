"""A capture that fails, and a request that cannot be read: training goes on, the failure is in
the state file and the log."""
from __future__ import annotations

from pathlib import Path

from tests.agent.protocol import logs, wait_for, wait_for_state, write_request


def test_failed_capture_leaves_training_running(stepscope_dir: Path, start_job) -> None:
    (stepscope_dir / "request.json").write_text("{not json")
    # A directory where rank 0's trace must go: its export fails, rank 1's does not.
    (stepscope_dir / "s-fail" / "rank-0.trace.json.gz").mkdir(parents=True)
    job = start_job(2, "--steps", "300", "--step-sleep-ms", "10")
    wait_for(lambda: logs(job).count("cannot read") == 2, 30, "both ranks to report the unreadable request")
    write_request(stepscope_dir, "s-v2", version=2)
    for rank in (0, 1):
        unsupported = wait_for_state(stepscope_dir, "s-v2", rank, ("failed",), timeout=10)
        assert unsupported["error"].startswith("unsupported request: version 2")
    # A hand-written request past the CRD's bounds is refused as the API server would refuse the
    # spec, naming the field, not captured with a budget no agent can hold.
    write_request(stepscope_dir, "s-big", waitSteps=1, steps=2, limits={"maxStackEvents": 10_000_000})
    for rank in (0, 1):
        refused = wait_for_state(stepscope_dir, "s-big", rank, ("failed",), timeout=10)
        assert refused["error"].startswith("bad capture request: request.json.capture.limits.maxStackEvents must be within 0..1,000,000")
    write_request(stepscope_dir, "s-fail", waitSteps=1, steps=2)
    assert job.wait(60) == [0, 0], logs(job)
    failed = wait_for_state(stepscope_dir, "s-fail", 0, ("failed",), timeout=5)
    assert failed["error"].startswith("trace export failed: IsADirectoryError"), failed
    assert failed["capturedSteps"] == 2 and failed["trace"] is None
    assert wait_for_state(stepscope_dir, "s-fail", 1, ("done",), timeout=5)["trace"] == "rank-1.trace.json.gz"
    output = logs(job)
    assert "300 steps in" in output and output.count("steps in") == 2
    assert "trace export failed in session s-fail" in output
