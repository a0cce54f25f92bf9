"""Time a rank's host held its training thread off, against its peers': a host that stops the rank
(a paused or frozen container, a process that stops it, memory reclaim) or throttles it (its
container's CPU limit) takes that time from all of its work, a little from every frame and
operator, so no one of them carries it. The kernel's counters (StepRow.cpuUs, runDelayUs: Linux
schedstat; throttledUs: its cgroup's cpu.stat; the agent records both at each captured step
boundary) tell it apart from a machine whose ranks share its CPUs: each step's time less the
rank's collectives (its wait for its peers), its time on a CPU and its time waiting for one is
what it slept, blocked in I/O or locks, or was stopped. A CPU limit's throttling is not there: a
throttled thread waits in the run queue (a thread under a quota of 20 of every 100 ms, busy 2 s:
423 ms on a CPU, 1,596 ms in the run queue, the cgroup throttled 1,596 ms, nothing off it), so
the throttled part of the run queue's time is added back, and the rest of it (CPUs that other
work takes) is not the host's doing. The same work on every rank sleeps and blocks alike (29-30 ms
a step on every healthy rank of the benchmark's job, within 1.5 ms of each other), so what one
rank is held off beyond that is its own.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.causes import Cause
from stepscope.analysis.diagnosis.operator_time import main_work_alike
from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.diagnosis.slow_workers import MIN_GAP_SHARE, MIN_VOTE_COST, WaitVerdict
from stepscope.analysis.diagnosis.wording import ms

# The phases of a cause told by these counters: a host that stops the rank, or its CPU limit.
HELD_OFF = "held off the CPU"
CPU_LIMIT = "throttled by its CPU limit"
STOPPED = "stopped by its host"
HOST_PHASES = (HELD_OFF, CPU_LIMIT, STOPPED)
# The share of the steps in which a rank held off longer than its peers is a cause. Healthy ranks
# of one job fall on either side of each other from step to step (7 of 8 steps one way in 14 of
# 447 healthy ranks of the benchmark, their typical difference within -3.8..+4.1 % of the step: the
# 5 % floor keeps them apart); a host that stops a rank shows in at least this many.
STEADY_SHARE = 0.75
# Of a rank's time held off beyond its peers', the share its stop watch must show as stopped, where
# every rank has one, for its host to be what holds it off.
CONFIRMED_SHARE = 0.5


def _off_cpu(tables: RankTables, v: WaitVerdict, steps: pd.Index) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """Each step's (rows) time held off, outside collectives, by rank (columns): off the CPU and out
    of the run queue, or throttled by its CPU limit; and the throttled part alone. None where a
    rank's trace has no scheduler counters for a step."""
    s = tables.steps
    if s.empty or "cpuUs" not in s or "runDelayUs" not in s:
        return None
    # A null counter sums to 0 in a step table: such steps are looked for first.
    if (
        s.loc[s["step"].isin(steps) & s["rank"].isin(v.perStepUs.columns), ["cpuUs", "runDelayUs"]]
        .isna()
        .any(axis=None)
    ):
        return None

    def pivot(column: str) -> pd.DataFrame:
        return tables.by_step(column).reindex(index=steps, columns=v.perStepUs.columns)

    throttled = _throttled(tables, steps, v.perStepUs.columns)
    off = pivot("durationUs") - v.perStepUs.reindex(index=steps) - pivot("cpuUs") - pivot("runDelayUs") + throttled
    return None if off.isna().to_numpy().any() else (off, throttled)


def _throttled(tables: RankTables, steps: pd.Index, ranks: pd.Index | list[int]) -> pd.DataFrame:
    """Each step's (rows) time its CPU limit held each rank (columns) throttled: 0 where its trace
    has no such counter (a rank without a cgroup CPU controller is throttled by none)."""
    if "throttledUs" not in tables.steps:
        return pd.DataFrame(0.0, index=steps, columns=ranks)
    return tables.by_step("throttledUs").reindex(index=steps, columns=ranks).fillna(0.0)


