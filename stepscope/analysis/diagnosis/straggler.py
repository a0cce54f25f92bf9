"""Which rank holds a synchronous job back, why, and how sure that is.

Two kinds of evidence, each from every step that all ranks captured:
- waiting (slow_workers.wait_verdict): the rank that waits least in collectives is the one the
  others wait for; the gap is what it costs them. On a loaded machine a collective's own time
  varies by more than a modest slowdown, so this alone can miss one or point at a hiccup;
- a cause (causes.py): a frame on a rank's training thread whose time exceeds its peers' in every
  step. A hiccup (a descheduled process) inflates one call in one step; a cause repeats.

They are weighed into a confidence (0..1). The rank is named when the evidence agrees and the
confidence reaches slow_workers.CONFIDENT; when the evidence is there but does not agree or is too
thin, the diagnosis says it cannot tell and what to capture instead; no evidence, no slow rank.
Beside a named rank, further ones are those with a cause of their own that the ranks without one
wait for, and those that would hold the job back without the named rank's cause: the job judged
again on its other ranks, against the step it would take without that cause.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.causes import (
    BACKWARD,
    OWN_SHARE,
    Cause,
    find_cause,
    frame_per_step,
    frames,
    thread_cause,
    thread_per_step,
)
from stepscope.analysis.diagnosis.held_off import (
    CPU_LIMIT,
    HELD_OFF,
    HOST_PHASES,
    STOPPED,
    cpu_excess,
    held_off,
    host_time,
    waits_for_cpu,
)
from stepscope.analysis.diagnosis.operator_time import OPERATOR_RATIO, OperatorCause, operator_cause
from stepscope.analysis.diagnosis.patterns import QUIET, intermittent
from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.diagnosis.slow_workers import (
    CONFIDENT,
    DOUBT,
    MIN_GAP_SHARE,
    MIN_VOTE_COST,
    NOISE_BAND,
    WaitVerdict,
    wait_verdict,
)
from stepscope.analysis.diagnosis.wording import ms

# A cause holds in a step when its excess there is at least this share of its median excess per
# step (not the mean: one step in which the process was descheduled inflates the mean, and the
# cause's ordinary steps then looked too small to hold).
STEADY = 0.5
# A gap of this share of the step (or more) is as strong as waiting evidence gets...
FULL_GAP = 0.25
# ... and this many steps that all show it, as strong as repetition gets: a loaded machine held a
# healthy rank back by 12 % of the step in all 4 steps of a capture (its data loader, 3 ms a step,
# benchmarks/diagnosis_accuracy.py), as much as the `modest` fault costs; 8 steps rarely do that.
# Also the steps that the waiting alone needs to name a rank no frame explains: a loaded machine
# can deschedule a healthy rank for a few hundred ms, slowing everything it does a little.
FULL_STEPS = 8
# Steps to ask for when a capture could not tell who holds the job back (at least; see more_steps).
MORE_STEPS = 2 * FULL_STEPS
# torch's own code: a frame there (forward, backward, a module's call) is stretched by slower
# operators rather than the cause itself.
TORCH_CODE = r"(?:^|[\\/])torch[\\/]|^nn\.Module: |^<built-in|^<method "
# The phase of an operators cause whose inputs are larger than its peers' (uneven shards or batches).
LARGER_INPUTS = "larger inputs"
# Operators slower with the same shapes are work that every rank does and that the machine's load
# stretches on any of them, unlike a frame of the rank's own: its peers' wait must show them within
# one standard error rather than NOISE_BAND of them. A slower host stretches all of the rank's work,
# so its peers wait at least its operators' excess (the benchmark's 58 slower hosts named so: the
# gap's mean plus one standard error 0.93-3.2 times it); a healthy rank whose operators a loaded
# machine stretched 1.7x kept its peers waiting 0.29 of it by that measure, 0.51 by NOISE_BAND's.
SAME_WORK_BAND = 1.0
# ... and the rank's own counters must show at least this share of their excess (held_off.host_time):
# a slower host's time is its own (the benchmark's 65 slower hosts named so: 0.83-2.3 times the
# excess), while the run-queue time of a machine whose ranks share its CPUs lands in one rank's
# operators in one capture and in another's in the next (six healthy ranks named, or the likeliest,
# so on a loaded 2-core machine: 0.27 at most).
HOST_SHARE = 0.5


@dataclass
class Straggler:
    rank: int | None  # the rank named, or the likeliest one when unsure; None: no evidence
    named: bool  # confident enough to name it
    cause: Cause | None
    confidence: float
    gapUsPerStep: float  # its peers' wait for it per step (from the collectives; may be ~0)
    costUsPerStep: float  # what it costs the others per step: the larger of gap and cause excess
    stepUs: float
    steps: int  # steps every rank captured
    steadySteps: int  # steps in which the evidence for it holds
    waitNames: int | None  # the rank the waiting evidence alone points at
    askSteps: int = 0  # steps to capture to know, where the evidence itself asks for more than more_steps
    # Further ranks that hold the others back, each with its own cause, largest cost first (their
    # costUsPerStep: the cause's excess, a thread's: its peers' wait for it; no more than the named
    # rank's).
    others: list[Straggler] = field(default_factory=list)


def _steady(
    tables: RankTables, exploded: pd.DataFrame, rank: int, cause: Cause, steps: pd.Index, step_us: float
) -> int | None:
    """Steps (of `steps`) in which `cause` puts `rank` above its peers; None without per-step times."""
    table = frame_per_step(tables, exploded, cause.frame, steps)
    if table is None:
        return None
    mine = table[rank].to_numpy(dtype=float)
    peers = table.drop(columns=[rank])
    excess = mine - peers.median(axis=1).to_numpy(dtype=float)
    typical, floor = float(np.median(excess)), MIN_GAP_SHARE * step_us
    # The floor is for frames its peers run too, which a busy machine stretches on every rank. A
    # frame no peer runs has no such noise to rise above, but its own time swings with the load
    # (5-22 ms a step for a 5 ms function at load 18): half of the smaller of the two will do.
    shared = float(peers.to_numpy().max(initial=0.0)) > 0
    need = max(STEADY * typical, floor) if shared else STEADY * min(typical, floor)
    return int(np.sum((excess >= need) & (excess > 0)))


def _backward_per_step(tables: RankTables, exploded: pd.DataFrame, steps: pd.Index) -> pd.DataFrame | None:
    """Each step's time in backward (rows) by rank (columns). Where no rank's cause is in backward,
    the ranks do the same backward work, and what one spends there beyond another is DDP's wait
    for the gradients' all-reduce: the collectives' time on the backend's threads misses part of it."""
    names = exploded.loc[exploded["frame"].str.contains(BACKWARD), "frame"].unique()
    return None if len(names) == 0 else frame_per_step(tables, exploded, str(names[0]), steps)


