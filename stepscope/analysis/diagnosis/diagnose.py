"""Cross-rank diagnosis: from every rank's summary to findings ranked worst first.

`diagnose` returns the compact Diagnosis that goes into the session's status (bounded, so the
status stays under 32 KiB whatever the rank count) and the full findings with the figures behind
them (for report/diagnosis.json). Ranks whose summary carries an error become findings; they
never stop the others from being diagnosed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from stepscope.analysis.diagnosis.bottlenecks import all_checks
from stepscope.analysis.diagnosis.causes import PROFILED_CALL_US, Cause
from stepscope.analysis.diagnosis.consistency import CPU_ONLY, reconcile
from stepscope.analysis.diagnosis.efficiency import efficiency_findings
from stepscope.analysis.diagnosis.hangs import hang_findings
from stepscope.analysis.diagnosis.rank_tables import RankTables, build_tables, usable
from stepscope.analysis.diagnosis.shared_gpu import shared_gpu_findings, taking_turns
from stepscope.analysis.diagnosis.slow_workers import (
    DOUBT,
    MIN_GAP_SHARE,
    SlowEvidence,
    WaitVerdict,
    find_slow_workers,
    kernel_ratios,
    wait_verdict,
)
from stepscope.analysis.diagnosis.straggler import Straggler, find_straggler, lost_time_shares, more_steps
from stepscope.analysis.diagnosis.wording import function_text, ms, ranks_text, short
from stepscope.analysis.model import (
    Breakdown,
    Diagnosis,
    Finding,
    RankSummary,
    SlowWorker,
    StepTime,
    summaries_table,
    table_summaries,
)
from stepscope.analysis.statistics.summary import NO_GPU_EVENTS
from stepscope.contracts.wire import STACK_SAMPLE_SECONDS, STACKS_DROPPED

MAX_FINDINGS = 20
MAX_SLOW_WORKERS = 16
MAX_MESSAGE = 300
MAX_RANKS = 32
MAX_CAUSE = 200
_SEVERITY = {"critical": 0, "warning": 1, "info": 2}


def _ranks_by_text(ranks: np.ndarray, texts: np.ndarray, keep: np.ndarray | None = None) -> dict[str, list[int]]:
    """The ranks of each distinct text, texts in order of first appearance."""
    if keep is not None:
        ranks, texts = ranks[keep], texts[keep]
    codes, uniques = pd.factorize(texts)
    order = np.argsort(codes, kind="stable")
    groups = np.split(ranks[order].astype(int), np.cumsum(np.bincount(codes, minlength=len(uniques)))[:-1])
    return {str(t): g.tolist() for t, g in zip(uniques, groups)}


def _trace_findings(table: pa.Table) -> list[Finding]:
    """Per-rank errors and warnings, one finding per distinct text (1,000 ranks with the same
    warning are one finding, not 1,000)."""
    out = []
    ranks = table.column("rank").to_numpy()
    error = table.column("error").to_numpy(zero_copy_only=False)
    warned = table.column("warnings")
    errors, warnings = (
        _ranks_by_text(ranks, error, error != ""),
        _ranks_by_text(ranks[pc.list_parent_indices(warned).to_numpy()], pc.list_flatten(warned).to_numpy()),
    )
    for text, rows in errors.items():
        # Critical, but after the slow workers and hangs: those say what to fix, this what is unseen.
        out.append(
            Finding(
                "critical",
                "trace",
                rows,
                f"{ranks_text(rows)} could not be analysed: {text}",
                0.001 * len(rows),
                {"error": text},
            )
        )
    for text, rows in warnings.items():
        out.append(
            Finding(
                "info",
                "trace",
                rows,
                f"{ranks_text(rows)}: {text}",
                0.0,
                {"claim": CPU_ONLY if text.startswith(NO_GPU_EVENTS) else None},
            )
        )
    return out


def _slow_worker_finding(
    e: SlowEvidence, tables: RankTables, median_step_us: float, python: dict[int, str], hardware: dict[int, str]
) -> Finding:
    slowdown = e.slowdown(median_step_us)
    reasons = []
    if e.stepRatio:
        mine = float(tables.step_us.get(e.rank, 0.0))
        reasons.append(f"its step takes {ms(mine)} vs {ms(mine / e.stepRatio)} on its peers (median)")
    if e.kernelRatio:
        names = ", ".join(list(dict.fromkeys(short(k["name"], 50) for k in e.slowKernels))[:3])
        reasons.append(
            f"its GPU kernels run {100 * (e.kernelRatio - 1):.0f}% longer" + (f" ({names})" if names else "")
        )
    if e.rank in python:
        reasons.append(python[e.rank])
    if e.rank in hardware:
        reasons.append(hardware[e.rank])
    wait = f"the others wait {ms(e.waitUsPerStep(median_step_us))}/step for it"
    if e.voteShare:
        reasons.append(f"it arrives last at {100 * e.voteShare:.0f}% of {e.rounds} matched collectives")
    if e.stepRatio:
        message = f"rank {e.rank} is {slowdown:.2f}x slower than its peers: " + "; ".join(
            reasons + ([wait] if e.voteShare else [])
        )
    else:
        # Only the collectives show it: every rank's step lasts as long as the slowest one's, so
        # "Nx slower" would rest on the others' wait, a noisy estimate; the wait itself is measured.
        message = (
            f"rank {e.rank} holds its peers back, they wait {ms(e.waitUsPerStep(median_step_us))} of each "
            f"{ms(median_step_us)} step "
            f"for it: " + "; ".join(reasons)
        )
    severity = "critical" if slowdown >= 1.2 else "warning"
    return Finding(
        severity,
        "slow-worker",
        [e.rank],
        message,
        slowdown - 1.0,
        {
            "slowdown": round(slowdown, 3),
            "stepRatio": e.stepRatio,
            "kernelRatio": e.kernelRatio,
            "slowKernels": e.slowKernels,
            "voteShare": e.voteShare,
            "votes": e.votes,
            "rounds": e.rounds,
            "peersWaitUsPerStep": round(e.waitUsPerStep(median_step_us), 1),
        },
    )


def _kernel_skew_finding(e: SlowEvidence, tables: RankTables) -> Finding:
    """Longer kernels on a rank whose step is no longer and that no one waits for."""
    assert e.kernelRatio is not None  # only kernel evidence comes here
    names = ", ".join(list(dict.fromkeys(short(k["name"], 50) for k in e.slowKernels))[:3])
    steps = tables.step_us.dropna()
    mine = float(steps.get(e.rank, np.nan))
    peers = float(steps.drop(e.rank, errors="ignore").median()) if len(steps) > 1 else np.nan
    step = (
        f": its step takes {ms(mine)} vs {ms(peers)} on its peers, so the collectives absorb it (it waits less)"
        if mine == mine and peers == peers
        else ""
    )
    return Finding(
        "warning",
        "kernel",
        [e.rank],
        f"rank {e.rank}'s GPU kernels run {100 * (e.kernelRatio - 1):.0f}% longer than its peers'"
        + (f" ({names})" if names else "")
        + step,
        (e.kernelRatio - 1.0) / 4,
        {"kernelRatio": e.kernelRatio, "slowKernels": e.slowKernels},
    )


def _cause_text(cause: Cause | None, stacks_dropped: bool = False) -> str:
    """What the slow rank does while its peers wait. Where the capture budget dropped its Python
    stacks, the agent's samples of the stack name the function, and the text says the figures are
    sampled; without samples the function cannot be told, and the text says so and what to capture
    instead (the agent's own sentence stays in the rank's warnings: the headline is one line)."""
    # (Larger inputs are told by their detail where the operators took no longer.)
    if (cause is None or (cause.excessUsPerStep <= 0 and not cause.detail)) and stacks_dropped:
        return (
            "cannot tell what it does in that time, as the capture budget (capture.limits.maxStackEvents, see its "
            "warnings) dropped its Python stacks: capture steps: 1 with that limit raised to name the function"
        )
    if cause is None or (cause.excessUsPerStep <= 0 and not cause.detail):
        return (
            "no Python function of it runs longer than on its peers (the time is in operators or threads the profiler "
            "does not attribute)"
        )
    if cause.detail:
        return cause.detail
    overhead = cause.callsPerStep * PROFILED_CALL_US
    calls = (
        f"; {cause.callsPerStep:,.0f} profiled calls/step, about {ms(overhead)} of it the profiler's own cost"
        if overhead >= 0.1 * cause.excessUsPerStep and not stacks_dropped
        else ""
    )
    if stacks_dropped:
        # The agent sampled the stack instead: the figures are estimates from a few hundred samples.
        calls = (
            f"; from samples of its stack every {STACK_SAMPLE_SECONDS * 1000:g} ms, as the capture budget "
            "(capture.limits.maxStackEvents) dropped its Python stacks"
        )
    return (
        f"it spends {ms(cause.excessUsPerStep)}/step more than its peers in {cause.text()} ({ms(cause.usPerStep)} vs "
        f"{ms(cause.peersUsPerStep)}{calls})"
    )


def _own_note(tables: RankTables, rank: int, step_us: float) -> str:
    """stepscope's agent and profiler time on the rank's training thread, when it distorts figures."""
    steps = float(tables.ranks.set_index("rank")["steps"].clip(lower=1).get(rank, 1))
    own = float(tables.ownUs.get(rank, 0.0)) / steps
    return (
        f"; stepscope's agent and profiler took {ms(own)}/step of its training thread, left out"
        if step_us > 0 and own >= 0.05 * step_us
        else ""
    )


def _clean_confidence(v: WaitVerdict) -> float:
    """How sure "no rank holds the job back" is: more steps and a smaller gap, surer."""
    return round(min(1.0, 0.5 + 0.2 * v.steps) * max(0.0, 1.0 - 0.5 * v.share / MIN_GAP_SHARE), 2)


def _worker_cause(cause: Cause | None) -> str:
    """A slow worker's cause in a few words, for its status entry."""
    if cause is None:
        return ""
    if cause.kind == "function":
        text = function_text(cause.frame) + (f", {cause.pattern}" if cause.pattern else "")
    else:
        text = cause.text().removeprefix("its ")
    return text if len(text) <= MAX_CAUSE else text[: MAX_CAUSE - 3] + "..."


