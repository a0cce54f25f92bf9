"""The step ring's lock-free protocol between the agent's writer (its own class) and the sidecar's
reader: wrap-around, slots the reader must not trust, and a new process that has the pid of the
one before."""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path

from stepscope.agent.step_ring import StepRing
from stepscope.contracts import wire
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar.telemetry import read_ring
from tests.sidecar.conftest import write_json
from tests.sidecar.test_telemetry_endpoint import metrics


def test_a_ring_that_turned_over_gives_the_latest_steps_it_can_vouch_for(tmp_path: Path) -> None:
    ring = StepRing()
    ring.record(1, 10.0, 9.0)  # before the file exists: kept in memory and published with it
    path = tmp_path / "telemetry" / "rank-3.steps"
    ring.publish(str(path), 3, 1, 8)
    total = wire.TELEMETRY_CAPACITY + 904
    for step in range(2, total + 1):
        ring.record(step, 10.0 + step, 1.0)
    read = read_ring(path)
    assert read is not None and (read.rank, read.local_rank, read.world_size, read.count) == (3, 1, 8, total)
    assert abs(read.clock_offset - (time.time() - time.monotonic())) < 1
    # The slot after the count's may be the one the writer is filling: one slot less than the capacity.
    assert [s[0] for s in read.steps] == list(range(total - wire.TELEMETRY_CAPACITY + 2, total + 1))
    assert read.steps[-1] == (total, 10.0 + total, 1.0)
    # A slot that does not hold the step it stands for (being written, or lost while the file was
    # mapped) is left out, and so is one past the count read first.
    slot = struct.Struct(wire.TELEMETRY_SLOT)
    torn = total - 10
    slot.pack_into(ring.buffer, wire.TELEMETRY_SLOTS_AT + (torn % wire.TELEMETRY_CAPACITY) * slot.size, 0, 0.0, 0.0)
    steps = [s[0] for s in read_ring(path).steps]
    assert torn not in steps and len(steps) == wire.TELEMETRY_CAPACITY - 2
    ring.remove()
    assert read_ring(path) is None


def test_what_is_no_ring_reads_as_none(tmp_path: Path) -> None:
    short = tmp_path / "short.steps"
    short.write_bytes(wire.TELEMETRY_MAGIC.encode())
    other = tmp_path / "other.steps"
    other.write_bytes(b"\0" * (wire.TELEMETRY_SLOTS_AT + 100))
    assert read_ring(short) is None and read_ring(other) is None and read_ring(tmp_path / "absent") is None


def test_a_new_process_with_the_pid_of_the_one_before_starts_the_ranks_series_over(stepscope_dir: Path, sidecar: Sidecar) -> None:
    # A restarted container's process gets the pid its predecessor had (its own pid namespace).
    # Two writers in this one process stand for the two: same pid, each its own run.
    path = stepscope_dir / wire.TELEMETRY_FOLDER / wire.telemetry_file(0)
    registry = stepscope_dir / wire.AGENTS_FOLDER / wire.agent_file(0)

    def beat() -> None:
        write_json(registry, {"rank": 0, "localRank": 0, "worldSize": 1, "pid": os.getpid(), "host": "node-a", "step": 0,
                              "heartbeat": time.time()})

    before, after = StepRing(), StepRing()
    assert before.run_id != after.run_id
    ended = time.monotonic() - 400.0  # its last step 400 s ago: a hang by the chart's default
    for step in range(1, 51):
        before.record(step, ended - (50 - step) * 0.1, 0.1)
    before.publish(str(path), 0, 0, 1)
    beat()
    samples = metrics(sidecar)
    assert samples["stepscope_steps_total"][("0", "0")] == 50 and samples["stepscope_seconds_since_last_step"][("0", "0")] >= 400
    # The old process is gone (no exit handler ran: its ring stays) and the new one registers.
    now = time.monotonic()
    for step in range(1, 4):
        after.record(step, now - (3 - step) * 0.2, 0.2)
    after.publish(str(path), 0, 0, 1)
    beat()
    samples = metrics(sidecar)
    assert samples["stepscope_steps_total"][("0", "0")] == 3
    assert samples["stepscope_step_duration_seconds_count"][("0", "0")] == 2  # step 1 left out, as for any process
    assert samples["stepscope_seconds_since_last_step"][("0", "0")] < 60