def _slower_host(cause: Cause) -> bool:
    """Operators slower than its peers' with the same shapes (not larger inputs): a slower host."""
    return cause.kind == "operators" and cause.phase != LARGER_INPUTS


def _user_frame(cause: Cause) -> bool:
    """A function of the program's own (not torch's, not a built-in): its operators are its work."""
    return cause.kind == "function" and not cause.inner == cause.frame and not re.search(TORCH_CODE, cause.frame)


def _operators(ops: OperatorCause) -> Cause:
    return Cause(
        frame=ops.operator,
        inner="",
        phase=LARGER_INPUTS if ops.larger else "operators",
        excessUsPerStep=ops.costUsPerStep,
        usPerStep=ops.usPerStep,
        peersUsPerStep=ops.peersUsPerStep,
        callsPerStep=0.0,
        kind="operators",
        detail=ops.text(),
    )


def _best_cause(
    tables: RankTables,
    exploded: pd.DataFrame,
    rank: int,
    steps: pd.Index,
    sampled: frozenset[int],
    waits_more: bool = False,
) -> Cause | None:
    """The rank's cause of the three kinds: a function on its training thread, its operators (longer
    than its peers', with the same or larger shapes), or a background thread running Python. A
    function of the program's own that runs operators its peers do not run stays the cause; torch's
    own frames (forward, backward) that the operators stretch give way to them, and so does any
    frame where the same operators with the same shapes as on its peers carry half of its excess
    (a slower host stretches every frame of the rank, the training loop's too). Any function on
    the training thread gives way to a background thread that holds the GIL longer than it takes.
    `waits_more`: the rank waits longer than its peers, so what it spends in backward beyond theirs
    is DDP's wait there for a slower rank, whatever its size: larger inputs are its own cause."""
    cause = find_cause(tables, rank, exploded, sampled)
    ops = operator_cause(tables, rank, steps)
    carries = (
        ops is not None and ops.shapesKnown and cause is not None and ops.excessUsPerStep >= 0.5 * cause.excessUsPerStep
    )
    same = carries and ops is not None and ops.sameShapes
    # Larger inputs stretch torch's frames that run them (a module's forward, with the Python that
    # dispatches each operator; the DataLoader that collates a larger batch) as a slower host does,
    # whatever part of that their operators carry where the inputs are to the main work...
    stretched = (
        ops is not None
        and cause is not None
        and ops.larger
        and not _user_frame(cause)
        and (carries or ops.mainWork or (waits_more and cause.phase == "backward"))
    )
    # ... and the program's own per-sample functions (its Dataset's __getitem__), by less than they
    # stretch the operators.
    if ops is not None and (
        cause is None
        or same
        or stretched
        or ((not _user_frame(cause) or ops.larger) and ops.excessUsPerStep >= cause.excessUsPerStep)
    ):
        cause = _operators(ops)
    thread = thread_cause(tables, rank)
    if thread is not None and (cause is None or thread.excessUsPerStep >= cause.excessUsPerStep):
        cause = thread
    # Larger inputs that are its cause cost what the rank computes more, where its counters say so;
    # chosen first by their operators alone (its CPU time would count a function's work too).
    if cause is not None and cause.phase == LARGER_INPUTS and ops is not None:
        on_cpu = cpu_excess(tables, rank, steps)
        if on_cpu is not None and on_cpu > ops.excessUsPerStep:
            cause = _operators(dataclasses.replace(ops, cpuExcessUsPerStep=on_cpu))
    return cause


