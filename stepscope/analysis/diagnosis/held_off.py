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
from stepscope.analysis.diagnosis.slow_workers import MIN_GAP_SHARE, MIN_VOTE_COST, NOISE_BAND, WaitVerdict
from stepscope.analysis.diagnosis.wording import ms

# The phase of a cause told by these counters.
HELD_OFF = "held off the CPU"
# The share of the steps in which a rank held off longer than its peers is a cause. Healthy ranks
# of one job fall on either side of each other from step to step (up to 6 of 8 steps one way, the
# typical difference within 2 % of the step); a host that stops a rank shows in at least this many.
STEADY_SHARE = 0.75


def _off_cpu(tables: RankTables, v: WaitVerdict, steps: pd.Index) -> pd.DataFrame | None:
    """Each step's (rows) time off the CPU and out of the run queue, outside collectives, by rank
    (columns); None where a rank's trace has no scheduler counters for a step."""
    s = tables.steps
    if s.empty or "cpuUs" not in s or "runDelayUs" not in s:
        return None
    s = s[s["step"].isin(steps) & s["rank"].isin(v.perStepUs.columns)]
    if s[["cpuUs", "runDelayUs"]].isna().to_numpy().any():
        return None

    def pivot(column: str) -> pd.DataFrame:
        return s.pivot_table(index="step", columns="rank", values=column, aggfunc="sum").reindex(
            index=steps, columns=v.perStepUs.columns
        )

    off = pivot("durationUs") - v.perStepUs.reindex(index=steps) - pivot("cpuUs") - pivot("runDelayUs")
    return None if off.isna().to_numpy().any() else off


def held_off(
    tables: RankTables, v: WaitVerdict, rank: int, reference: list[int], steps: pd.Index
) -> tuple[Cause, int] | None:
    """The rank's time held off the CPU beyond the `reference` ranks' (those without a cause of their
    own) as its cause, with the steps that show it, where it is worth a slow worker (MIN_GAP_SHARE
    of the step, typically) and the rank is held off longer than they are in STEADY_SHARE of the
    steps; else None. A host's stops come in bursts that miss a step now and then; where even the
    bottom of the excess's noise band is worth acting on (MIN_VOTE_COST of the step), every step
    shows it."""
    off = _off_cpu(tables, v, steps) if reference and len(steps) else None
    if off is None:
        return None
    theirs = off[reference].median(axis=1).to_numpy(dtype=float)
    excess = off[rank].to_numpy(dtype=float) - theirs
    held = int(np.sum(excess > 0))
    typical = float(np.median(excess))
    if typical < MIN_GAP_SHARE * v.stepUs or held < STEADY_SHARE * len(steps):
        return None
    error = float(excess.std(ddof=1) / np.sqrt(len(excess))) if len(excess) > 1 else float("inf")
    if float(excess.mean()) - NOISE_BAND * error >= MIN_VOTE_COST * v.stepUs:
        held = len(steps)
    known, same = main_work_alike(tables, rank)
    work = (
        "the same operators with the same shapes as its peers"
        if known and same
        else "operators whose input shapes were not recorded"
        if not known
        else "its main operators with other shapes than its peers'"
    )
    mine, peers = float(np.median(off[rank])), float(np.median(theirs))
    cause = Cause(
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
    return cause, held
