"""Real captures: 2 gloo ranks, the agent started by the PYTHONPATH bootstrap, a request written
as the sidecar writes it."""
from __future__ import annotations

import re
from pathlib import Path

from tests.agent.protocol import load_trace, logs, read_state, wait_for_state, write_request


def test_captures_exactly_the_requested_steps(stepscope_dir: Path, start_job) -> None:
    write_request(stepscope_dir, "s-exact", waitSteps=3, steps=4)
    job = start_job(2, "--steps", "25", "--step-sleep-ms", "5")
    assert job.wait(60) == [0, 0], logs(job)
    for rank in (0, 1):
        state = wait_for_state(stepscope_dir, "s-exact", rank, ("done",), timeout=10)
        assert state["rank"] == rank and state["worldSize"] == 2 and state["error"] is None
        assert state["startStep"] == state["triggerStep"] + 3
        assert state["endStep"] == state["startStep"] + 4 and state["capturedSteps"] == 4
        assert "CUDA was asked for but is not available" in state["message"]
        events = load_trace(stepscope_dir / "s-exact" / state["trace"])
        step_events = sorted(int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))))
        assert step_events == list(range(state["startStep"], state["endStep"]))
        categories = {e.get("cat") for e in events}
        assert {"cpu_op", "python_function"} <= categories
        assert any(e.get("name") == "aten::addmm" for e in events)
    assert read_state(stepscope_dir, "s-exact", 2) is None
