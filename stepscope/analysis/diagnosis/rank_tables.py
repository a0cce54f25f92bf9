"""Rank summaries turned into columnar tables (one row per rank and item), the form every
cross-rank check and report table works on."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import pandas as pd

from stepscope.analysis.model import CollectiveStat, FunctionStat, KernelStat, MemoryOpStat, OperatorStat, RankSummary, RuntimeStat, StepRow

_ADDRESS = r" at 0x[0-9a-fA-F]+"
# stepscope's own agent (its heartbeat and watchdog threads, its step hook) and torch's profiler
# (its step and record_function frames): never a finding; their time is reported apart.
OWN_FRAMES = r"stepscope_agent|(?:^|[\\/])torch[\\/](?:autograd[\\/])?profiler[\\/.]"
MAIN_THREAD = "training thread"
# Python's threading runs a thread's target under these frames; the first frame after them names it.
_THREAD_PLUMBING = r"threading\.py\(\d+\): (?:_bootstrap|_bootstrap_inner|run)$"


def _items_frame(summaries: list[RankSummary], attr: str, struct: type[msgspec.Struct], skip: tuple[str, ...] = ()) -> pd.DataFrame:
    items: list[msgspec.Struct] = []
    ranks: list[int] = []
    for s in summaries:
        got = getattr(s, attr)
        items.extend(got)
        ranks.extend([s.rank] * len(got))
    fields = [f for f in struct.__struct_fields__ if f not in skip]
    data: dict[str, object] = {"rank": np.asarray(ranks, dtype=np.int64)}
    for f in fields:
        data[f] = [getattr(i, f) for i in items]
    return pd.DataFrame(data)


def _common_steps(summaries: list[RankSummary]) -> set[int] | None:
    """The step numbers every rank with steps captured; None when they share none. Each rank's
    capture starts at its own step (when it read the request), so a rank's first or last step can
    run while a peer no longer profiles it: that step's time is the peer's trace export, not work."""
    sets = [{r.step for r in s.steps} for s in summaries if s.steps]
    common = set.intersection(*sets) if sets else set()
    return common or None


def _ranks_frame(summaries: list[RankSummary]) -> pd.DataFrame:
    common = _common_steps(summaries)
    steps = [np.fromiter((r.durationUs for r in s.steps if common is None or r.step in common), dtype=float) for s in summaries]
    return pd.DataFrame({
        "rank": np.asarray([s.rank for s in summaries], dtype=np.int64),
        "pod": [s.pod for s in summaries],
        "node": [s.node for s in summaries],
        "hasGpu": np.asarray([s.hasGpu for s in summaries], dtype=bool),
        "backend": [s.backend for s in summaries],
        "capturedUs": np.asarray([s.capturedUs for s in summaries], dtype=float),
        # All captured steps: per-step figures divide each rank's totals by them.
        "steps": np.asarray([len(s.steps) for s in summaries], dtype=np.int64),
        "stepUs": np.asarray([float(np.median(d)) if d.size else np.nan for d in steps], dtype=float),
        "overlapPct": np.asarray([np.nan if s.overlapPct is None else s.overlapPct for s in summaries], dtype=float),
        "gpuUtilizationPct": np.asarray([s.gpuUtilizationPct for s in summaries], dtype=float),
        "launches": np.asarray([s.launch.launches if s.launch else 0 for s in summaries], dtype=np.int64),
        "shortKernels": np.asarray([s.launch.shortKernels if s.launch else 0 for s in summaries], dtype=np.int64),
        "shortKernelThresholdUs": np.asarray([s.launch.shortKernelThresholdUs if s.launch else 0.0 for s in summaries], dtype=float),
        "launchDelayMedianUs": np.asarray([s.launch.launchDelayMedianUs if s.launch else 0.0 for s in summaries], dtype=float),
        "hostWaitUs": np.asarray([s.idle.hostWaitUs if s.idle else 0.0 for s in summaries], dtype=float),
        "kernelWaitUs": np.asarray([s.idle.kernelWaitUs if s.idle else 0.0 for s in summaries], dtype=float),
        "idleUs": np.asarray([s.temporal.idleUs if s.temporal else 0.0 for s in summaries], dtype=float),
        "idlePct": np.asarray([s.temporal.idlePct if s.temporal else 0.0 for s in summaries], dtype=float),
        "otherIdleUs": np.asarray([s.idle.otherUs if s.idle else 0.0 for s in summaries], dtype=float),
    })


@dataclass(frozen=True)
class RankTables:
    """All summaries of a session as tables; `ranks` has one row per summarised rank."""
    ranks: pd.DataFrame
    steps: pd.DataFrame
    kernels: pd.DataFrame
    functions: pd.DataFrame
    memory: pd.DataFrame
    runtime: pd.DataFrame
    collectives: pd.DataFrame
    operators: pd.DataFrame
    # Exclusive µs of stepscope's agent and torch's profiler on each rank's training thread, over
    # the capture: left out of `functions`, stated where it distorts a figure.
    ownUs: pd.Series

    @property
    def step_us(self) -> pd.Series:
        """Median step time of each rank (NaN where the trace had no steps), indexed by rank."""
        return self.ranks.set_index("rank")["stepUs"]

    def per_step(self, frame: pd.DataFrame, column: str) -> pd.Series:
        """A column divided by its rank's number of captured steps (1 where none were found)."""
        steps = frame["rank"].map(self.ranks.set_index("rank")["steps"].clip(lower=1))
        return frame[column] / steps.to_numpy(dtype=float)

    def per_step_of(self, items: pd.DataFrame, steps: pd.Index) -> pd.DataFrame:
        """Summed µs of `items` (rows of one of the tables with their rank and stepsUs) in each of
        `steps` (rows) by rank (columns); items whose step times do not line up with their rank's
        steps are left out."""
        numbers = self.steps.groupby("rank")["step"].apply(list)
        ranks = sorted(int(r) for r in self.ranks["rank"])
        per = pd.DataFrame({"rank": items["rank"].to_numpy(), "step": [numbers.get(r, []) for r in items["rank"]],
                            "us": items["stepsUs"].to_numpy()})
        per = per[per["step"].map(len) == per["us"].map(len)].explode(["step", "us"]).dropna()
        if per.empty:
            return pd.DataFrame(0.0, index=steps, columns=ranks)
        table = per.astype({"step": np.int64, "us": float}).pivot_table(index="step", columns="rank", values="us", aggfunc="sum")
        return table.reindex(index=steps, columns=ranks).fillna(0.0)

    def collective_share(self) -> pd.Series:
        """Share (0..1) of each rank's step time spent in collectives, by rank: the union of the
        collective calls (StepRow.collectiveUs); summaries without it give their per-kind sums,
        capped at the step time, since calls running at once would otherwise count twice."""
        summed = self.collectives.groupby("rank")["sumUs"].sum()
        s = self.steps
        step_us = s.groupby("rank")["durationUs"].sum().reindex(summed.index)
        union = s["collectiveUs"].astype(float).groupby(s["rank"]).sum(min_count=1).reindex(summed.index)
        return (union.fillna(summed.clip(upper=step_us)) / step_us.where(step_us > 0)).dropna()


