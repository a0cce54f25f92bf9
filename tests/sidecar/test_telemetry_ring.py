"""The step ring's lock-free protocol between the agent's writer (its own class) and the sidecar's
reader: wrap-around, and slots the reader must not trust."""
from __future__ import annotations

import struct
import time
from pathlib import Path

from stepscope import wire
from stepscope.sidecar.agent import _StepRing
from stepscope.sidecar.telemetry import read_ring


def test_a_ring_that_turned_over_gives_the_latest_steps_it_can_vouch_for(tmp_path: Path) -> None:
    ring = _StepRing()
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