def _thread_in_every_step(tables: RankTables, rank: int, cause: Cause, steps: pd.Index, step_us: float) -> bool:
    """A background thread's Python time that is the rank's own (its peers' threads of the same
    function run next to none of it) and that holds in every step (STEADY of its median excess, or
    MIN_GAP_SHARE of the step where that is less: a thread whose period does not divide the step
    runs one burst in some steps and two in others, half of its median; all but one step of more
    than three): evidence that does not need the collectives, whose gap is a fraction of the
    thread's time where the training thread spends much of its step without the GIL (sleeping, in
    I/O) and swings with the machine's load."""
    table = thread_per_step(tables, cause.frame, steps)
    if cause.kind != "thread" or table is None or cause.peersUsPerStep > OWN_SHARE * cause.excessUsPerStep:
        return False
    excess = table[rank].to_numpy(dtype=float) - table.drop(columns=[rank]).median(axis=1).to_numpy(dtype=float)
    need = min(STEADY * float(np.median(excess)), MIN_GAP_SHARE * step_us)
    holds = int(np.sum((excess > 0) & (excess >= need)))
    return holds == len(steps) or (len(steps) > 3 and holds >= len(steps) - 1)


def _slow_host(tables: RankTables, v: WaitVerdict, steps: pd.Index) -> tuple[Cause, int] | None:
    """The waiting rank's operators as its cause, with the steps that show it, where its peers wait
    longer than it does in at least half of the steps and its operators run OPERATOR_RATIO times its
    peers' with the same shapes in at least half of them: a slower host or device stretches all of
    the rank's work, its Python between the operators too, so the operators' own excess is a part
    of the gap, and the gap (not that part) is what the rank costs its peers. Each step tells only
    which side of its peers the rank falls on: the mean gap (the verdict's, MIN_GAP_SHARE of the
    step) says how much, and with more ranks on a loaded machine a step rarely leaves one rank alone
    by that much (WaitVerdict.agreeing). A host slower at everything stretches its operators at
    least by their share of its peers' own time (the step less their wait, sleeps included) times
    the gap: operators whose typical excess falls short of that swing with the machine's load,
    while something else (the load itself, on a rank the scheduler favours less) holds it back.
    The time the rank waited for the CPUs it shares with peers on its node (waits_for_cpu) is
    neither: the gap without it must still be worth acting on, and the operators' excess without
    it reach the stretch. A slower host also stands apart from its peers (_stands_apart)."""
    if v.rank is None:
        return None
    peers = v.perStepUs.drop(columns=[v.rank])
    waited = _waited_steps(v, v.rank)
    ops = operator_cause(tables, v.rank, steps)
    if (
        not _stands_apart(v, v.rank)
        or 2 * waited < v.steps
        or ops is None
        or not (ops.sameShapes and ops.shapesKnown)
        or ops.ratio < OPERATOR_RATIO
        or 2 * _steady_operators(tables, v.rank, steps) < len(steps)
        or not _host_shows(tables, v, v.rank, steps, ops.excessUsPerStep)
    ):
        return None
    durations = tables.by_step("durationUs").reindex(index=steps, columns=peers.columns)
    own_us = float(np.median((durations - peers).median(axis=1)))
    shared_cpus = waits_for_cpu(tables, v, v.rank, steps)
    if v.gapUsPerStep - shared_cpus < MIN_GAP_SHARE * v.stepUs:
        return None
    if own_us <= 0 or ops.excessUsPerStep - shared_cpus < ops.peersUsPerStep / own_us * v.gapUsPerStep:
        return None
    return _operators(ops), waited


def _waited_for(mean: float, error: float, excess: float, band: float = NOISE_BAND) -> bool:
    """Whether a rank's peers wait for it, a gap of `mean` with standard error `error`, for at
    least half of what its cause costs (`excess`), within `band` standard errors: a collective's
    own time swings by more than a modest cause from step to step."""
    return mean > 0 and mean + band * error >= 0.5 * excess


def _held_off_waited(tables: RankTables, v: WaitVerdict, steps: pd.Index) -> tuple[Cause, int] | None:
    """The waiting rank held off the CPU beyond its peers as its cause, with the steps its peers wait
    for it, where the collectives name it in at least half of the steps and its held-off time is at
    least HOST_SHARE of their gap: two kinds of evidence, each of half of the steps or more, as for a
    slower host's operators (a host that stops a rank 5 of every 10 ms missed 3 of 8 steps beyond
    its peers, in bursts, on a loaded machine: the held-off rule alone asks for STEADY_SHARE). Of
    two ranks, only where the stop watch says its host stops it: of a pair, the one a loaded machine
    holds off longer arrives later, and each is the other's only peer."""
    if v.rank is None or 2 * v.agreeing < v.steps:
        return None
    cause = held_off(tables, v, list(v.waitUs), steps, steady=0.5).get(v.rank)
    if cause is None or cause.excessUsPerStep < HOST_SHARE * v.gapUsPerStep:
        return None
    if len(v.waitUs) < 3 and cause.phase != STOPPED:
        return None
    return cause, _waited_steps(v, v.rank)


def _waited_steps(v: WaitVerdict, rank: int) -> int:
    """The steps in which the rank's peers (their median) wait longer than it does."""
    peers = v.perStepUs.drop(columns=[rank]).median(axis=1).to_numpy(dtype=float)
    return int(np.sum(peers > v.perStepUs[rank].to_numpy(dtype=float)))


def _host_shows(tables: RankTables, v: WaitVerdict, rank: int, steps: pd.Index, excess: float) -> bool:
    """Whether the rank's counters show its slower operators' `excess` as its own time (HOST_SHARE);
    without counters, nothing says otherwise."""
    own = host_time(tables, v, rank, steps)
    return own is None or own >= HOST_SHARE * excess