def _same_function_across_ranks(functions: pd.DataFrame) -> pd.DataFrame:
    """Python's repr of built-ins carries the object's address ('<built-in method run_backward of
    ... object at 0x7fee401a7b70>'), different in every process: drop it so ranks line up. Each
    stack gets its thread: the training thread, or another one named by its target function."""
    if functions.empty:
        return functions.assign(thread=pd.Series(dtype=str), own=pd.Series(dtype=bool))
    functions["name"] = functions["name"].str.replace(_ADDRESS, "", regex=True)
    frames = functions["stack"].str.split(" > ")
    started = frames.str[0].str.contains(_THREAD_PLUMBING, regex=True)
    exploded = frames.explode()
    target = exploded[~exploded.str.contains(_THREAD_PLUMBING, regex=True)].groupby(level=0).first()
    target = target.reindex(functions.index).fillna(frames.str[-1])
    functions["thread"] = np.where(started, target.str.replace(_ADDRESS, "", regex=True), MAIN_THREAD)
    functions["own"] = functions["stack"].str.contains(OWN_FRAMES, regex=True)
    return functions


def _own_time(functions: pd.DataFrame) -> pd.Series:
    """Per rank, the exclusive time of stepscope's agent and the profiler on the training thread."""
    if functions.empty:
        return pd.Series(dtype=float)
    own = functions[functions["own"] & (functions["thread"] == MAIN_THREAD)]
    return own.groupby("rank")["exclusiveUs"].sum()


def _with_stage(steps: pd.DataFrame) -> pd.DataFrame:
    """Ascend's Stage time (Computing + Communication(Not Overlapped) + Free): the denominator of
    the step table's shares. GPU work can run past the CPU's ProfilerStep span, so the span
    (durationUs) would give shares above 100 %; it stands in only where the table is empty."""
    stage = steps["computingUs"] + steps["commNotOverlappedUs"] + steps["freeUs"]
    return steps.assign(stageUs=stage.where(stage > 0, steps["durationUs"]))


def build_tables(summaries: list[RankSummary]) -> RankTables:
    functions = _same_function_across_ranks(_items_frame(summaries, "functions", FunctionStat))
    return RankTables(
        ranks=_ranks_frame(summaries),
        steps=_with_stage(_items_frame(summaries, "steps", StepRow)),
        kernels=_items_frame(summaries, "kernels", KernelStat),
        functions=functions[~functions["own"]].reset_index(drop=True),
        memory=_items_frame(summaries, "memoryOps", MemoryOpStat),
        runtime=_items_frame(summaries, "runtime", RuntimeStat),
        collectives=_items_frame(summaries, "collectives", CollectiveStat, skip=("durationsUs",)),
        operators=_items_frame(summaries, "operators", OperatorStat),
        ownUs=_own_time(functions),
    )
