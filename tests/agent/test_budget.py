"""The capture budget (spec.capture.limits) in real rank processes: a capture whose Python calls
would exceed maxStackEvents drops its stacks (and samples the training thread's stack instead),
one that grows the process beyond maxMemoryMB is cut short, and each says so in its state; both still end `done` with a usable trace."""
from __future__ import annotations

from pathlib import Path

from stepscope.contracts.session import MAX_STACK_EVENTS
from tests.agent.protocol import load_trace, logs, profiler_steps, wait_for_state, write_request


def test_over_budget_captures_degrade_in_order_and_say_so(stepscope_dir: Path, start_job) -> None:
    # A background thread of the rank runs Python 5 ms of every 20 (workload.py's publish_metrics).
    job = start_job(1, "--steps", "0", "--python-calls", "3000", "--slow-rank", "0", "--fault", "thread", "--slow-ms", "5", "--period-ms", "20")
    # 3000+ Python calls a step x 2 steps exceeds 1000: the stacks go, the steps stay.
    write_request(stepscope_dir, "s-stacks", waitSteps=1, steps=2, limits={"maxStackEvents": 1000})
    state = wait_for_state(stepscope_dir, "s-stacks", 0, ("done", "failed"), timeout=60)
    assert state["state"] == "done" and state["capturedSteps"] == 2, logs(job)
    assert state["withStack"] is False and len(state["degraded"]) == 1, state
    assert "Python stacks dropped" in state["degraded"][0] and "maxStackEvents=1,000" in state["degraded"][0]
    assert state["degraded"][0] in state["message"]
    assert "sampled every 2 ms instead" in state["degraded"][0]
    events = load_trace(stepscope_dir / "s-stacks" / state["trace"])
    assert len(profiler_steps(events)) == 2
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    # The tracer's events are gone; the training thread's sampled stack stands in for them, named
    # as the tracer names frames, on the steps' thread and within the capture.
    python = [e for e in events if e.get("cat") == "python_function"]
    assert python and all(e["args"]["Sampled"] is True for e in python)
    assert any(e["name"].startswith("workload.py(") and e["name"].endswith(": train") for e in python), {e["name"] for e in python}
    assert {e["tid"] for e in python if e["name"].endswith(": train")} == {steps[0]["tid"]}
    # Every thread is sampled, each on a thread of its own: the background thread's function too.
    background = {e["tid"] for e in python if e["name"].endswith(": publish_metrics")}
    assert background and steps[0]["tid"] not in background, {e["name"] for e in python}
    begin, end = min(s["ts"] for s in steps), max(s["ts"] + s["dur"] for s in steps)
    slack = 20_000  # µs: a sample lasts until the next one, and the agent's clock is matched to the steps' at each step
    assert all(begin - slack <= e["ts"] and e["ts"] + e["dur"] <= end + slack for e in python)

    # Stacks within budget, but the process may grow by 1 MB only: cut after the first step(s).
    write_request(stepscope_dir, "s-memory", waitSteps=1, steps=20, limits={"maxStackEvents": MAX_STACK_EVENTS, "maxMemoryMB": 1})
    state = wait_for_state(stepscope_dir, "s-memory", 0, ("done", "failed"), timeout=120)
    assert state["state"] == "done" and state["withStack"] is True, logs(job)
    assert 1 <= state["capturedSteps"] < 20 and len(state["degraded"]) == 1, state
    assert state["degraded"][0].startswith(f"capture cut after {state['capturedSteps']} of 20 steps") and "maxMemoryMB=1" in state["degraded"][0]
    events = load_trace(stepscope_dir / "s-memory" / state["trace"])
    assert [e for e in events if e.get("cat") == "python_function"]
    assert len(profiler_steps(events)) == state["capturedSteps"]