def _what_if(step_us: float, without_us: float) -> str:
    return (
        f"without it the step would take about {ms(without_us)} instead of {ms(step_us)} "
        f"({-100 * (1 - without_us / step_us):.0f} %)"
        if step_us > 0
        else ""
    )


def _other_finding(o: Straggler, first: Straggler, tables: RankTables, lost_us: float) -> tuple[Finding, SlowWorker]:
    """A further rank that holds the job back, with its own cause and what it costs the job: the
    step still waits for the first rank without it, and for it once the first one is fixed."""
    assert o.rank is not None and first.rank is not None  # only named ranks come here
    without_us = o.stepUs
    after_first = o.stepUs - first.costUsPerStep + o.costUsPerStep
    slowdown = o.stepUs / max(without_us, 1.0)
    message = (
        f"rank {o.rank} holds the job back too (confidence {o.confidence:.2f}): {_cause_text(o.cause)}; "
        f"{o.steadySteps} of {o.steps} step(s) show it; its share of the job's lost time is {ms(lost_us)}/step; "
        f"without rank {first.rank}'s cause the step would still take about {ms(after_first)} for it, "
        f"{ms(o.stepUs - first.costUsPerStep)} without both"
    )
    step = float(tables.step_us.get(o.rank, np.nan))
    worker = SlowWorker(
        rank=o.rank,
        stepTimeMs=round(step / 1000.0, 3) if step == step else 0.0,
        slowdown=round(slowdown, 3),
        cause=_worker_cause(o.cause),
        lostMsPerStep=round(lost_us / 1000.0, 3),
        stepWithoutMs=round(without_us / 1000.0, 3),
    )
    return Finding(
        "critical" if slowdown >= 1.2 else "warning",
        "slow-worker",
        [o.rank],
        message,
        slowdown - 1.0,
        {
            "costUsPerStep": round(o.costUsPerStep, 1),
            "lostUsPerStep": round(lost_us, 1),
            "stepWithoutUs": round(without_us, 1),
            "confidence": o.confidence,
        },
    ), worker


