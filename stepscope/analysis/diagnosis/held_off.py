"""Time a rank's training thread spent off the CPU and out of the run queue, against its peers': a
host that stops or throttles the rank (a CPU quota, a paused container, a node slowed by its
hypervisor) takes that time from all of its work, a little from every frame and operator, so no
one of them carries it. The kernel's counters (StepRow.cpuUs, runDelayUs: Linux schedstat, which
the agent records at each captured step boundary) tell it apart from a machine whose ranks share
its CPUs, whose time goes to the run queue instead: each step's time less the rank's collectives
(its wait for its peers), its time on a CPU and its time waiting for one is what it slept, blocked
in I/O or locks, or was held off. The same work on every rank sleeps and blocks alike (29-30 ms a
step on every healthy rank of the benchmark's job, within 1.5 ms of each other), so what one rank
is held off beyond that is its own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.causes import Cause
from stepscope.analysis.diagnosis.operator_time import main_work_alike
from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.diagnosis.slow_workers import MIN_GAP_SHARE, WaitVerdict
from stepscope.analysis.diagnosis.wording import ms

# The phase of a cause told by these counters.
HELD_OFF = "held off the CPU"
# The share of the steps in which a rank held off longer than its peers is a cause. Healthy ranks
# of one job fall on either side of each other from step to step (7 of 8 steps one way in 14 of
# 447 healthy ranks of the benchmark, their typical difference within -3.8..+4.1 % of the step: the
# 5 % floor keeps them apart); a host that stops a rank shows in at least this many.
STEADY_SHARE = 0.75


def _off_cpu(tables: RankTables, v: WaitVerdict, steps: pd.Index) -> pd.DataFrame | None:
    """Each step's (rows) time off the CPU and out of the run queue, outside collectives, by rank
    (columns); None where a rank's trace has no scheduler counters for a step."""
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

    off = pivot("durationUs") - v.perStepUs.reindex(index=steps) - pivot("cpuUs") - pivot("runDelayUs")
    return None if off.isna().to_numpy().any() else off


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


def held_off(tables: RankTables, v: WaitVerdict, ranks: list[int], steps: pd.Index) -> dict[int, Cause]:
    """Of `ranks` (those without a cause of their own), each one held off the CPU beyond the others
    as its cause, where it is worth a slow worker (MIN_GAP_SHARE of the step, typically) and it is
    held off longer than they are in STEADY_SHARE of the steps. Such a cause holds in every step:
    a host's stops come in bursts that miss a step now and then, and STEADY_SHARE, measured against
    healthy ranks, is all that the kernel's counters need to show (counted again against the
    confidence as the collectives' noisier wait is, hosts that missed a step or two of eight stayed
    below naming)."""
    off = _off_cpu(tables, v, steps) if len(ranks) > 1 and len(steps) else None
    if off is None or not set(ranks) <= set(off.columns):
        return {}
    values = off[ranks].to_numpy(dtype=float)
    theirs = _others_median(values)
    excess = values - theirs
    held = np.sum(excess > 0, axis=0)
    typical = np.median(excess, axis=0)
    found = np.flatnonzero((typical >= MIN_GAP_SHARE * v.stepUs) & (held >= STEADY_SHARE * len(steps)))
    return {
        ranks[i]: _cause(
            tables, ranks[i], float(typical[i]), float(np.median(values[:, i])), float(np.median(theirs[:, i]))
        )
        for i in found
    }


def _cause(tables: RankTables, rank: int, typical: float, mine: float, peers: float) -> Cause:
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
        phase=HELD_OFF,
        excessUsPerStep=typical,
        usPerStep=mine,
        peersUsPerStep=peers,
        callsPerStep=0.0,
        kind="host",
        detail=(
            f"its training thread is held off the CPU {ms(typical)}/step more than its peers' while it runs {work} "
            f"({ms(mine)} vs {ms(peers)} neither running nor waiting for a CPU, its collectives apart): its host "
            "stops or throttles it (a CPU quota, a paused container, a slower node)"
        ),
    )