def _computes_larger_inputs(tables: RankTables, rank: int, cause: Cause, steps: pd.Index, healthy: list[int]) -> bool:
    """Larger inputs whose cost its training thread's CPU time beyond the ranks without a cause shows
    (at least half of it)."""
    if cause.phase != LARGER_INPUTS:
        return False
    on_cpu = cpu_excess(tables, rank, steps, healthy)
    return on_cpu is not None and on_cpu >= 0.5 * cause.excessUsPerStep


def _stands_apart(v: WaitVerdict, rank: int) -> bool:
    """Whether the rank's peers wait longer for it than they differ among themselves in their mean
    wait (twice their median absolute deviation: the difference of two peers). A slower host stands
    apart from peers that agree; where they differ as much, the machine's scheduler spreads its
    ranks unevenly, one faster, one slower, and no one host is slower than the others."""
    means = v.perStepUs.drop(columns=[rank]).mean(axis=0).to_numpy(dtype=float)
    spread = 2 * float(np.median(np.abs(means - np.median(means))))
    return float(np.median(means)) - float(v.perStepUs[rank].mean()) > spread


def _sure_steps(v: WaitVerdict, waited: int) -> int:
    """The steps that a slow host's waiting evidence weighs as: each step tells only which side of
    its peers the rank falls on, and a loaded machine puts a healthy rank on the wrong side in a
    few; together, the gap's mean and standard error over the steps say how sure it is that its
    peers wait for it. Where even the bottom of the gap's noise band (NOISE_BAND standard errors
    below its mean) is worth acting on (MIN_VOTE_COST of the step), the steps show it as one, all
    of them; else those in which its peers wait longer than it does (`waited`)."""
    assert v.rank is not None
    mean, error = v.gap_band(v.rank)
    return v.steps if mean - NOISE_BAND * error >= MIN_VOTE_COST * v.stepUs else waited


def _steady_operators(tables: RankTables, rank: int, steps: pd.Index) -> int:
    """Steps in which the rank's operators take longer than its peers'. A busy machine stretches
    a step's operators by as much as a slower host does (one rank's operator time per step swung
    7-37 ms on 2 loaded cores), so each step only tells which side it falls on; the typical excess
    (operator_time) says how much."""
    per_step = tables.per_step_of(tables.operators, steps)
    excess = per_step[rank].to_numpy(dtype=float) - per_step.drop(columns=[rank]).median(axis=1).to_numpy(dtype=float)
    return int(np.sum(excess > 0))


def _steady_or_pattern(
    tables: RankTables, exploded: pd.DataFrame, rank: int, cause: Cause, steps: pd.Index, step_us: float
) -> tuple[int | None, Cause]:
    """Steps that show a function cause, and the cause with its pattern where it shows in some
    steps only but in a pattern (every Nth step): such a cause holds in every step, as its pattern
    says, and is told with the time of the steps it hits against the others'."""
    if cause.kind == "operators":
        # Larger inputs are in the shapes of every step, which no load of the machine changes: the
        # typical excess says what they cost, and the steps in which the load slowed a peer's
        # operators as much do not make them any less the rank's own work.
        if cause.phase == LARGER_INPUTS:
            return len(steps), cause
        slower = _steady_operators(tables, rank, steps)
        # One step of more than three the other way is the machine's noise, not a faster rank.
        return (len(steps) if len(steps) > 3 and slower >= len(steps) - 1 else slower), cause
    if cause.kind != "function":
        return len(steps), cause
    steady = _steady(tables, exploded, rank, cause, steps, step_us)
    table = frame_per_step(tables, exploded, cause.frame, steps)
    if steady is None or steady == len(steps) or table is None:
        return steady, cause
    excess = table[rank].to_numpy(dtype=float) - table.drop(columns=[rank]).median(axis=1).to_numpy(dtype=float)
    found = intermittent(excess, steps.to_numpy(), MIN_GAP_SHARE * step_us)
    if found is None:
        return steady, cause
    durations = tables.by_step("durationUs").reindex(steps).median(axis=1)
    hit, rest = float(durations[found.hits].mean()), float(durations[~found.hits].mean())
    # A cost of its pattern lengthens the steps it hits (its peers wait for it there): hit steps
    # that take no longer (by STEADY of their excess) than the others are the machine's noise
    # falling into a period by chance, which the job did not wait for.
    if hit - rest < STEADY * float(excess[found.hits].mean()):
        return steady, cause
    detail = (
        f"{found.text()} it spends {ms(float(excess[found.hits].mean()))} more than its peers in {cause.text()} "
        f"({ms(cause.excessUsPerStep)}/step on average); those steps take {ms(hit)}, the others {ms(rest)}"
    )
    return (len(steps) if found.period is not None else int(found.hits.sum())), dataclasses.replace(
        cause, pattern=found.text(), detail=detail
    )