def _straggler_findings(
    st: Straggler, tables: RankTables, stacks_dropped: set[int]
) -> tuple[list[Finding], list[SlowWorker]]:
    """The slow-worker findings (or that it cannot tell) and their SlowWorker entries, the named
    rank's first."""
    if st.rank is None or st.confidence < DOUBT:
        return [], []
    reason = _cause_text(st.cause, st.rank in stacks_dropped)
    held = f"{st.steadySteps} of {st.steps} step(s) captured by every rank show it"
    if st.gapUsPerStep >= 0.5 * st.costUsPerStep:
        waited = f"its peers wait {ms(st.gapUsPerStep)} of each {ms(st.stepUs)} step for it ({held})"
    else:
        waited = (
            f"that is {100 * st.costUsPerStep / st.stepUs:.0f}% of its {ms(st.stepUs)} step; the collectives' own "
            f"time hides most of its peers' wait ({ms(st.gapUsPerStep)}/step measured; {held})"
        )
    data = {
        "gapUsPerStep": round(st.gapUsPerStep, 1),
        "costUsPerStep": round(st.costUsPerStep, 1),
        "stepUs": round(st.stepUs, 1),
        "steps": st.steps,
        "steadySteps": st.steadySteps,
        "confidence": st.confidence,
        "waitingNames": st.waitNames,
        "cause": None
        if st.cause is None
        else {
            "function": st.cause.frame,
            "inner": st.cause.inner,
            "phase": st.cause.phase,
            "excessUsPerStep": round(st.cause.excessUsPerStep, 1),
            "callsPerStep": round(st.cause.callsPerStep, 1),
        },
    }
    if not st.named:
        other = (
            f"; the collectives point at rank {st.waitNames}"
            if st.waitNames is not None and st.waitNames != st.rank
            else ""
        )
        message = (
            f"cannot tell which rank holds the job back from {st.steps} step(s) captured by every rank (confidence "
            f"{st.confidence:.2f}); "
            f"capture more steps (steps: {max(more_steps(st.steps), st.askSteps)}) to know. Rank {st.rank} is the "
            f"likeliest: {reason}, {waited}{other}"
        )
        return [Finding("warning", "slow-worker", [], message, 0.0, data)], []
    # What if: a synchronous step waits for its slowest rank, so without this rank's cause alone
    # it would wait for the next slowest one.
    costs = {st.rank: st.costUsPerStep, **{o.rank: o.costUsPerStep for o in st.others if o.rank is not None}}
    shares = lost_time_shares(costs, st.costUsPerStep)
    runner_up = max((o.costUsPerStep for o in st.others), default=0.0)
    without = st.stepUs - (st.costUsPerStep - runner_up)
    slowdown = st.stepUs / max(without, 1.0)
    data["slowdown"] = round(slowdown, 3)
    data["lostUsPerStep"], data["stepWithoutUs"] = round(shares[st.rank], 1), round(without, 1)
    split = (
        f"; the job loses {ms(st.costUsPerStep)}/step, {', '.join(f'{ms(shares[r])} to rank {r}' for r in shares)}"
        if st.others
        else ""
    )
    message = (
        f"rank {st.rank} holds the job back (confidence {st.confidence:.2f}): {reason}; {waited}; "
        + _what_if(st.stepUs, without)
        + split
        + _own_note(tables, st.rank, st.stepUs)
    )
    step = float(tables.step_us.get(st.rank, np.nan))
    worker = SlowWorker(
        rank=st.rank,
        stepTimeMs=round(step / 1000.0, 3) if step == step else 0.0,
        slowdown=round(slowdown, 3),
        cause=_worker_cause(st.cause),
        lostMsPerStep=round(shares[st.rank] / 1000.0, 3),
        stepWithoutMs=round(without / 1000.0, 3),
    )
    found = [
        Finding("critical" if slowdown >= 1.2 else "warning", "slow-worker", [st.rank], message, slowdown - 1.0, data)
    ]
    workers = [worker]
    for o in st.others:
        assert o.rank is not None  # further ranks are named ones
        finding, further = _other_finding(o, st, tables, shares[o.rank])
        found.append(finding)
        workers.append(further)
    return found, workers


