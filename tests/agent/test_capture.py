"""Real captures: 2 gloo ranks, the agent started by the PYTHONPATH bootstrap, requests written
as the sidecar writes them. One job serves several sessions, one after the other, as a long
training run would."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stepscope.analysis.loading.trace import load_trace as read_trace
from stepscope.analysis.statistics.summary import summarize
from stepscope.contracts.wire import AGENTS_FOLDER, SCHEDSTAT_KEY, agent_file
from stepscope.testing.polling import wait_for
from tests.agent.protocol import (
    load_trace,
    load_trace_document,
    logs,
    needs_stop_watch,
    profiler_steps,
    read_state,
    wait_for_state,
    write_request,
)


def test_exact_steps_then_a_refused_second_request_then_cancels(stepscope_dir: Path, start_job) -> None:
    write_request(stepscope_dir, "s-exact", waitSteps=3, steps=4)
    job = start_job(2, "--steps", "0", "--step-sleep-ms", "20", "--slow-rank", "1", "--slow-ms", "15")
    for rank in (0, 1):
        state = wait_for_state(stepscope_dir, "s-exact", rank, ("done",))
        assert state["rank"] == rank and state["worldSize"] == 2 and state["error"] is None
        assert state["startStep"] == state["triggerStep"] + 3
        assert state["endStep"] == state["startStep"] + 4 and state["capturedSteps"] == 4
        assert "CUDA was asked for but is not available" in state["message"]
        assert (state["gpu"], state["gpuUuid"]) == (-1, "")  # a CPU rank names no GPU
        events = load_trace(stepscope_dir / "s-exact" / state["trace"])
        assert profiler_steps(events) == list(range(state["startStep"], state["endStep"]))
        assert {"cpu_op", "python_function"} <= {e.get("cat") for e in events}
        assert any(e.get("name") == "aten::addmm" for e in events)
        assert any(e.get("name") == "gloo:all_reduce" for e in events)
        slow = [e for e in events if e.get("cat") == "python_function" and e["name"].endswith(": augment_batch_slowly")]
        if rank == 1:
            assert len(slow) == 4 and all(e["dur"] >= 15_000 for e in slow), slow
        else:
            assert slow == []
    assert read_state(stepscope_dir, "s-exact", 2) is None

    write_request(stepscope_dir, "s-first", waitSteps=1, steps=50)
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
        assert profiler_steps(events) == list(range(cancelled["startStep"], cancelled["endStep"]))
    write_request(stepscope_dir, "s-never", action="cancel")
    for rank in (0, 1):
        never = wait_for_state(stepscope_dir, "s-never", rank, ("cancelled",), timeout=10)
        assert (
            never["trace"] is None
            and never["error"] is None
            and "before the capture request reached" in never["message"]
        )
    assert all(code is None for code in job.wait(0.1)), "training goes on through all of it\n" + logs(job)
    assert all(code is not None and code < 0 for code in job.terminate()), "terminate ends every rank"


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat is not available here")
def test_each_captured_step_carries_its_training_threads_cpu_and_run_queue_time(stepscope_dir: Path, start_job) -> None:
    write_request(stepscope_dir, "s-sched", waitSteps=2, steps=4)
    job = start_job(2, "--steps", "0", "--step-sleep-ms", "20", "--slow-rank", "1", "--slow-ms", "15")
    for rank in (0, 1):
        state = wait_for_state(stepscope_dir, "s-sched", rank, ("done",))
        path = stepscope_dir / "s-sched" / state["trace"]
        marks = load_trace_document(path)[SCHEDSTAT_KEY]["steps"]
        # The counters as each captured step began, and as the capture ended.
        assert [m[0] for m in marks] == list(range(state["startStep"], state["endStep"] + 1))
        assert all(b[1] >= a[1] and b[2] >= a[2] for a, b in zip(marks, marks[1:]))
        steps = summarize(read_trace(path)).steps
        assert [s.step for s in steps] == list(range(state["startStep"], state["endStep"]))
        cpu = [s.cpuUs for s in steps]
        assert all(c is not None and s.runDelayUs is not None and 0 < c <= s.durationUs for c, s in zip(cpu, steps))
        # Rank 1 computes 15 ms a step more (augment_batch_slowly) on its training thread, a loop
        # until a deadline that is on a CPU or waiting for one all along (on a busy machine, more of
        # the second); its sleeps (the 20-ms shard reads) are neither.
        if rank == 1:
            runnable = [c + s.runDelayUs for c, s in zip(cpu, steps)]
            assert min(runnable) >= 12_000, (cpu, [s.runDelayUs for s in steps])
        assert max(s.cpuUs for s in steps) < min(s.durationUs for s in steps) - 15_000
    assert all(code is None for code in job.wait(0.1)), "training goes on through all of it\n" + logs(job)


def _stepping(stepscope_dir: Path, rank: int) -> bool:
    try:
        return json.loads((stepscope_dir / AGENTS_FOLDER / agent_file(rank)).read_text())["step"] > 0
    except (OSError, ValueError, KeyError):
        return False


class _CpuLimit:
    """A cgroup with a CPU limit of `quota_ms` of every 100 ms (cgroup v1's cpu controller, or v2's
    cpu.max), made for one test and removed after; None where this process may not make one."""

    def __init__(self, path: Path, v2: bool) -> None:
        self.path, self.v2 = path, v2

    @classmethod
    def make(cls, quota_ms: int) -> _CpuLimit | None:
        name = f"stepscope-test-{os.getpid()}"
        v2_root = Path("/sys/fs/cgroup")
        try:
            if Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists():
                limit = cls(Path("/sys/fs/cgroup/cpu") / name, v2=False)
                limit.path.mkdir()
                (limit.path / "cpu.cfs_period_us").write_text("100000")
                (limit.path / "cpu.cfs_quota_us").write_text(str(quota_ms * 1000))
                return limit
            if "cpu" in (v2_root / "cgroup.subtree_control").read_text().split():
                limit = cls(v2_root / name, v2=True)
                limit.path.mkdir()
                (limit.path / "cpu.max").write_text(f"{quota_ms * 1000} 100000")
                return limit
        except OSError:
            return None
        return None

    def take(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        parent = self.path.parent
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # it ended meanwhile
        self.path.rmdir()


def test_a_rank_its_cpu_limit_throttles_carries_its_throttled_time_and_its_peer_none(
    stepscope_dir: Path, start_job
) -> None:
    # The kernel counts a CPU limit's throttling as run-queue time (schedstat); the cgroup's
    # cpu.stat says how much of it the limit caused.
    limit = _CpuLimit.make(quota_ms=10)
    if limit is None:
        pytest.skip("no cgroup with a CPU limit can be made here (needs root and a writable cpu controller)")
    try:
        job = start_job(2, "--steps", "0", "--step-sleep-ms", "20", "--slow-rank", "1", "--slow-ms", "15")
        # Under the limit once it steps: its start (torch's import, gloo's rendezvous) is no step.
        wait_for(lambda: _stepping(stepscope_dir, 1), 60, "rank 1 stepping")
        limit.take(job.processes[1].pid)
        write_request(stepscope_dir, "s-limit", waitSteps=2, steps=4)
        throttled: dict[int, list[float | None]] = {}
        for rank in (0, 1):
            state = wait_for_state(stepscope_dir, "s-limit", rank, ("done",), timeout=60)
            path = stepscope_dir / "s-limit" / state["trace"]
            steps = summarize(read_trace(path)).steps
            throttled[rank] = [s.throttledUs for s in steps]
            assert all(t is None or t <= (s.runDelayUs or 0.0) for t, s in zip(throttled[rank], steps))
        # Rank 1 needs 15 ms of CPU a step under a limit of 10 ms of every 100 ms.
        assert all(t is not None and t > 5_000 for t in throttled[1]), throttled
        assert all(t == 0.0 for t in throttled[0]), throttled
        assert all(code is None for code in job.wait(0.1)), "training goes on through all of it\n" + logs(job)
    finally:
        limit.remove()


@needs_stop_watch
def test_a_rank_its_host_stops_carries_its_stopped_time_and_its_peer_next_to_none(
    stepscope_dir: Path, start_job
) -> None:
    # A process stops rank 1 6 ms of every 10 ms (SIGSTOP, SIGCONT); the agent's stop watch wakes
    # late by each stop whatever the training thread does then, its sleeps and collectives too.
    job = start_job(2, "--steps", "0", "--step-sleep-ms", "20", "--slow-rank", "1", "--fault", "host", "--slow-ms", "6")
    write_request(stepscope_dir, "s-stops", waitSteps=2, steps=4)
    stopped: dict[int, list[float]] = {}
    for rank in (0, 1):
        state = wait_for_state(stepscope_dir, "s-stops", rank, ("done",), timeout=60)
        steps = summarize(read_trace(stepscope_dir / "s-stops" / state["trace"])).steps
        stopped[rank] = [s.stoppedUs / s.durationUs for s in steps if s.stoppedUs is not None]
        assert len(stopped[rank]) == len(steps), steps
    # The stopper is a process of a loaded machine too: 29-45 % of the step in the suite on 2 cores.
    assert min(stopped[1]) > 0.15 and max(stopped[0]) < 0.05 and min(stopped[1]) > 5 * max(stopped[0]), stopped
    # Its thread ends with the capture; the training goes on.
    for process in job.processes:
        names = [p.read_text().strip() for p in Path(f"/proc/{process.pid}/task").glob("*/comm")]
        assert "stepscope-stops" not in names, names
    assert all(code is None for code in job.wait(0.1)), "training goes on through all of it\n" + logs(job)
