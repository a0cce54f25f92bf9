"""The watchdog: a blocked rank leaves its peer waiting in a collective; both ranks are marked
hung with every thread's Python stack, and go back to their capture when training resumes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from stepscope.local.launch import LocalJob
from tests.agent.protocol import logs, wait_for, wait_for_state, write_request


def heartbeat(directory: Path, rank: int) -> dict:
    try:
        return json.loads((directory / "agents" / f"rank-{rank}.json").read_text())
    except FileNotFoundError:
        return {}


def main_thread_functions(stacks: dict) -> list[str]:
    (main,) = [t for t in stacks["threads"] if t["main"]]
    return [f["function"] for f in main["frames"]]


def test_a_hang_that_recovers_resumes_the_capture(stepscope_dir: Path, start_job) -> None:
    job = start_job(
        2, "--steps", "20", "--step-sleep-ms", "5", "--hang-rank", "1", "--hang-at-step", "6", "--hang-seconds", "8"
    )
    hung_and_check_stacks(stepscope_dir, job)
    for rank in (0, 1):
        state = wait_for_state(stepscope_dir, "s-hang", rank, ("done",), timeout=30)
        # The last wait step counts the Python calls for the capture budget (a step the stuck ranks
        # make only after the hang), so waitSteps=2 still starts exactly at trigger + 2.
        assert state["triggerStep"] == 7 and state["startStep"] == 9 and state["capturedSteps"] == 3, state
        assert state["stacks"] == f"rank-{rank}.stacks.json" and state["error"] is None
    assert job.wait(30) == [0, 0], logs(job)


def hung_and_check_stacks(stepscope_dir: Path, job: LocalJob) -> None:
    # The request reaches ranks that are already stuck, the way a user asks about a job that hangs.
    wait_for(
        lambda: all(heartbeat(stepscope_dir, rank).get("step") == 7 for rank in (0, 1)),
        30,
        "both ranks stuck after step 7",
    )
    write_request(stepscope_dir, "s-hang", waitSteps=2, steps=3, hang_timeout=2)
    states = [wait_for_state(stepscope_dir, "s-hang", rank, ("hung",), timeout=30) for rank in (0, 1)]
    for rank, state in enumerate(states):
        assert state["stacks"] == f"rank-{rank}.stacks.json"
        assert state["step"] == 7, state
        stacks = json.loads((stepscope_dir / "s-hang" / state["stacks"]).read_text())
        assert stacks["rank"] == rank and stacks["session"] == "s-hang" and stacks["secondsSinceStep"] >= 2
        assert {t["name"] for t in stacks["threads"]} >= {"MainThread", "stepscope-watchdog"}
        functions = main_thread_functions(stacks)
        assert functions[0] == "<module>" and "train" in functions
        if rank == 0:
            assert functions.index("average_loss_across_ranks") < functions.index("all_reduce"), functions
        else:
            assert functions[-2:] == ["train", "block_forever"], functions
    assert all(code is None for code in job.wait(0.1))
    for rank, process in enumerate(job.processes):
        beat = heartbeat(stepscope_dir, rank)
        assert beat["pid"] == process.pid and beat["step"] == 7 and beat["worldSize"] == 2 and beat["localRank"] == rank
        assert time.time() - beat["heartbeat"] < 5, "the watchdog keeps beating while training hangs"