def _candidates(
    tables: RankTables, exploded: pd.DataFrame, v: WaitVerdict, steps: pd.Index, sampled: frozenset[int] = frozenset()
) -> list[tuple[int, Cause, int, bool]]:
    """Ranks with a cause worth a slow worker that holds in every step (or in its pattern): (rank,
    cause, steady steps, contested). Contested: the rank waits more than its peers, which says it
    is not the one they wait for - unless a few noisy collectives (a rank descheduled in one of
    four steps) outweigh a cause that holds in every step; it can then be no more than the likeliest."""
    out = []
    for rank in v.waitUs:
        contested = -v.gap(rank) >= MIN_GAP_SHARE * v.stepUs
        cause = _best_cause(tables, exploded, rank, steps, sampled, waits_more=contested)
        # MIN_GAP_SHARE is a floor against the machine's noise, which larger inputs (shapes that
        # replace its peers') are not: for them the floor is what is worth acting on.
        floor = MIN_VOTE_COST if cause is not None and cause.phase == LARGER_INPUTS else MIN_GAP_SHARE
        if cause is None or cause.excessUsPerStep < floor * v.stepUs:
            continue
        # Operators slower than its peers' (not larger inputs) say its host is slower: so must its
        # peers' waits, the operators' excess without the time the rank waited for the CPUs of its
        # node, and its own counters.
        if _slower_host(cause) and (
            not _stands_apart(v, rank)
            or cause.excessUsPerStep - waits_for_cpu(tables, v, rank, steps) < floor * v.stepUs
            or not _host_shows(tables, v, rank, steps, cause.excessUsPerStep)
        ):
            continue
        # What looks like extra time in backward on a rank that waits more is its wait there (DDP
        # waits for the gradients inside backward): no cause.
        if contested and cause.phase == "backward":
            continue
        steady, cause = _steady_or_pattern(tables, exploded, rank, cause, steps, v.stepUs)
        # A sampled rank's time in a frame per step is an estimate from a few samples, which
        # swings from step to step: half of the steps will do, and the confidence says how many.
        if steady is None or steady == len(steps) or (rank in sampled and 2 * steady >= len(steps)):
            out.append((rank, cause, len(steps) if steady is None else steady, contested))
    return sorted(out, key=lambda c: (c[3], -c[1].excessUsPerStep))


def confidence(share: float, steady: int, steps: int, explained: float, agrees: bool) -> float:
    """0..1 from the cost's share of the step, the share of the cost a cause explains, whether
    the waiting evidence names the same rank, and the steps that show it. A busy machine can slow
    one rank for a few steps; a cause repeats, and the smaller it is, the more steps it takes to
    tell the two apart: a cost of FULL_GAP or more is as sure as it gets from FULL_STEPS / 2 steps
    (two of them weigh 3/4), the smallest from FULL_STEPS (four of them weigh 3/4)."""
    if steps <= 0:
        return 0.0
    strength = min(1.0, share / FULL_GAP)
    base = 0.35 + 0.35 * strength + 0.3 * min(1.0, max(explained, 0.0))
    base *= steady / steps
    base *= 1.0 if agrees else 0.7
    enough = FULL_STEPS * (1.0 - 0.5 * strength)
    return round(base * (0.5 + 0.5 * min(1.0, steady / enough)), 2)


def _others(
    tables: RankTables, v: WaitVerdict, candidates: list[tuple[int, Cause, int, bool]], comparable: bool
) -> list[Straggler]:
    """Candidates beyond the first that hold the others back too: each with its own cause in every
    step, and (where the ranks' collectives can be compared) the ranks without a cause waiting for
    it, within their noise, at least half of what its cause costs. A rank the first one holds back
    waits for it too, so its peers' wait for it is measured against the ranks without a cause."""
    slow = {c[0] for c in candidates}
    healthy = [r for r in v.waitUs if r not in slow]
    out = []
    for rank, cause, steady, contested in candidates[1:]:
        cost = cause.excessUsPerStep
        if contested and not comparable:
            continue
        if comparable:
            if not healthy:
                continue
            gaps = v.perStepUs[healthy].median(axis=1).to_numpy(dtype=float) - v.perStepUs[rank].to_numpy(dtype=float)
            error = float(gaps.std(ddof=1) / np.sqrt(len(gaps))) if len(gaps) > 1 else float("inf")
            mean = float(gaps.mean())
            # Contested against the ranks without a cause, not against all of its peers: beside the
            # first rank, which waits least, the median of its peers' waits is no healthy rank's.
            if -mean >= MIN_GAP_SHARE * v.stepUs:
                continue
            # A thread of its own in every step needs no more than that its peers wait for it at
            # all (as for the first rank), and costs them what they wait, not its thread's time.
            if mean > 0 and _thread_in_every_step(tables, rank, cause, v.commonSteps, v.stepUs):
                cost = min(cost, mean)
            # Throttled by its CPU limit, or computing its larger inputs, it holds the others back
            # by that time once the first rank's cause is gone, whatever they wait for it now (the
            # first one's larger cost may hide it, and a shared machine's run queue moves its
            # arrival by more than that from capture to capture): the kernel's counters need no
            # collectives. Held off the CPU is no such count: its stops before the collectives
            # delay its arrival, so the ranks without a cause wait for it (twice as long as it was
            # held off on the benchmark's hosts stopped 5-6 of every 10 ms beside a slower rank,
            # its mean more than its held-off time; where a loaded machine held one of two healthy
            # ranks off 4.6-5.3 ms a step longer than the other, the other waited no longer).
            elif (
                cause.phase != CPU_LIMIT
                and not _computes_larger_inputs(tables, rank, cause, v.commonSteps, healthy)
                and not _waited_for(mean, error, cause.excessUsPerStep)
            ):
                continue
        conf = confidence(cause.excessUsPerStep / v.stepUs if v.stepUs else 0.0, steady, v.steps, 1.0, True)
        if conf >= CONFIDENT:
            out.append(
                Straggler(
                    rank=rank,
                    named=True,
                    cause=cause,
                    confidence=conf,
                    gapUsPerStep=0.0,
                    costUsPerStep=cost,
                    stepUs=v.stepUs,
                    steps=v.steps,
                    steadySteps=steady,
                    waitNames=v.rank,
                )
            )
    return out