def _python_reason(data: dict[str, Any]) -> str:
    mine, theirs = data["usPerStep"], data["peersUsPerStep"]
    times = f", {mine / theirs:.0f}x its peers" if theirs > 0 else ""
    return f"it spends {ms(mine)}/step in {function_text(data['function'])}{times}"


def _hardware(table: pa.Table, hardware: dict[str, pd.DataFrame] | None) -> tuple[list[Finding], dict[int, str]]:
    if not hardware:
        return [], {}
    try:
        from stepscope.analysis.diagnosis import hardware as hw
    except ImportError as exc:
        return [
            Finding("info", "hardware", [], f"hardware metrics were captured but cannot be analysed here: {exc}", 0.0)
        ], {}
    return hw.findings(table_summaries(table), hardware)


def _breakdown(tables: RankTables) -> Breakdown | None:
    s = tables.steps
    total = float(s["stageUs"].sum()) if not s.empty else 0.0
    # CPU-only traces have no GPU time to split: no breakdown rather than one of zeros.
    if total <= 0 or not s[["computingUs", "commNotOverlappedUs", "overlappedUs", "freeUs"]].to_numpy().any():
        return None

    def pct(column: str) -> float:
        return round(100.0 * float(s[column].sum()) / total, 2)

    memory = float(tables.memory["sumUs"].sum()) if not tables.memory.empty else 0.0
    captured = float(tables.ranks["capturedUs"].sum()) or total
    return Breakdown(
        computePct=pct("computingUs"),
        commNotOverlappedPct=pct("commNotOverlappedUs"),
        overlappedPct=pct("overlappedUs"),
        memoryPct=round(min(100.0, 100.0 * memory / captured), 2),
        idlePct=pct("freeUs"),
    )


