"""Rank summaries turned into columnar tables (one row per rank and item), the form every
cross-rank check and report table works on."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from stepscope.analysis.model import RankSummary, summaries_table

T = TypeVar("T")
_ADDRESS = r" at 0x[0-9a-fA-F]+"
# stepscope's own agent (its heartbeat and watchdog threads, its step hook) and torch's profiler
# (its step and record_function frames): never a finding; their time is reported apart.
OWN_FRAMES = r"stepscope_agent|(?:^|[\\/])torch[\\/](?:autograd[\\/])?profiler[\\/.]"
MAIN_THREAD = "training thread"
# Python's threading runs a thread's target under these frames; the first frame after them names it.
_THREAD_PLUMBING = r"threading\.py\(\d+\): (?:_bootstrap|_bootstrap_inner|run)$"


def _items_frame(table: pa.Table, attr: str, skip: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per item of the list column `attr` over all ranks, with its rank: the lists
    flattened at once, in rank order and each rank's own order."""
    column = table.column(attr)
    flat = pc.list_flatten(column)
    items = pa.Table.from_batches(
        [pa.RecordBatch.from_struct_array(c) for c in flat.chunks], schema=pa.schema(list(flat.type))
    )
    items = items.drop_columns([f for f in skip if f in items.column_names])
    rank = pc.take(table.column("rank"), pc.list_parent_indices(column))
    # Thousands of ranks repeat the same few hundred names: each text is held once, as a category.
    for i, kind in enumerate(items.schema.types):
        if pa.types.is_string(kind):
            items = items.set_column(i, items.schema.names[i], pc.dictionary_encode(items.column(i)))
    # A block per column: no copy of millions of rows into one 2-D block per dtype; lists (each
    # function's time per step) stay Arrow's, not a Python object per row.
    frame = items.add_column(0, "rank", rank).to_pandas(split_blocks=True, types_mapper=_arrow_lists)
    for name in frame.columns[frame.dtypes == "category"]:
        frame[name] = _sorted_categories(frame[name])
    return frame


def _sorted_categories(column: pd.Series) -> pd.Series:
    """The categorical column with its categories in text order, so that grouping and sorting by it
    order rows as they would its texts."""
    return column.cat.reorder_categories(sorted(column.cat.categories))


def _arrow_lists(kind: pa.DataType) -> pd.ArrowDtype | None:
    return pd.ArrowDtype(kind) if pa.types.is_list(kind) else None


def _common_steps(steps: pd.DataFrame) -> pd.Index | None:
    """The step numbers every rank with steps captured; None when they share none. Each rank's
    capture starts at its own step (when it read the request), so a rank's first or last step can
    run while a peer no longer profiles it: that step's time is the peer's trace export, not work."""
    if steps.empty:
        return None
    ranks = steps.groupby("step")["rank"].nunique()
    common = ranks.index[ranks == steps["rank"].nunique()]
    return common if len(common) else None


def _struct_column(table: pa.Table, column: str, field: str, default: float) -> np.ndarray:
    """A field of a struct column (launch, idle, temporal), `default` where the rank has none."""
    values = pc.struct_field(table.column(column), field)
    return pc.fill_null(values, pa.scalar(default, values.type)).to_numpy()


def _ranks_frame(table: pa.Table, steps: pd.DataFrame) -> pd.DataFrame:
    ranks = table.column("rank").to_numpy()
    common = _common_steps(steps)
    kept = steps if common is None else steps[steps["step"].isin(common)]
    step_us = kept.groupby("rank")["durationUs"].median().reindex(ranks)
    counts = steps.groupby("rank").size().reindex(ranks, fill_value=0)
    overlap = table.column("overlapPct")
    return pd.DataFrame(
        {
            "rank": ranks.astype(np.int64),
            "pod": table.column("pod").to_pandas(),
            "node": table.column("node").to_pandas(),
            "hasGpu": table.column("hasGpu").to_numpy(),
            "gpuUuid": table.column("gpuUuid").to_pandas(),
            "backend": table.column("backend").to_pandas(),
            "capturedUs": table.column("capturedUs").to_numpy(),
            # All captured steps: per-step figures divide each rank's totals by them.
            "steps": counts.to_numpy(dtype=np.int64),
            "stepUs": step_us.to_numpy(dtype=float),
            "overlapPct": pc.fill_null(overlap, np.nan).to_numpy(),
            "gpuUtilizationPct": table.column("gpuUtilizationPct").to_numpy(),
            "launches": _struct_column(table, "launch", "launches", 0),
            "shortKernels": _struct_column(table, "launch", "shortKernels", 0),
            "shortKernelThresholdUs": _struct_column(table, "launch", "shortKernelThresholdUs", 0.0),
            "launchDelayMedianUs": _struct_column(table, "launch", "launchDelayMedianUs", 0.0),
            "hostWaitUs": _struct_column(table, "idle", "hostWaitUs", 0.0),
            "kernelWaitUs": _struct_column(table, "idle", "kernelWaitUs", 0.0),
            "idleUs": _struct_column(table, "temporal", "idleUs", 0.0),
            "idlePct": _struct_column(table, "temporal", "idlePct", 0.0),
            "otherIdleUs": _struct_column(table, "idle", "otherUs", 0.0),
            "device": pc.struct_field(table.column("device"), "model").to_pandas().fillna(""),
            "traceBaseUs": table.column("traceBaseUs").to_numpy(),
        }
    )


