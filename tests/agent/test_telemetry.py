"""Step telemetry from a real training process started the zero-code way: every step's time in the
rank's ring file (docs/wire.md, "Step telemetry"), read as the sidecar reads it."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from stepscope.sidecar.telemetry import Ring, read_ring
from tests.agent.protocol import logs, wait_for, wait_for_state, write_request
from tests.agent.test_hang import heartbeat


def test_every_step_is_timed_in_the_ring_which_goes_with_the_process(stepscope_dir: Path, start_job) -> None:
    job = start_job(1, "--steps", "150", "--step-sleep-ms", "20")
    path = stepscope_dir / "telemetry" / "rank-0.steps"

    def enough() -> Ring | None:
        ring = read_ring(path)
        return ring if ring is not None and ring.count >= 30 else None

    ring = wait_for(enough, 60, f"30 steps in {path}")
    heartbeat = json.loads((stepscope_dir / "agents" / "rank-0.json").read_text())
    assert (ring.rank, ring.local_rank, ring.world_size, ring.pid) == (0, 0, 1, heartbeat["pid"])
    # The steps before the ring file existed are in it (the watchdog maps it after the first step);
    # one step may be lost if it ended while the watchdog switched the agent to the mapped file.
    steps = [s[0] for s in ring.steps]
    assert steps[0] in (1, 2) and steps == sorted(set(steps)) and len(steps) >= ring.count - 1 and steps[-1] == ring.count
    ends = [end for _, end, _ in ring.steps]
    assert ends == sorted(ends)
    # Each duration is the time from the previous step's end; every step sleeps 20 ms.
    for (before, previous, _), (step, end, duration) in zip(ring.steps, ring.steps[1:]):
        assert step != before + 1 or abs(duration - (end - previous)) < 1e-9
        assert 0.02 <= duration < 5, (step, duration)
    # The clock offset dates the steps in Unix time.
    assert abs(ends[-1] + ring.clock_offset - time.time()) < 5
    assert job.wait(90) == [0], logs(job)
    assert not path.exists()  # a process that exits takes its ring along, as its heartbeat file


def test_a_shared_directory_without_room_for_the_ring_costs_only_the_telemetry(stepscope_dir: Path, start_job) -> None:
    """The ring cannot be made (a file where its folder goes, as a read-only or unmappable mount
    would refuse it): the watchdog still beats, reads requests and catches a hang."""
    (stepscope_dir / "telemetry").write_text("not a folder")
    job = start_job(1, "--steps", "0", "--step-sleep-ms", "5", "--hang-rank", "0", "--hang-at-step", "10")
    wait_for(lambda: heartbeat(stepscope_dir, 0).get("step") == 11, 60, "rank 0 stuck after 11 steps")
    write_request(stepscope_dir, "s-ring", hang_timeout=1)
    state = wait_for_state(stepscope_dir, "s-ring", 0, ("hung",), timeout=30)
    assert state["stacks"] == "rank-0.stacks.json"
    assert "no step telemetry" in logs(job)


class _Timed:
    """Stands in for a DistributedDataParallel model: `_get_ddp_logging_data()` answers the three
    figures the agent reads, as torch's DDP logger names them (`iteration`, the timed iteration;
    `backward_comm_time` in ns; `backward_comm_time_end`, Unix ns), absent until DDP timed an
    iteration; or it raises."""

    def __init__(self, figures: dict[str, int] | None) -> None:
        self.figures, self.reads = figures, 0

    def time(self, iteration: int, milliseconds: int) -> None:
        self.figures = {"iteration": iteration, "backward_comm_time": milliseconds * 1_000_000, "backward_comm_time_end": 10**18 + iteration}

    def _get_ddp_logging_data(self) -> dict[str, int]:
        self.reads += 1
        if self.figures is None:
            raise RuntimeError("no logger")
        return self.figures


def test_the_wait_read_skips_ddps_warm_up_takes_the_median_of_three_drops_a_failing_model_and_stops_retrying(tmp_path: Path) -> None:
    from stepscope.agent import agent as agent_module

    agent = agent_module.Agent(str(tmp_path))
    agent._watchdog = threading.Thread()  # never started: no heartbeats, only the boundary
    model, broken = _Timed({}), _Timed(None)
    agent._ddp_models.update((model, broken))
    model.time(5, 40)  # DDP's warm-up: timed, but not the job's share
    assert agent._read_collective_wait() and agent.collective_wait is None and set(agent._ddp_models) == {model}
    for iteration, milliseconds in ((100, 4), (200, 50), (300, 6), (400, 5)):
        model.time(iteration, milliseconds)
        agent._read_collective_wait()
    # Iterations 200-400: 50 ms (one slow iteration), 6 ms and 5 ms; their median.
    assert agent.collective_wait == {"seconds": 0.006, "at": 1e9 + 400e-9}
    # A model DDP never timed: read at every step only while DDP may still time its first iterations.
    untimed = _Timed({})
    agent._ddp_models.clear()
    agent._ddp_models.add(untimed)
    for _ in range(40):
        agent.boundary()
    assert untimed.reads == agent_module.COLLECTIVE_WAIT_EAGER_STEPS + 1