def _ordered(found: list[Finding]) -> list[Finding]:
    return sorted(found, key=lambda f: (_SEVERITY.get(f.severity, 3), -f.score))


def _compact_finding(f: Finding) -> Finding:
    message = f.message if len(f.message) <= MAX_MESSAGE else f.message[: MAX_MESSAGE - 3] + "..."
    return Finding(severity=f.severity, category=f.category, ranks=f.ranks[:MAX_RANKS], message=message)


def _summary_line(found: list[Finding], tables: RankTables, ranks: int, failed: int) -> str:
    if found and found[0].severity != "info":
        # A slow worker's first two reasons are what to act on; the rest is in the findings.
        # ("cannot tell" names no rank, and what to capture instead is its point.)
        slow = found[0].category == "slow-worker" and found[0].ranks
        line = "; ".join(found[0].message.split("; ")[:2]) if slow else found[0].message
        also = [f for f in found[1:] if slow and f.category == "slow-worker" and f.ranks and f.ranks != found[0].ranks]
        if also:
            line = f"{ranks_text([found[0].ranks[0]] + [f.ranks[0] for f in also])} hold the job back: " + line
        # A hung rank never wrote its trace; saying so again under the hang adds nothing.
        if failed and found[0].category not in ("trace", "hang"):
            line += f" ({failed} of {ranks} rank(s) could not be analysed)"
    else:
        steps = tables.step_us.dropna()
        step = f"; median step {ms(float(steps.median()))}" if len(steps) else ""
        line = f"no problem found across {ranks} rank(s){step}"
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def diagnose(
    summaries: list[RankSummary] | pa.Table,
    *,
    stacks: dict[int, dict] | None = None,
    hardware: dict[str, pd.DataFrame] | None = None,
    tables: RankTables | None = None,
) -> tuple[Diagnosis, list[Finding]]:
    """Diagnose a session from its rank summaries (plus hang stacks and NVML samples by pod), as
    objects or as one summaries_table (the form the analysis reads them in); `tables`: their
    usable ranks' build_tables where the caller has them already.

    Returns the compact Diagnosis for the status and the full findings, worst first, each with its
    score (roughly the share of step time at stake) and data."""
    table = summaries if isinstance(summaries, pa.Table) else summaries_table(summaries)
    ok = usable(table)
    tables = build_tables(ok) if tables is None else tables
    steps = tables.step_us.dropna()
    median_step_us = float(steps.median()) if len(steps) else 0.0
    verdict = wait_verdict(tables)
    # A job whose ranks wait for each other steps in lockstep: its step times are equal by
    # construction, and who waits for whom (straggler.py) replaces the step-time and vote tests.
    evidence = find_slow_workers(tables, votes=verdict is None, steps=verdict is None)
    waiting: list[Finding] = []
    waiting_workers: list[SlowWorker] = []
    confidence: float | None = None
    # The agent's capture budget says so in the summary's warnings (stepscope.contracts.wire.STACKS_DROPPED).
    warned = ok.column("warnings")
    dropped_rows = pc.starts_with(pc.list_flatten(warned), STACKS_DROPPED).to_numpy()
    dropped = {int(r) for r in ok.column("rank").to_numpy()[pc.list_parent_indices(warned).to_numpy()[dropped_rows]]}
    if verdict is not None:
        straggler = find_straggler(tables, verdict, frozenset(dropped))
        waiting, waiting_workers = _straggler_findings(straggler, tables, dropped)
        if straggler.rank is None:
            confidence = _clean_confidence(verdict)
        else:
            # Too little for a doubt: the confidence that no rank holds the job back.
            confidence = straggler.confidence if straggler.confidence >= DOUBT else round(1.0 - straggler.confidence, 2)
    _, kernels = kernel_ratios(tables)
    named = set(evidence) | {w.rank for w in waiting_workers}
    checks = all_checks(tables, kernels, named, judged=verdict is not None, sampled=frozenset(dropped))
    # A slow worker's own unusual Python function is its explanation, so it joins that finding.
    python = {
        f.ranks[0]: _python_reason(f.data)
        for f in checks
        if f.category == "python" and len(f.ranks) == 1 and f.ranks[0] in evidence and "function" in f.data
    }
    hw_found, explanations = _hardware(table, hardware)
    turns = taking_turns(tables, evidence, set(python) | set(explanations))
    shared = shared_gpu_findings(tables, turns, evidence, median_step_us)
    evidence = {r: e for r, e in evidence.items() if r not in turns}
    skew = [_kernel_skew_finding(e, tables) for e in evidence.values() if not e.holds_back]
    evidence = {r: e for r, e in evidence.items() if e.holds_back}
    slow = [_slow_worker_finding(e, tables, median_step_us, python, explanations) for e in evidence.values()]
    all_ranks = table.column("rank").to_numpy()
    hangs = hang_findings(stacks or {}, sorted(int(r) for r in all_ranks))
    found = _ordered(
        reconcile(
            [
                *slow,
                *skew,
                *waiting,
                *hangs,
                *_trace_findings(table),
                *hw_found,
                *shared,
                *checks,
                *efficiency_findings(tables),
            ],
            tables,
        )
    )
    info = tables.ranks.set_index("rank")
    workers = [
        SlowWorker(
            rank=e.rank,
            stepTimeMs=round(float(tables.step_us.get(e.rank, np.nan)) / 1000.0, 3) if e.rank in steps.index else 0.0,
            slowdown=round(e.slowdown(median_step_us), 3),
        )
        for e in evidence.values()
    ]
    workers += waiting_workers
    for w in workers:
        w.pod, w.node = str(info.at[w.rank, "pod"]), str(info.at[w.rank, "node"])
    slow_workers = sorted(workers, key=lambda w: (-w.lostMsPerStep, -w.slowdown))[:MAX_SLOW_WORKERS]
    if hangs and any(f.severity == "critical" for f in hangs):
        confidence = None
    step_time = (
        StepTime(
            min=round(float(steps.min()) / 1000.0, 3),
            median=round(median_step_us / 1000.0, 3),
            max=round(float(steps.max()) / 1000.0, 3),
        )
        if len(steps)
        else None
    )
    diagnosis = Diagnosis(
        summary=_summary_line(found, tables, len(table), len(table) - len(ok)),
        confidence=confidence,
        stepTimeMs=step_time,
        slowWorkers=slow_workers,
        breakdown=_breakdown(tables),
        findings=[_compact_finding(f) for f in found[:MAX_FINDINGS]],
    )
    return diagnosis, found