def _durations(table: pa.Table) -> pd.DataFrame:
    """Every collective call's duration in issue order: rank, kind, its place among the rank's calls
    of that kind, durationUs."""
    calls = table.column("collectives")
    per_kind = pc.list_flatten(calls)
    lists = pc.struct_field(per_kind, "durationsUs")
    kind = pc.take(pc.struct_field(per_kind, "kind"), pc.list_parent_indices(lists))
    owner = pc.take(pc.list_parent_indices(calls), pc.list_parent_indices(lists))
    frame = pd.DataFrame(
        {
            "rank": pc.take(table.column("rank"), owner).to_numpy(),
            "kind": kind.to_pandas(),
            "durationUs": pc.list_flatten(lists).to_numpy(),
        }
    )
    frame["position"] = frame.groupby(["rank", "kind"]).cumcount()
    return frame


def _efficiency(table: pa.Table) -> pd.DataFrame:
    """The ops' and kernels' efficiency rows of every rank (OpEfficiency), `kind` op or kernel."""
    frames = [
        _items_frame(table, column).assign(kind=kind)
        for column, kind in (("opEfficiency", "op"), ("kernelEfficiency", "kernel"))
    ]
    return pd.concat(frames, ignore_index=True)


def _critical_path(table: pa.Table) -> pd.DataFrame:
    """Each rank's critical path (CriticalPathSummary): a row per bound with name "" (the path's
    time by what bounds it), then its top contributors; rank, boundBy, name, us, pathUs."""
    path = table.column("criticalPath")
    rank, total = table.column("rank"), pc.struct_field(path, "totalUs")
    by_bound = pc.struct_field(path, "byBound")
    by_bound = by_bound.cast(
        pa.list_(pa.struct([by_bound.type.key_field, by_bound.type.item_field]))
    )  # a map is no list to Arrow's kernels
    frames = []
    for items, bound, name, us in (
        (by_bound, "key", None, "value"),
        (pc.struct_field(path, "top"), "boundBy", "name", "us"),
    ):
        flat, owner = pc.list_flatten(items), pc.list_parent_indices(items)
        frames.append(
            pd.DataFrame(
                {
                    "rank": pc.take(rank, owner).to_numpy(),
                    "boundBy": pc.struct_field(flat, bound).to_numpy(zero_copy_only=False),
                    "name": pc.struct_field(flat, name).to_numpy(zero_copy_only=False)
                    if name
                    else np.full(len(flat), "", dtype=object),
                    "us": pc.struct_field(flat, us).to_numpy(),
                    "pathUs": pc.take(total, owner).to_numpy(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


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
    # Each collective call's duration (rank, kind, position, durationUs) and the efficiency rows.
    durations: pd.DataFrame = field(default_factory=pd.DataFrame)
    efficiency: pd.DataFrame = field(default_factory=pd.DataFrame)
    criticalPath: pd.DataFrame = field(default_factory=pd.DataFrame)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """make(), computed once for these tables (the diagnosis and the report ask for some
        figures of millions of rows several times); what it returns must not be changed."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def without(self, ranks: Collection[int]) -> RankTables:
        """These tables less the rows of `ranks`: the job as its other ranks ran it."""

        def kept(table: Any) -> Any:
            if isinstance(table, pd.Series):
                return table.drop(index=list(ranks), errors="ignore")
            return table[~table["rank"].isin(ranks)].reset_index(drop=True) if "rank" in table else table

        return RankTables(**{f.name: kept(getattr(self, f.name)) for f in fields(self) if f.name != "_memo"})

    @property
    def step_us(self) -> pd.Series:
        """Median step time of each rank (NaN where the trace had no steps), indexed by rank."""
        return self.ranks.set_index("rank")["stepUs"]

    def per_step(self, frame: pd.DataFrame, column: str) -> pd.Series:
        """A column divided by its rank's number of captured steps (1 where none were found)."""
        return frame[column] / self.step_counts(frame["rank"].to_numpy())

    def step_counts(self, ranks: np.ndarray) -> np.ndarray:
        """The number of captured steps of each rank in `ranks` (1 where none were found)."""
        steps = self.memo("steps_by_rank", lambda: self.ranks.set_index("rank")["steps"].clip(lower=1).astype(float))
        # An index lookup, not a map: millions of rows of a few thousand ranks.
        return steps.reindex(ranks).to_numpy()

    def by_step(self, column: str) -> pd.DataFrame:
        """A column of the steps table summed in each step (rows) by rank (columns), as it came
        (callers reindex it to the steps and ranks they compare); computed once per column."""
        return self.memo(
            f"by_step:{column}",
            lambda: self.steps.pivot_table(index="step", columns="rank", values=column, aggfunc="sum"),
        )

    def per_step_of(self, items: pd.DataFrame, steps: pd.Index) -> pd.DataFrame:
        """Summed µs of `items` (rows of one of the tables with their rank and stepsUs) in each of
        `steps` (rows) by rank (columns); items whose step times do not line up with their rank's
        steps are left out."""
        numbers = self.steps.groupby("rank")["step"].apply(list)
        ranks = sorted(int(r) for r in self.ranks["rank"])
        per = pd.DataFrame(
            {
                "rank": items["rank"].to_numpy(),
                "step": [numbers.get(r, []) for r in items["rank"]],
                "us": items["stepsUs"].to_numpy(),
            }
        )
        per = per[per["step"].map(len) == per["us"].map(len)].explode(["step", "us"]).dropna()
        if per.empty:
            return pd.DataFrame(0.0, index=steps, columns=ranks)
        table = per.astype({"step": np.int64, "us": float}).pivot_table(
            index="step", columns="rank", values="us", aggfunc="sum"
        )
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
    # Thousands of ranks run the same few hundred stacks (categories): each distinct text is worked on once.
    functions["name"] = _recategorised(functions["name"], lambda names: names.str.replace(_ADDRESS, "", regex=True))
    stacks = pd.Series(functions["stack"].cat.categories)
    codes = functions["stack"].cat.codes.to_numpy()
    frames = stacks.str.split(" > ")
    started = frames.str[0].str.contains(_THREAD_PLUMBING, regex=True)
    exploded = frames.explode()
    target = exploded[~exploded.str.contains(_THREAD_PLUMBING, regex=True)].groupby(level=0).first()
    target = target.reindex(frames.index).fillna(frames.str[-1])
    thread = pd.Series(np.where(started, target.str.replace(_ADDRESS, "", regex=True), MAIN_THREAD), dtype=str)
    functions["thread"] = _recategorised(functions["stack"], lambda _: thread)
    functions["own"] = stacks.str.contains(OWN_FRAMES, regex=True).to_numpy(dtype=bool)[codes]
    return functions


def _recategorised(column: pd.Series, rename: Callable[[pd.Series], pd.Series]) -> pd.Series:
    """A categorical column whose categories are `rename`d (several may become one text), in text order."""
    texts = rename(pd.Series(column.cat.categories))
    new_codes, categories = pd.factorize(texts, sort=True)
    codes = column.cat.codes.to_numpy()
    values = pd.Categorical.from_codes(np.where(codes >= 0, new_codes[codes], -1), categories=categories)  # -1: null
    return pd.Series(values, index=column.index, name=column.name)


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


def usable(table: pa.Table) -> pa.Table:
    """The ranks of a summaries_table whose summary carries no error (the table itself, not a
    copy, where every rank's does)."""
    failed = pc.not_equal(table.column("error"), "")
    return table.filter(pc.invert(failed)) if pc.any(failed).as_py() else table


def build_tables(summaries: list[RankSummary] | pa.Table) -> RankTables:
    """The tables of the summaries given, as objects or as a summaries_table (every rank in one
    Arrow table, as the analysis reads them)."""
    table = summaries if isinstance(summaries, pa.Table) else summaries_table(summaries)
    functions = _same_function_across_ranks(_items_frame(table, "functions"))
    steps = _items_frame(table, "steps")
    return RankTables(
        ranks=_ranks_frame(table, steps),
        steps=_with_stage(steps),
        kernels=_items_frame(table, "kernels"),
        functions=functions[~functions["own"]].reset_index(drop=True),
        memory=_items_frame(table, "memoryOps"),
        runtime=_items_frame(table, "runtime"),
        collectives=_items_frame(table, "collectives", skip=("durationsUs",)),
        operators=_items_frame(table, "operators"),
        ownUs=_own_time(functions),
        durations=_durations(table),
        efficiency=_efficiency(table),
        criticalPath=_critical_path(table),
    )