def _step_without(tables: RankTables, v: WaitVerdict, rank: int) -> float:
    """The job's typical step without `rank`'s cause: each step less what the other ranks waited
    for it beyond its own time in the collectives (the last of them to arrive waited least), so
    that a cause of some steps only leaves the others as they are."""
    waits = v.perStepUs
    others = waits.drop(columns=[rank])
    durations = tables.by_step("durationUs").reindex(index=waits.index, columns=others.columns)
    saved = (others.min(axis=1) - waits[rank]).clip(lower=0.0)
    return float(np.median((durations.median(axis=1) - saved).to_numpy(dtype=float)))


def _also_without(
    tables: RankTables, v: WaitVerdict, rank: int, cost: float, sampled: frozenset[int], others: list[Straggler]
) -> list[Straggler]:
    """`others`, and the ranks that would hold the job back without the named `rank`'s cause: the
    job judged again on its other ranks, its step less what `rank` costs it (what it would take
    without that cause), so that a second rank's cost is weighed against the step it would hold
    back rather than the one the first rank stretches. Once: the tables are copied less that rank,
    and a third rank is among the second judgement's own further ranks."""
    rest = tables.without([rank])
    step = _step_without(tables, v, rank)
    judged = wait_verdict(rest, step) if step > 0 else None
    if judged is None or len(judged.waitUs) < 2:
        return others
    found = find_straggler(rest, judged, sampled - {rank}, again=False)
    known = {o.rank for o in others}

    # Of two ranks, each is the other's only peer: neither's host can be told to hold it off more
    # than the machine's load does (on a loaded machine one of two healthy ranks stays off the CPU
    # 3-5 ms a step longer than the other in most steps), nor to run its operators slower, unless
    # the stop watch says its host stops it (no load does). Of more, one held off is waited for, as
    # in _others.
    def waited_for(s: Straggler) -> bool:
        assert s.rank is not None and s.cause is not None
        return _waited_for(*judged.gap_band(s.rank), s.cause.excessUsPerStep)

    more = [
        s
        for s in ([found, *found.others] if found.named and found.cause is not None else [])
        if s.cause is not None
        and (len(judged.waitUs) > 2 or not (s.cause.phase == HELD_OFF or _slower_host(s.cause)))
        and (s.cause.phase not in (HELD_OFF, STOPPED) or waited_for(s))
    ]
    added = [dataclasses.replace(s, others=[]) for s in more if s.rank not in known and s.costUsPerStep <= cost]
    return sorted(others + added, key=lambda s: -s.costUsPerStep)


def lost_time_shares(costs: dict[int, float], lost: float) -> dict[int, float]:
    """The job's lost time per step split by rank: a synchronous step waits for its slowest rank, so
    without rank r's cause it loses max(costs) - max(the others'). Each rank's share is its Shapley
    value under that rule (sorted c1 >= c2 >= ...: rank i gets the sum over j >= i of
    (c_j - c_j+1) / j), scaled so that the shares add up to the measured `lost` time."""
    ranks = sorted(costs, key=lambda r: -costs[r])
    c = np.maximum(np.array([costs[r] for r in ranks] + [0.0], dtype=float), 0.0)
    steps = (c[:-1] - c[1:]) / np.arange(1, len(ranks) + 1)
    shares = np.cumsum(steps[::-1])[::-1]
    total = float(shares.sum())
    scale = lost / total if total > 0 else 0.0
    return {r: float(s) * scale for r, s in zip(ranks, shares)}