def _others_median(values: np.ndarray) -> np.ndarray:
    """For each step (row) and rank (column), the median of the other ranks' values in that step:
    each row sorted once, and the median of what is left without one of them read off it."""
    order = np.sort(values, axis=1)
    position = np.argsort(np.argsort(values, axis=1, kind="stable"), axis=1, kind="stable")
    left = values.shape[1] - 1
    low, high = (left - 1) // 2, left // 2

    def nth(j: int) -> np.ndarray:
        # The j-th of what is left once the value at `position` is taken out.
        return np.take_along_axis(order, np.where(position > j, j, j + 1), axis=1)

    return (nth(low) + nth(high)) / 2.0


def waits_for_cpu(tables: RankTables, v: WaitVerdict, rank: int, steps: pd.Index) -> float:
    """The rank's typical time per step in the run queue beyond that of its peers on its node, its
    CPU limit's throttling apart: ranks of one node share its CPUs, and which of them the
    scheduler leaves waiting longer differs from capture to capture (healthy ranks of three and
    four on two loaded cores waited 1.6-4.1 ms a step more than their peers, their operators
    1.4-2.0x theirs with the same shapes). That time stretches whatever the rank runs, its
    operators too, and says nothing of its device or host. 0 without counters, or without peers
    on its node (or a node's name)."""
    s = tables.steps
    nodes = tables.ranks.set_index("rank")["node"]
    if s.empty or "runDelayUs" not in s or rank not in nodes.index or not nodes[rank]:
        return 0.0
    peers = [r for r in v.perStepUs.columns if r != rank and r in nodes.index and nodes[r] == nodes[rank]]
    if not peers:
        return 0.0
    columns = [rank, *peers]
    waiting = tables.by_step("runDelayUs").reindex(index=steps, columns=columns) - _throttled(tables, steps, columns)
    excess = (waiting[rank] - waiting[peers].median(axis=1)).dropna()
    return float(max(np.median(excess.to_numpy(dtype=float)), 0.0)) if len(excess) else 0.0


def host_time(tables: RankTables, v: WaitVerdict, rank: int, steps: pd.Index) -> float | None:
    """The rank's typical time per step beyond its peers' that its own counters show: held off the
    CPU or throttled by its limit, on a CPU (a slower CPU takes longer for the same work), or in the
    run queue beyond its peers on its node (CPUs that others on its host take). A slower host leaves
    its time there; a machine whose ranks share its CPUs does not, as its run-queue time lands in
    one rank's operators in one capture and in another's in the next. None without counters."""
    measured = _off_cpu(tables, v, steps) if len(steps) else None
    if measured is None or rank not in measured[0].columns:
        return None
    off = measured[0]
    ranks = list(off.columns)
    queued = _excess(tables.by_step("runDelayUs") - _throttled(tables, steps, ranks), rank, steps) - waits_for_cpu(
        tables, v, rank, steps
    )
    return _excess(off, rank, steps) + _excess(tables.by_step("cpuUs"), rank, steps) + max(queued, 0.0)


def cpu_excess(tables: RankTables, rank: int, steps: pd.Index, peers: list[int] | None = None) -> float | None:
    """The rank's typical time per step on a CPU beyond its peers' (its training thread's: what it
    computes more, wherever the run queue delayed it), or beyond those of `peers` (the ranks without
    a cause, where another rank's cause may be CPU time too); None without the counter."""
    s = tables.steps
    # A null counter sums to 0 in a step table: such steps are looked for first.
    if s.empty or "cpuUs" not in s or len(steps) == 0 or s.loc[s["step"].isin(steps), "cpuUs"].isna().any():
        return None
    cpu = tables.by_step("cpuUs")
    return _excess(cpu, rank, steps, peers) if rank in cpu.columns else None


