"""The sidecar's side of the step telemetry (docs/wire.md, "Step telemetry"): it reads each rank's
step ring without a lock and folds the new steps into per-rank totals and a histogram, which the
Prometheus exposition (stepscope.sidecar.prometheus) and GET /v1/telemetry serve."""
from __future__ import annotations

import bisect
import math
import statistics
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.contracts import wire
from stepscope.sidecar import shared_dir

_HEADER = struct.Struct(wire.TELEMETRY_HEADER)
_COUNT = struct.Struct(wire.TELEMETRY_COUNT)
_SLOT = struct.Struct(wire.TELEMETRY_SLOT)

# Step-time histogram bounds (seconds): from a small model's few milliseconds to a large one's minutes.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, math.inf)
RECENT_STEPS = 64  # step durations each rank's JSON carries


@dataclass(frozen=True)
class Ring:
    """One read of a rank's ring: its header and the steps still in it, oldest first."""
    rank: int
    local_rank: int
    world_size: int
    pid: int
    clock_offset: float  # Unix time minus CLOCK_MONOTONIC, to date the steps
    count: int  # steps the process had completed when read
    steps: list[tuple[int, float, float]]  # (step, end in CLOCK_MONOTONIC seconds, duration)
    run: int = 0  # the process's run id (0 from an older agent): a restarted container's process has the same pid


def read_ring(path: Path) -> Ring | None:
    """The ring at `path`, or None when it is absent, short or not a ring. A slot the writer was
    overwriting while we copied is left out: only steps count-capacity+1..count are taken, where
    count is read before the copy and the capacity reckoned from the count read after it, and each
    slot must hold the step it stands for."""
    try:
        with open(path, "rb") as f:
            head = f.read(wire.TELEMETRY_SLOTS_AT)
            if len(head) < wire.TELEMETRY_SLOTS_AT:
                return None
            magic, capacity, rank, local_rank, world, pid, offset, run = _HEADER.unpack_from(head)
            if magic != wire.TELEMETRY_MAGIC.encode() or capacity <= 0:
                return None
            (before,) = _COUNT.unpack_from(head, wire.TELEMETRY_COUNT_AT)
            slots = f.read(capacity * _SLOT.size)
            f.seek(wire.TELEMETRY_COUNT_AT)
            (after,) = _COUNT.unpack(f.read(_COUNT.size))
    except (OSError, struct.error):
        return None
    if len(slots) < capacity * _SLOT.size:
        return None
    # The writer may be filling the slot of step after+1, which held step after+1-capacity.
    first = max(1, after + 2 - capacity)
    steps = []
    for step in range(first, before + 1):
        entry = _SLOT.unpack_from(slots, (step % capacity) * _SLOT.size)
        if entry[0] == step:
            steps.append(entry)
    return Ring(rank, local_rank, world, pid, offset, before, steps, run)


def live_step_counts(stepscope_dir: Path, *, stale_after_s: float) -> list[int]:
    """The steps each live registered rank of this pod has completed (from its ring, which the
    agent updates every step); ranks without a ring yet are left out."""
    now = time.time()
    alive = {a.rank: a.pid for a in shared_dir.agents(stepscope_dir).values() if now - a.heartbeat <= stale_after_s}
    return [ring.count for rank, pid in alive.items()
            if (ring := read_ring(stepscope_dir / wire.TELEMETRY_FOLDER / wire.telemetry_file(rank))) is not None and ring.pid == pid]


@dataclass
class RankTelemetry:
    """What the sidecar has seen of one training process's steps."""
    rank: int
    local_rank: int
    world_size: int
    pid: int
    clock_offset: float
    run: int = 0
    steps: int = 0
    last_end: float | None = None  # CLOCK_MONOTONIC seconds
    last_duration: float | None = None
    bucket_counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    duration_sum: float = 0.0
    observed: int = 0  # steps in the histogram: those read before the ring overwrote them, less step 1
    recent: list[tuple[int, float]] = field(default_factory=list)  # (step, duration)
    collective_wait_s: float | None = None  # from the heartbeat: DDP's latest sampled gradient all-reduce time

    def wait_share(self) -> float | None:
        """The share of a step this rank waits in DDP's gradient all-reduce: its latest sampled
        all-reduce time over its median step time (at most 1). None without DDP or steps."""
        if self.collective_wait_s is None or not self.recent:
            return None
        step = statistics.median(duration for _, duration in self.recent)
        return min(1.0, self.collective_wait_s / step) if step > 0 else None

    def fold(self, ring: Ring) -> None:
        for step, end, duration in ring.steps:
            if step <= self.steps:
                continue
            self.steps, self.last_end, self.last_duration = step, end, duration
            # Step 1 is timed from the agent's start, which holds the program's setup.
            if step > 1:
                self.bucket_counts[bisect.bisect_left(BUCKETS, duration)] += 1
                self.duration_sum += duration
                self.observed += 1
                self.recent.append((step, duration))
        del self.recent[:-RECENT_STEPS]
        self.steps = max(self.steps, ring.count)

    def seconds_since_step(self, now_mono: float) -> float | None:
        return None if self.last_end is None else max(0.0, now_mono - self.last_end)

    def to_dict(self, now_mono: float, alive: bool) -> dict[str, Any]:
        since = self.seconds_since_step(now_mono)
        return {
            "rank": self.rank, "localRank": self.local_rank, "worldSize": self.world_size, "pid": self.pid, "alive": alive,
            "steps": self.steps, "lastStepSeconds": self.last_duration,
            "lastStepAt": None if self.last_end is None else self.last_end + self.clock_offset,
            "secondsSinceStep": since, "collectiveWaitSeconds": self.collective_wait_s, "waitShare": self.wait_share(),
            "recent": [[step, duration] for step, duration in self.recent],
        }


class StepTelemetry:
    """Every local rank's step telemetry, refreshed from the rings on each read (and by `refresh`)."""

    def __init__(self, stepscope_dir: Path, *, stale_after_s: float) -> None:
        self.dir = stepscope_dir
        self._stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._ranks: dict[int, RankTelemetry] = {}

    def refresh(self) -> list[tuple[RankTelemetry, bool]]:
        """Fold every ring's new steps; returns each rank's telemetry with whether its process is
        alive (a heartbeat of that pid within the stale bound: a hung loop still beats, a dead one not)."""
        now = time.time()
        agents = shared_dir.agents(self.dir)
        alive = {a.rank: a.pid for a in agents.values() if now - a.heartbeat <= self._stale_after_s}
        seen: dict[int, RankTelemetry] = {}
        with self._lock:
            for path in sorted((self.dir / wire.TELEMETRY_FOLDER).glob("rank-*.steps")):
                ring = read_ring(path)
                if ring is None:
                    continue
                known = self._ranks.get(ring.rank)
                # A new process of that rank starts from zero, even with the pid of the one before.
                if known is None or (known.pid, known.run) != (ring.pid, ring.run):
                    known = RankTelemetry(ring.rank, ring.local_rank, ring.world_size, ring.pid, ring.clock_offset, ring.run)
                known.fold(ring)
                agent = agents.get(ring.rank)
                known.collective_wait_s = agent.collective_wait_s if agent is not None and agent.pid == ring.pid else None
                seen[ring.rank] = known
            self._ranks = seen
            return [(r, alive.get(r.rank) == r.pid) for _, r in sorted(seen.items())]

    def to_dict(self, *, pod: str, node: str) -> dict[str, Any]:
        ranks = self.refresh()
        now_mono = time.monotonic()
        return {"pod": pod, "node": node, "time": time.time(), "ranks": [r.to_dict(now_mono, alive) for r, alive in ranks]}
