"""When to capture by itself: the three conditions over the ranks' step telemetry
(docs/wire.md, GET /v1/telemetry), as a pure function `detect(state, observation) -> (state,
actions)` with no I/O and no clock of its own, so that the operator's ProfileTrigger controller
and `stepscope watch` share it and tests drive it step by step.

- slowdown: the job's step time (the median over ranks of each poll's new step times) above
  `slowdown_factor` x a baseline learned from the job itself (the median of its step times over
  the last `baseline_window_s`, learned only while the job is not slow), without a break for
  `sustained_s`;
- divergence: one rank's median step time over `divergence_factor` x the median of its peers',
  or its wait share (the share of its step spent in DDP's gradient all-reduce) `wait_share_gap`
  or more below its peers' median, without a break for `sustained_s`. In synchronous
  data-parallel training the collectives make every rank's step time the same, so step times
  catch ranks that do not step in lockstep (pipeline stages, independent groups) and the wait
  share the slow rank among lockstep peers: they wait for it, it hardly waits;
- hang: no step on any rank for `hang_after_s` (judged once every rank has made a first step).

Each condition fires once when it starts to hold and again only after it stopped holding (the
controller adds a cooldown and a cap on sessions per hour).
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SLOWDOWN, DIVERGENCE, HANG = "Slowdown", "RankDivergence", "Hang"
WAIT_SHARE_GAP = "WaitShareGap"  # a reading beside the conditions': how far the least-waiting rank is below its peers


@dataclass(frozen=True)
class Conditions:
    slowdown_factor: float = 1.5
    sustained_s: float = 60.0
    baseline_window_s: float = 600.0
    min_baseline_polls: int = 10  # no baseline (and no slowdown) before this many polls saw steps
    divergence_factor: float = 1.5
    hang_after_s: float = 300.0
    # A healthy lockstep job's ranks wait about alike; a rank that holds the others back waits
    # little while they wait for it (the slow-rank scenarios: ~3 % against ~60 %).
    wait_share_gap: float = 0.25
    divergence_sustained_s: float | None = None  # the divergence's own window (a ProfileTrigger sets each); None: sustained_s

    def sustained_for(self, condition: str) -> float:
        """How long `condition` must hold before it fires (a hang is sustained by its own bound)."""
        if condition == HANG:
            return 0.0
        if condition == DIVERGENCE and self.divergence_sustained_s is not None:
            return self.divergence_sustained_s
        return self.sustained_s

    def __post_init__(self) -> None:
        for name in ("slowdown_factor", "divergence_factor"):
            if not getattr(self, name) > 1:
                raise ValueError(f"{name} must be above 1, got {getattr(self, name)}")
        for name in ("sustained_s", "baseline_window_s", "hang_after_s", "divergence_sustained_s"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")
        if not 0 < self.wait_share_gap < 1:
            raise ValueError(f"wait_share_gap must be between 0 and 1 (a share of the step), got {self.wait_share_gap}")
        if self.min_baseline_polls < 1:
            raise ValueError(f"min_baseline_polls must be at least 1, got {self.min_baseline_polls}")


@dataclass(frozen=True)
class RankSample:
    """One rank's telemetry as a sidecar serves it: steps completed, seconds since the latest
    ended (None before a first step), its latest (step, seconds) pairs, oldest first, and the
    share of its step spent in DDP's gradient all-reduce (None without DDP)."""
    steps: int
    seconds_since_step: float | None
    recent: Sequence[tuple[int, float]] = ()
    wait_share: float | None = None


@dataclass(frozen=True)
class Observation:
    time: float  # Unix seconds of the poll
    ranks: Mapping[int, RankSample]


def observe(time: float, answers: Iterable[Mapping[str, Any]]) -> Observation:
    """The Observation of one poll from the sidecars' GET /v1/telemetry answers (docs/wire.md).
    Ranks whose process is gone (`alive` false) are left out: a dead job is not a hung one. An
    entry that is not a rank's telemetry is skipped, so one bad sidecar cannot stop the watch."""
    ranks: dict[int, RankSample] = {}
    for answer in answers:
        for entry in answer.get("ranks") or ():
            try:
                if not entry.get("alive"):
                    continue
                since, share = entry.get("secondsSinceStep"), entry.get("waitShare")
                recent = tuple((int(step), float(seconds)) for step, seconds in entry.get("recent") or ())
                ranks[int(entry["rank"])] = RankSample(int(entry["steps"]), None if since is None else float(since), recent,
                                                       None if share is None else float(share))
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
    return Observation(time, ranks)


@dataclass(frozen=True)
class Fire:
    """Capture now: which condition, why (a sentence for the trigger's status and Event), and the
    ranks it points at (every rank for a job-wide condition)."""
    condition: str
    reason: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class State:
    seen: Mapping[int, int] = field(default_factory=dict)  # rank -> latest step taken into account
    history: tuple[tuple[float, float], ...] = ()  # (poll time, job step time) the baseline is learned from
    baseline: float | None = None
    current: Mapping[str, float | None] = field(default_factory=dict)  # each condition's latest reading
    since: Mapping[str, float] = field(default_factory=dict)  # condition -> when it started to hold
    holding: frozenset[str] = frozenset()  # conditions that fired and still hold