def _excess(table: pd.DataFrame, rank: int, steps: pd.Index, peers: list[int] | None = None) -> float:
    """The median over `steps` (rows) of the rank's value less the median of its peers' (the other
    columns, or `peers`)."""
    if peers is not None:
        theirs = table.reindex(index=steps, columns=peers).median(axis=1).to_numpy(dtype=float)
        return float(np.median(table.reindex(index=steps)[rank].to_numpy(dtype=float) - theirs))
    values = table.reindex(index=steps).to_numpy(dtype=float)
    at = list(table.columns).index(rank)
    return float(np.median(values[:, at] - _others_median(values)[:, at]))


def held_off(
    tables: RankTables, v: WaitVerdict, ranks: list[int], steps: pd.Index, steady: float = STEADY_SHARE
) -> dict[int, Cause]:
    """Of `ranks` (those without a cause of their own; or all, to find the ones their CPU limit
    throttles), each one held off beyond the others as its cause, where it is worth a slow worker
    (MIN_GAP_SHARE of the step, typically) and it is held off longer than they are in STEADY_SHARE
    of the steps. Such a cause holds in every step: a host's stops come in bursts that miss a step
    now and then, and STEADY_SHARE, measured against healthy ranks, is all that the kernel's
    counters need to show (counted again against the confidence as the collectives' noisier wait
    is, hosts that missed a step or two of eight stayed below naming). `steady`: the share of the
    steps, where the collectives name the rank too."""
    measured = _off_cpu(tables, v, steps) if len(ranks) > 1 and len(steps) else None
    if measured is None or not set(ranks) <= set(measured[0].columns):
        return {}
    values = measured[0][ranks].to_numpy(dtype=float)
    theirs = _others_median(values)
    excess = values - theirs
    held = np.sum(excess > 0, axis=0)
    typical = np.median(excess, axis=0)
    throttled = measured[1][ranks].to_numpy(dtype=float)
    throttled_excess = throttled - _others_median(throttled)
    throttled_typical = np.median(throttled_excess, axis=0)
    # A CPU limit's throttling is no noise of the machine (a rank without a limit is never throttled):
    # throttled beyond its peers in at least half of the steps, or at all where its peers never
    # are, its mean excess is what the limit costs it, worth a slow worker from MIN_VOTE_COST of
    # the step, as larger inputs are (its bursts of work overrun the quota in some steps and not in
    # others).
    limit = throttled_excess.mean(axis=0)
    total = throttled.sum(axis=0)
    alone = total.sum() - total <= 0
    by_limit = (limit >= MIN_VOTE_COST * v.stepUs) & ((2 * np.sum(throttled_excess > 0, axis=0) >= len(steps)) | alone)
    stops = _stops(tables, v, ranks, steps, typical, steady)
    stopped = stops.stopped if stops is not None else np.zeros(len(ranks), dtype=bool)
    found = np.flatnonzero(((typical >= MIN_GAP_SHARE * v.stepUs) & (held >= steady * len(steps))) | by_limit | stopped)
    causes = {}
    for i in found:
        if stops is not None and stopped[i] and not by_limit[i]:
            cause = _cause(tables, ranks[i], float(stops.cost[i]), float(stops.mine[i]), float(stops.peers[i]), STOPPED)
            causes[ranks[i]] = cause
            continue
        phase = CPU_LIMIT if by_limit[i] or 2 * throttled_typical[i] >= typical[i] else HELD_OFF
        # Where the stop watch ran on every rank, a host that stops this one shows in it: time held
        # off that the watch does not show for the most part is the rank's own sleeping or blocking
        # (a loaded machine held one of four healthy ranks off 2.5 ms a step beyond its peers over a
        # 3-step capture, its stop watch alike).
        if phase == HELD_OFF and stops is not None and stops.excess[i] < CONFIRMED_SHARE * typical[i]:
            continue
        causes[ranks[i]] = _cause(
            tables,
            ranks[i],
            float(max(typical[i], limit[i])) if by_limit[i] else float(typical[i]),
            float(np.median(values[:, i])),
            float(np.median(theirs[:, i])),
            phase=phase,
        )
    return causes