def find_straggler(
    tables: RankTables, v: WaitVerdict, sampled: frozenset[int] = frozenset(), again: bool = True
) -> Straggler:
    """The rank that holds the job back (or the likeliest one) from the waiting verdict and the
    causes on the training threads, and any further ranks that do too. `sampled`: ranks whose
    stacks the agent sampled; compared with traced ranks, their collectives are not (the tracer's
    own cost stretches the traced ranks' steps, so they seem to wait less than they would).
    `again`: judge the job once more without the named rank (_also_without)."""
    exploded = frames(tables)
    steps = v.commonSteps
    comparable = not sampled or set(v.waitUs) <= set(sampled) or not set(v.waitUs) & set(sampled)
    candidates = _candidates(tables, exploded, v, steps, sampled)
    # Operators slower with the same shapes on a rank that its CPU limit throttles by as much: the
    # limit is why (its cgroup's counters say so; the operators' time says only "a slower host").
    limited = {r: c for r, c in held_off(tables, v, list(v.waitUs), steps).items() if c.phase == CPU_LIMIT}
    candidates = [
        (r, limited[r], steady, contested) if r in limited and _slower_host(cause) else (r, cause, steady, contested)
        for r, cause, steady, contested in candidates
    ]
    # A rank no frame, operator or thread explains may be held off the CPU by its host: measured
    # against the ranks without a cause of their own (a cause's rank may block more, for a GIL its
    # thread holds), a cause of its own too.
    # Contested: it waits longer than those ranks do (a slower rank's peers all wait longer than it).
    healthy = [r for r in v.waitUs if r not in {c[0] for c in candidates}]
    for rank, cause in held_off(tables, v, healthy, steps).items():
        reference = [r for r in healthy if r != rank]
        waits = v.perStepUs[rank].mean() - v.perStepUs[reference].mean(axis=0).median()
        candidates.append((rank, cause, len(steps), waits >= MIN_GAP_SHARE * v.stepUs))
    candidates.sort(key=lambda c: (c[3], -c[1].excessUsPerStep))
    # The collectives measure what a rank costs its peers; a cause's excess is the rank's own time,
    # and a background thread's overlaps the time its training thread runs without the GIL. Where
    # they point at a rank with a cause of its own in at least half of the steps, that rank comes
    # first, and the others are judged beside it.
    first = [c for c in candidates if c[0] == v.rank and not c[3]]
    if first and 2 * v.agreeing >= v.steps:
        candidates = first + [c for c in candidates if c[0] != v.rank]
    if not candidates and v.rank is None:
        hidden = _hidden_inputs(tables, v, steps)
        if hidden is not None:
            return hidden
        return Straggler(
            rank=None,
            named=False,
            cause=None,
            confidence=0.0,
            gapUsPerStep=0.0,
            costUsPerStep=0.0,
            stepUs=v.stepUs,
            steps=v.steps,
            steadySteps=0,
            waitNames=None,
        )
    waiting = confidence(v.share, v.agreeing, v.steps, 0.0, True) if v.rank is not None else 0.0
    if candidates and (not candidates[0][3] or waiting < CONFIDENT):
        rank, cause, steady, contested = candidates[0]
        others = _others(tables, v, candidates, comparable)
        # A second rank with a cause as large, and no slow worker of its own, leaves it open which
        # one the others wait for.
        # (Extra time in backward beside a cause elsewhere is DDP's wait there for that rank.)
        rival = (
            len(candidates) > 1
            and candidates[1][1].excessUsPerStep >= 0.5 * cause.excessUsPerStep
            and v.rank != rank
            and candidates[1][0] not in {o.rank for o in others}
            and (candidates[1][1].phase != "backward" or cause.phase == "backward")
        )
        gap = v.gap(rank)
        cost = max(gap, cause.excessUsPerStep)
        # The collectives agree when they name this rank (its peers wait for it in every step, if
        # less than the cause costs: a busy machine stretches every rank's collectives), or name
        # none but show its peers waiting for it, for half of what the cause costs within their
        # noise: a collective's own time swings by more than a modest cause from step to step. A
        # rank nobody waits for holds no one back.
        # Collectives that point at another rank in fewer than half of the steps (a mean pulled by
        # a few) do not contradict a cause that holds in every step.
        # A background thread that holds the GIL stretches the rank's own backward (autograd and
        # DDP's reducer take the GIL too): its time there beyond its peers' is no wait for them.
        # So does a slower host: its backward is its own work, slower too.
        slower_host = _slower_host(cause)
        own_backward = cause.phase == "backward" or cause.kind == "thread" or slower_host
        mean, error = v.gap_band(rank, None if own_backward else _backward_per_step(tables, exploded, steps))
        waited_for = _waited_for(mean, error, cause.excessUsPerStep, SAME_WORK_BAND if slower_host else NOISE_BAND)
        elsewhere = v.rank is not None and 2 * v.agreeing >= v.steps
        # A thread of its own in every step needs no more from the collectives than that its peers
        # wait for it at all.
        own_thread = (
            mean > 0
            and not elsewhere
            and (cause.phase in HOST_PHASES or _thread_in_every_step(tables, rank, cause, steps, v.stepUs))
        )
        agrees = (
            not rival
            and not contested
            and (v.rank == rank or (not elsewhere and waited_for) or own_thread or not comparable)
        )
        # What the cause explains of the gap: of the bottom of the gap's noise band, as a gap measured
        # from a few steps' collectives swings by more than a modest cause (a rank with inputs 3.2x
        # its peers' computes 1.7 ms a step more; its peers waited 2.2 ms for it, standard error 1.1 ms).
        explained = min(1.0, cause.excessUsPerStep / max(gap - NOISE_BAND * error, cause.excessUsPerStep))
        conf = confidence(cost / v.stepUs if v.stepUs else 0.0, steady, v.steps, explained if cost else 0.0, agrees)
        # A cause that holds in every step is never "no problem": at worst the diagnosis cannot tell.
        conf = max(conf, DOUBT)
        if contested:
            conf = min(conf, round(CONFIDENT - 0.01, 2))
        named = conf >= CONFIDENT and agrees
        if named:
            others = [o for o in others if o.costUsPerStep <= cost]
            others = _also_without(tables, v, rank, cost, sampled, others) if again else others
        return Straggler(
            rank=rank,
            named=named,
            cause=cause,
            confidence=conf,
            gapUsPerStep=max(gap, 0.0),
            costUsPerStep=cost,
            stepUs=v.stepUs,
            steps=v.steps,
            steadySteps=steady,
            waitNames=v.rank,
            others=others if named else [],
        )
    # Waiting alone: no steady frame of that rank explains it (operators the profiler does not
    # attribute to Python, another thread) - or a hiccup. Only a large, steady gap names it.
    assert v.rank is not None  # no candidates and no rank returned above
    found = _best_cause(tables, exploded, v.rank, steps, sampled)
    host = _slow_host(tables, v, steps) or _held_off_waited(tables, v, steps)
    if host is not None:
        found = host[0]
    elif found is not None and (
        found.excessUsPerStep < MIN_GAP_SHARE * v.stepUs
        or (_slower_host(found) and not _host_shows(tables, v, v.rank, steps, found.excessUsPerStep))
    ):
        # A frame that explains next to nothing of the gap is no explanation of it; nor are
        # operators slower with the same shapes that the rank's counters do not show as its time.
        found = None
    agreeing = v.agreeing if host is None else host[1]
    conf = confidence(
        v.share, _sure_steps(v, agreeing) if host else agreeing, v.steps, 1.0 if host is not None else 0.0, True
    )
    once = None if found is None or host is not None else _once(tables, exploded, v, found, steps)
    if once is not None:
        # One step is no pattern (every Nth step, or once?), but no healthy job either.
        found = once[0]
        conf = min(max(conf, DOUBT), round(CONFIDENT - 0.01, 2))
    # A frame of it that takes longer than on its peers is a second kind of evidence; without one,
    # only more steps than a descheduled healthy rank stays behind for: until then, it stays just
    # below naming (a large gap is still worth "cannot tell", not "no problem").
    if found is None and v.steps < FULL_STEPS:
        conf = min(conf, round(CONFIDENT - 0.01, 2))
    elif (
        found is not None
        and 2 * v.agreeing >= v.steps
        and 2 * (_steady_or_pattern(tables, exploded, v.rank, found, steps, v.stepUs)[0] or 0) >= v.steps
    ):
        # Two kinds of evidence point at it, each in at least half of the steps: it may not be
        # named, but the job is not healthy either ("no problem" read 0.77 sure of a 4-step capture
        # whose peers waited 15 ms of a 91 ms step for the slow-compute rank, 2 steps of 4 clearly).
        conf = max(conf, DOUBT)
    hidden = _hidden_inputs(tables, v, steps) if conf < DOUBT else None
    if hidden is not None:
        return hidden
    return Straggler(
        rank=v.rank,
        named=conf >= CONFIDENT,
        cause=found,
        confidence=conf,
        gapUsPerStep=v.gapUsPerStep,
        costUsPerStep=v.gapUsPerStep,
        stepUs=v.stepUs,
        steps=v.steps,
        steadySteps=1 if once else agreeing,
        waitNames=v.rank,
        askSteps=once[1] if once else 0,
    )