def detect(state: State, observation: Observation, conditions: Conditions) -> tuple[State, list[Fire]]:
    """Fold one poll of every rank's telemetry into `state`; the captures to start now."""
    now = observation.time
    new_times: dict[int, list[float]] = {}
    seen = dict(state.seen)
    for rank, sample in observation.ranks.items():
        last = seen.get(rank, 0)
        if sample.steps < last:  # a new process took the rank: start over
            last = 0
        new_times[rank] = [seconds for step, seconds in sample.recent if step > last]
        seen[rank] = sample.steps
    per_rank = {rank: statistics.median(times) for rank, times in new_times.items() if times}
    job = statistics.median(per_rank.values()) if per_rank else None

    readings: dict[str, float | None] = {}
    # Each condition's verdict this poll: (reason, ranks) when it holds, None when not; a condition
    # left out (no step came to judge it by) neither starts nor ends.
    holds: dict[str, tuple[str, tuple[int, ...]] | None] = {}
    ranks = tuple(sorted(observation.ranks))

    baseline = state.baseline
    slow = job is not None and baseline is not None and job > conditions.slowdown_factor * baseline
    readings[SLOWDOWN] = None if job is None or not baseline else job / baseline
    if job is not None:
        holds[SLOWDOWN] = (f"step time {job:.3g} s is {job / baseline:.2f}x the job's baseline {baseline:.3g} s "
                           f"(over {conditions.slowdown_factor:g}x)", ranks) if slow and baseline is not None else None

    history = state.history
    if job is not None and not slow and SLOWDOWN not in state.since:
        history = (*history, (now, job))
    history = tuple(h for h in history if h[0] >= now - conditions.baseline_window_s)
    if len(history) >= conditions.min_baseline_polls:
        baseline = statistics.median(t for _, t in history)

    readings[DIVERGENCE] = readings[WAIT_SHARE_GAP] = None
    diverged: list[tuple[str, tuple[int, ...]]] = []
    if len(per_rank) >= 2:
        # The slowest rank diverges most (the largest step time over the smallest peers' median:
        # leaving out the largest value lowers the median most), so one median, not one per rank
        # (which cost seconds a poll at 8,000 ranks).
        worst = max(per_rank, key=lambda r: per_rank[r])
        ratio = per_rank[worst] / statistics.median(o for r, o in per_rank.items() if r != worst)
        readings[DIVERGENCE] = ratio
        if ratio > conditions.divergence_factor:
            diverged.append((f"rank {worst}'s step time {per_rank[worst]:.3g} s is {ratio:.2f}x its peers' median "
                             f"(over {conditions.divergence_factor:g}x)", (worst,)))
    # Judged with the step times (a rank that makes no new step has no current share); the
    # least-waiting rank is the furthest below its peers' median, as above.
    shares = {rank: s.wait_share for rank, s in observation.ranks.items() if s.wait_share is not None and rank in per_rank}
    if len(shares) >= 2:
        least = min(shares, key=lambda r: shares[r])
        peers = statistics.median(o for r, o in shares.items() if r != least)
        readings[WAIT_SHARE_GAP] = peers - shares[least]
        if peers - shares[least] >= conditions.wait_share_gap:
            diverged.append((f"rank {least} waits {shares[least]:.0%} of its step in collectives, its peers {peers:.0%}: "
                             f"they wait for it (a gap over {conditions.wait_share_gap:.0%})", (least,)))
    if readings[DIVERGENCE] is not None or readings[WAIT_SHARE_GAP] is not None:
        holds[DIVERGENCE] = diverged[0] if diverged else None

    stalls = [s.seconds_since_step for s in observation.ranks.values() if s.seconds_since_step is not None]
    stalled = min(stalls) if stalls and len(stalls) == len(observation.ranks) else None
    readings[HANG] = stalled
    holds[HANG] = (f"no step on any rank for {stalled:.0f} s (over {conditions.hang_after_s:g} s)", ranks) \
        if stalled is not None and stalled >= conditions.hang_after_s else None

    since = dict(state.since)
    holding = set(state.holding)
    fires = []
    for condition, held in holds.items():
        if held is None:
            since.pop(condition, None)
            holding.discard(condition)
            continue
        started = since.setdefault(condition, now)
        due = now - started >= conditions.sustained_for(condition)
        if due and condition not in holding:
            holding.add(condition)
            reason, culprits = held
            fires.append(Fire(condition, reason if condition == HANG else f"{reason} for {now - started:.0f} s", culprits))
    return State(seen, history, baseline, readings, since, frozenset(holding)), fires