class _Stops(NamedTuple):
    """Per rank (in the order of `ranks`), from its stop watch."""

    stopped: np.ndarray  # stopped by its host: worth a slow worker, and waited for
    cost: np.ndarray  # what its stops cost the others a step
    mine: np.ndarray  # its typical stopped time a step
    peers: np.ndarray  # the others' typical stopped time a step
    excess: np.ndarray  # its typical stopped time beyond theirs


def _stops(
    tables: RankTables, v: WaitVerdict, ranks: list[int], steps: pd.Index, typical: np.ndarray, steady: float
) -> _Stops | None:
    """Of `ranks`, those whose process its host stops (StepRow.stoppedUs: the agent's stop watch)
    beyond the others' by MIN_GAP_SHARE of the step in `steady` of the steps, and whom the others
    wait for, MIN_VOTE_COST of the step or more, with what each costs and its stopped time beside
    the others'. None without the counter on every rank. No
    machine's load stops a process (the stop watch's wait for a CPU is taken out: healthy ranks of
    four on two loaded cores were stopped 0.1-0.3 ms of every 10 ms, a rank a process stops 6 of
    every 10 ms 4.8-5.4 ms), so its counter needs no more steps than the held-off rule; but most of
    a stop may fall into the rank's sleeps or its wait for its peers, where it costs nothing: what
    it costs is its time held off outside the collectives or, where that is less, the others' wait
    for it (their median less its own), at most its stopped time."""
    s = tables.steps
    # A null counter sums to 0 in a step table: such steps are looked for first.
    if (
        s.empty
        or "stoppedUs" not in s
        or s.loc[s["step"].isin(steps) & s["rank"].isin(ranks), "stoppedUs"].isna().any()
    ):
        return None
    stopped = tables.by_step("stoppedUs").reindex(index=steps, columns=ranks)
    if stopped.isna().to_numpy().any():
        return None
    values = stopped.to_numpy(dtype=float)
    theirs = _others_median(values)
    excess = values - theirs
    waits = v.perStepUs.reindex(index=steps, columns=ranks).to_numpy(dtype=float)
    gaps = np.median(_others_median(waits) - waits, axis=0)
    cost = np.minimum(np.maximum(typical, gaps), np.median(excess, axis=0))
    held = np.sum(excess >= MIN_GAP_SHARE * v.stepUs, axis=0) >= steady * len(steps)
    return _Stops(
        held & (cost >= MIN_VOTE_COST * v.stepUs),
        cost,
        np.median(values, axis=0),
        np.median(theirs, axis=0),
        np.median(excess, axis=0),
    )


def _cause(tables: RankTables, rank: int, typical: float, mine: float, peers: float, phase: str) -> Cause:
    known, same = main_work_alike(tables, rank)
    work = (
        "the same operators with the same shapes as its peers"
        if known and same
        else "operators whose input shapes were not recorded"
        if not known
        else "its main operators with other shapes than its peers'"
    )
    return Cause(
        frame="",
        inner="",
        phase=phase,
        excessUsPerStep=typical,
        usPerStep=mine,
        peersUsPerStep=peers,
        callsPerStep=0.0,
        kind="host",
        detail=(
            f"its container's CPU limit throttles its training thread {ms(typical)}/step more than its peers' "
            f"(its cgroup's cpu.stat), raise or remove the limit; it runs {work} ({ms(mine)} vs {ms(peers)} a "
            "step of sleep, stops and throttling, its collectives apart)"
            if phase == CPU_LIMIT
            else f"its host stops its process {ms(mine)} a step, its peers' {ms(peers)} (the agent's stop watch), "
            f"while it runs {work}, which costs the others {ms(typical)}/step: a paused or frozen container, or a "
            "process that stops it"
            if phase == STOPPED
            else f"its training thread is held off the CPU {ms(typical)}/step more than its peers' while it runs "
            f"{work} ({ms(mine)} vs {ms(peers)} neither running nor waiting for a CPU, its collectives apart): its "
            "host stops it (a paused or frozen container, a process that stops it, memory reclaim)"
        ),
    )