def _hidden_inputs(tables: RankTables, v: WaitVerdict, steps: pd.Index) -> Straggler | None:
    """A rank whose inputs to its peers' main work are larger than theirs while its operators took
    less longer than is worth acting on (MIN_VOTE_COST of the step) or no longer: uneven shards or
    batches whose cost the machine's noise hid in these steps (4 gloo ranks on 2 cores: a 1.7x
    batch's operators took no longer than its peers'). The shapes are in every step and no load
    changes them, so the job is not healthy: the diagnosis cannot tell, and asks for more steps."""
    for rank in v.waitUs:
        ops = operator_cause(tables, rank, steps)
        if ops is None or not ops.mainWork or ops.excessUsPerStep >= MIN_VOTE_COST * v.stepUs:
            continue
        gap = max(0.0, v.gap(rank))
        return Straggler(
            rank=rank,
            named=False,
            cause=_operators(ops),
            confidence=DOUBT,
            gapUsPerStep=gap,
            costUsPerStep=gap,
            stepUs=v.stepUs,
            steps=v.steps,
            steadySteps=_steady_operators(tables, rank, steps),
            waitNames=v.rank,
        )
    return None


def _once(
    tables: RankTables, exploded: pd.DataFrame, v: WaitVerdict, cause: Cause, steps: pd.Index
) -> tuple[Cause, int] | None:
    """A function of the waited-for rank that costs it FULL_GAP of a step or more beyond its peers
    in one captured step, next to nothing in the others (QUIET), while its peers wait for it in that
    step at least half of that: the cause, told with that step, and the steps to capture to see it
    three times (no second hit in the capture: the next one is further away than either end of it)."""
    table = frame_per_step(tables, exploded, cause.frame, steps) if cause.kind == "function" else None
    if table is None or v.rank is None:
        return None
    excess = table[v.rank].to_numpy(dtype=float) - table.drop(columns=[v.rank]).median(axis=1).to_numpy(dtype=float)
    at = int(np.argmax(excess))
    peak = float(excess[at])
    waits = v.perStepUs.iloc[at]
    waited = float(waits.drop(v.rank).median() - waits[v.rank])
    if peak < FULL_GAP * v.stepUs or (np.delete(excess, at) >= QUIET * peak).any() or waited < 0.5 * peak:
        return None
    apart = max(at + 1, len(steps) - at)
    detail = (
        f"in 1 of {len(steps)} steps (step {steps[at]}) it spends {ms(peak)} more than its peers in {cause.text()}, "
        f"and they wait {ms(waited)} for it there; one step is no pattern"
    )
    return dataclasses.replace(cause, pattern=f"in 1 of {len(steps)} steps", detail=detail), 3 * apart


def more_steps(captured: int) -> int:
    """Steps to capture to tell what `captured` steps could not: never fewer than were captured."""
    return max(MORE_STEPS, 2 * captured)
