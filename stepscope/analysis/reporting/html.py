"""report/index.html: one self-contained page (inline CSS, SVG and a few lines of JS, nothing
fetched) with the findings, step times and breakdowns per rank, top kernels, Python functions
and communication, so it works offline and can be mailed around as one file.

This module computes what the page shows (numbers, labels, chart coordinates) as plain values;
templates/report.html marks them up with Jinja2, autoescaped, with report.css and report.js."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from jinja2 import Environment, PackageLoader

from stepscope.analysis.diagnosis.causes import WAITING
from stepscope.analysis.diagnosis.rank_tables import MAIN_THREAD, RankTables
from stepscope.analysis.diagnosis.slow_workers import kernel_ratios
from stepscope.analysis.diagnosis.wording import function_text, ranks_text, short
from stepscope.analysis.model import Diagnosis, Finding

_TEMPLATES = Environment(
    loader=PackageLoader("stepscope.analysis.reporting", "templates"),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
)

# Past this many ranks a chart shows how the ranks are distributed rather than a bar per rank,
# and the ranks table the ranks that matter (the rest by the rank search).
MAX_BARS = 256
MAX_RANK_ROWS = 64
HISTOGRAM_BINS = 60
# What one rank's problems may add to the page's rank search (its text is in diagnosis.json whole).
MAX_PROBLEM_CHARS = 300

_SEGMENTS = (
    ("computingUs", "compute", "var(--c1)"),
    ("commNotOverlappedUs", "communication not overlapped", "var(--c2)"),
    ("overlappedUs", "communication overlapped", "var(--c4)"),
    ("freeUs", "free (idle)", "var(--c5)"),
)


@dataclass(frozen=True)
class Cell:
    text: str = ""
    kind: str = ""  # "n" (a number, right-aligned), "name" (monospace) or ""
    title: str | None = None  # the full text on hover (text is shortened)
    full: str | None = None  # a kernel's full name, shown on demand under its short form (text)
    badge: str | None = None  # a severity badge
    lines: tuple[str, ...] | None = None  # a folded stack, one frame a line
    waiting: bool = False  # a function that waits (locks, collectives)


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[Cell]]
    classes: list[str] | None = None  # per row: "slow" or ""


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True)
class Chart:
    """An SVG bar chart: grid lines (y, label), bars, x labels (x, label), an optional dashed
    reference line (y, label), y-axis unit and legend (label, colour)."""

    width: int
    height: int
    left: int
    bottom: int
    grid: list[tuple[float, str]]
    bars: list[Bar]
    xlabels: list[tuple[float, str]]
    reference: tuple[float, str] | None = None
    unit: str = ""
    legend: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Roofline:
    """A log-log roofline: ticks (position, label) on both axes, each roof as SVG polyline points
    with its label and colour, and dots (x, y, radius, colour, title)."""

    width: int
    height: int
    left: int
    bottom: int
    xticks: list[tuple[float, str]]
    yticks: list[tuple[float, str]]
    roofs: list[tuple[str, str, float, float]]  # points, label, label x, label y
    dots: list[tuple[float, float, float, str, str]]
    legend: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Block:
    """A section's content: a table or a chart, with a note before or after it (or a note alone)."""

    table: Table | None = None
    chart: Chart | None = None
    roofline: Roofline | None = None
    before: str = ""
    note: str = ""


def _num(value: float, digits: int = 1) -> str:
    return "–" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:,.{digits}f}"


def _ticks(top: float) -> list[float]:
    """Round axis ticks (1, 2, 2.5 or 5 times a power of ten) from 0 up to at least `top`."""
    raw = top / 4 if top > 0 else 1.0
    power = 10 ** np.floor(np.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(np.ceil(top / step)) + 1)]


def _bar_chart(
    labels: list[str],
    values: np.ndarray,
    highlight: set[int],
    unit: str,
    reference: float | None = None,
    ref_label: str = "median",
) -> Block:
    """Vertical bars, one per rank; highlighted ones in red; a dashed reference line."""
    finite = np.isfinite(values)
    if not finite.any():
        return Block(note="no data")
    width, height, left, bottom = 1100, 220, 56, 24
    ticks = _ticks(max(float(values[finite].max()), 0.0) * 1.05 or 1.0)
    top = ticks[-1]
    n = len(values)
    slot = (width - left - 10) / n
    bar = max(1.0, slot * 0.8)
    grid = [(height - tick / top * (height - 10), f"{tick:,.{0 if ticks[1] >= 1 else 2}f}") for tick in ticks]
    bars = []
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        if not finite[i]:
            continue
        h = value / top * (height - 10)
        bars.append(
            Bar(
                left + i * slot + (slot - bar) / 2,
                height - h,
                bar,
                h,
                "var(--c2)" if i in highlight else "var(--c1)",
                f"{label}: {_num(value, 2)} {unit}",
            )
        )
    every = max(1, int(np.ceil(n / 40)))
    xlabels = [(left + i * slot + slot / 2, labels[i].removeprefix("rank ")) for i in range(0, n, every)]
    line = (
        (height - reference / top * (height - 10), f"{ref_label} {_num(reference, 2)} {unit}")
        if reference is not None and reference > 0
        else None
    )
    return Block(chart=Chart(width, height, left, bottom, grid, bars, xlabels, line, unit))


def _histogram(
    values: np.ndarray,
    ranks: np.ndarray,
    highlight: set[int],
    unit: str,
    reference: float | None = None,
    ref_label: str = "median",
) -> Block:
    """How the ranks spread over `values`: the number of ranks in each of HISTOGRAM_BINS equal
    bins, a bin holding a highlighted rank in red, each bar's title naming its first ranks."""
    finite = np.isfinite(values)
    if not finite.any():
        return Block(note="no data")
    values, ranks = values[finite], ranks[finite]
    lo, hi = float(values.min()), float(values.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, HISTOGRAM_BINS + 1)
    which = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, HISTOGRAM_BINS - 1)
    counts = np.bincount(which, minlength=HISTOGRAM_BINS)
    order = np.lexsort((ranks, which))
    firsts = np.split(ranks[order], np.cumsum(counts)[:-1])
    marked = {int(b) for b in which[np.isin(ranks, list(highlight))]}
    width, height, left, bottom = 1100, 220, 56, 24
    ticks = _ticks(float(counts.max()) * 1.05)
    top = ticks[-1]
    slot = (width - left - 10) / HISTOGRAM_BINS
    bars = []
    for i, (count, members) in enumerate(zip(counts, firsts)):
        if not count:
            continue
        h = count / top * (height - 10)
        names = ", ".join(str(r) for r in members[:5]) + (", ..." if count > 5 else "")
        bars.append(
            Bar(
                left + i * slot + slot * 0.1,
                height - h,
                slot * 0.8,
                h,
                "var(--c2)" if i in marked else "var(--c1)",
                f"{_num(edges[i], 2)} - {_num(edges[i + 1], 2)} {unit}: {count:,} ranks ({names})",
            )
        )
    grid = [(height - tick / top * (height - 10), f"{tick:,.0f}") for tick in ticks]
    xlabels = [(left + i * slot, _num(edges[i], 2)) for i in range(0, HISTOGRAM_BINS + 1, 10)]
    where = f"; {ref_label} {_num(reference, 2)} {unit}" if reference is not None else ""
    return Block(
        chart=Chart(width, height, left, bottom, grid, bars, xlabels, None, "ranks"),
        note=f"{len(values):,} ranks by {unit}, in {HISTOGRAM_BINS} bins from {_num(lo, 2)} to {_num(hi, 2)}{where}; "
        "a bin with a slow worker in red",
    )


def _per_rank_chart(
    ranks: np.ndarray,
    values: np.ndarray,
    highlight: set[int],
    unit: str,
    reference: float | None = None,
    ref_label: str = "median",
) -> Block:
    """A bar per rank, or past MAX_BARS ranks their distribution; `highlight` holds rank numbers."""
    if len(ranks) > MAX_BARS:
        return _histogram(values, ranks, highlight, unit, reference, ref_label)
    positions = {int(r): i for i, r in enumerate(ranks)}
    return _bar_chart(
        [f"rank {r}" for r in ranks],
        values,
        {positions[r] for r in highlight if r in positions},
        unit,
        reference,
        ref_label,
    )


def _collective_share_chart(tables: RankTables, step_total_us: pd.Series) -> Block:
    """CPU-only traces: the share of each rank's steps spent in collectives (the rank with the
    lowest share is the one the others wait for)."""
    c = tables.collectives
    if c.empty:
        return Block(note="no GPU time and no collectives to break the steps down by")
    share = (100.0 * tables.collective_share()).reindex(step_total_us.index).fillna(0.0)
    chart = _per_rank_chart(share.index.to_numpy(), share.to_numpy(), set(), "% in collectives")
    return Block(
        chart=chart.chart,
        note=chart.note,
        before="No GPU work in these traces: share of each rank's steps spent in collectives "
        "(the rank that spends least there is the one the others wait for).",
    )


def _stacked_chart(tables: RankTables, slow: set[int]) -> Block:
    s = tables.steps
    if s.empty or s["durationUs"].sum() <= 0:
        return Block(note="no steps in the traces")
    per = s.groupby("rank")[[c for c, _, _ in _SEGMENTS] + ["durationUs", "stageUs"]].sum()
    if not per[[c for c, _, _ in _SEGMENTS]].to_numpy().any():
        return _collective_share_chart(tables, per["durationUs"])
    note = ""
    if len(per) > MAX_BARS:
        # The rank at each percentile of the captured time, and the slow workers: the spread of
        # thousands of ranks in a hundred bars.
        ordered = per.sort_values("stageUs", kind="stable")
        picked = ordered.index[np.unique(np.linspace(0, len(ordered) - 1, 101).round().astype(int))]
        note = (
            f"{len(per):,} ranks: the rank at each percentile of captured step time (slowest right), "
            "and the slow workers; every rank is in step_trace_time.csv"
        )
        per = per.loc[sorted(set(picked) | (slow & set(per.index)), key=lambda r: (float(per.at[r, "stageUs"]), r))]
    width, height, left, bottom = 1100, 200, 56, 24
    slot = (width - left - 10) / len(per)
    bar = max(1.0, slot * 0.8)
    grid = [(height - frac * (height - 10), f"{frac * 100:.0f}%") for frac in (0, 0.5, 1.0)]
    bars = []
    for i, (rank, row) in enumerate(per.iterrows()):
        total = row["stageUs"] or 1.0
        y = float(height)
        x = left + i * slot + (slot - bar) / 2
        for column, label, colour in _SEGMENTS:
            h = min(row[column] / total, 1.0) * (height - 10)
            y -= h
            bars.append(Bar(x, y, bar, h, colour, f"rank {rank}: {label} {100 * row[column] / total:.1f}%"))
    every = max(1, int(np.ceil(len(per) / 40)))
    xlabels = [(left + i * slot + slot / 2, str(per.index[i])) for i in range(0, len(per), every)]
    return Block(
        chart=Chart(width, height, left, bottom, grid, bars, xlabels, legend=[(label, c) for _, label, c in _SEGMENTS]),
        note=note,
    )


def _findings(full: list[Finding], limit: int = 50) -> Block:
    if not full:
        return Block(note="nothing to report")
    rows = [
        [
            Cell(f.severity, badge=f.severity),
            Cell(f.category),
            Cell(ranks_text(f.ranks).removeprefix("ranks ").removeprefix("rank ") if f.ranks else ""),
            Cell(f.message),
        ]
        for f in full[:limit]
    ]
    more = f"{len(full) - limit} more findings in diagnosis.json" if len(full) > limit else ""
    return Block(table=Table(["severity", "category", "ranks", "finding"], rows), note=more)


@dataclass(frozen=True)
class SlowWorker:
    rank: int
    facts: str
    kernels: Table | None


def _slow_workers(full: list[Finding]) -> list[SlowWorker]:
    """Each slow worker's evidence: the kernels that cost it most, by how much, and its votes."""
    workers = []
    for f in (f for f in full if f.category == "slow-worker" and f.ranks):
        d = f.data
        facts = [f"slowdown {d['slowdown']:.2f}x"] if "slowdown" in d else []
        if d.get("confidence") is not None:
            facts.append(f"confidence {d['confidence']:.2f}")
        if d.get("cause"):
            facts.append(
                f"cause {function_text(d['cause']['function'])}: +{d['cause']['excessUsPerStep'] / 1000:,.1f} ms/step"
            )
        if d.get("stepRatio"):
            facts.append(f"step time {d['stepRatio']:.2f}x its peers")
        if d.get("kernelRatio"):
            facts.append(f"kernel time {d['kernelRatio']:.2f}x its peers")
        if d.get("voteShare"):
            facts.append(
                f"last at {d['votes']} of {d['rounds']} matched collectives; others wait "
                f"{d['peersWaitUsPerStep'] / 1000:,.1f} ms/step"
            )
        rows = [
            [
                _kernel_name(k["name"]),
                Cell(k["type"]),
                Cell(f"{k['ratio']:.2f}x", "n"),
                Cell(_num(k["excessUsPerStep"] / 1000, 2), "n"),
            ]
            for k in d.get("slowKernels", [])
        ]
        workers.append(
            SlowWorker(
                f.ranks[0],
                "; ".join(facts),
                Table(["kernel", "type", "time vs peers", "extra ms/step"], rows) if rows else None,
            )
        )
    return workers


def _hangs(full: list[Finding]) -> Table | None:
    """Where each rank that reported a hang is stuck, culprits first, with its main-thread stack."""
    hangs = [f for f in full if f.category == "hang" and "stuckAt" in f.data]
    if not hangs:
        return None
    data = hangs[0].data
    culprits = {r for f in hangs if "culprit" in f.message for r in f.ranks}
    order = sorted(data["stuckAt"], key=lambda r: (int(r) not in culprits, int(r)))
    rows = [
        [
            Cell(str(r), "n"),
            Cell("culprit" if int(r) in culprits else ""),
            Cell(data["stuckAt"][r], "name"),
            Cell(kind="name", lines=tuple(str(data["stacks"].get(r, "")).split(" > "))),
        ]
        for r in order
    ]
    return Table(
        ["rank", "", "innermost user frame", "main thread (outermost first)"],
        rows,
        ["slow" if int(r) in culprits else "" for r in order],
    )


def _kernel_name(name: str) -> Cell:
    return Cell(short(name, 90), "name", full=name)


def _kernels(op_statistic: pd.DataFrame, limit: int = 20) -> Block:
    if op_statistic.empty:
        return Block(note="no GPU kernels in the traces")
    rows = [
        [
            _kernel_name(str(r["OP Type"])),
            Cell(str(r["Core Type"])),
            Cell(f"{int(r['Count']):,}", "n"),
            Cell(_num(r["Total Time(us)"] / 1000, 2), "n"),
            Cell(_num(r["Avg Time(us)"], 1), "n"),
            Cell(_num(r["Ratio(%)"], 1), "n"),
            Cell(str(int(r["Ranks"])), "n"),
        ]
        for _, r in op_statistic.head(limit).iterrows()
    ]
    return Block(table=Table(["kernel", "type", "count", "total ms", "avg us", "share %", "ranks"], rows))


def _functions(tables: RankTables, limit: int = 20) -> Block:
    """Exclusive time per step by thread, the training thread first: another thread's time runs
    beside the step, not in it, and time a thread waits (locks, collectives) is marked as such."""
    f = tables.functions
    if f.empty:
        return Block(note="no Python functions in the traces (capture with withStack)")
    # A function called from several stacks has several rows per rank: one per rank first.
    f = (
        f.assign(msPerStep=tables.per_step(f, "exclusiveUs") / 1000.0)
        .groupby(["thread", "name", "rank"], as_index=False)["msPerStep"]
        .sum()
    )
    g = f.groupby(["thread", "name"])["msPerStep"]
    stats = pd.DataFrame(
        {"median": g.median(), "max": g.max(), "ranks": g.count(), "worst": f.loc[g.idxmax(), "rank"].to_numpy()}
    ).reset_index()
    stats["training"] = stats["thread"] == MAIN_THREAD
    stats = stats.sort_values(["training", "max"], ascending=False)
    stats = pd.concat([stats[stats["training"]].head(limit), stats[~stats["training"]].head(limit)])
    rows = [
        [
            Cell(r["thread"] if r["thread"] == MAIN_THREAD else f"thread {function_text(r['thread'])}"),
            Cell(function_text(str(r["name"])), "name", waiting=bool(WAITING.search(str(r["name"])))),
            Cell(_num(r["median"], 2), "n"),
            Cell(_num(r["max"], 2), "n"),
            Cell(str(int(r["worst"])), "n"),
            Cell(str(int(r["ranks"])), "n"),
        ]
        for _, r in stats.iterrows()
    ]
    own = (
        tables.ownUs.sum() / max(float(tables.ranks["steps"].clip(lower=1).sum()), 1.0) / 1000.0
        if len(tables.ownUs)
        else 0.0
    )
    note = (
        f"stepscope's agent and the profiler: {own:,.2f} ms/step per rank on the training thread, left out"
        if own
        else ""
    )
    return Block(
        table=Table(
            ["thread", "function (exclusive time)", "median ms/step", "max ms/step", "max on rank", "ranks"], rows
        ),
        note=note,
    )


def _communication(communication: pd.DataFrame) -> Block:
    if communication.empty:
        return Block(note="no collectives in the traces")
    g = communication.groupby("Collective")
    bandwidth = communication["Bus Bandwidth(GB/s)"].where(
        communication["Bus Bandwidth(GB/s)"] > 0
    )  # 0: the trace has no message sizes
    stats = pd.DataFrame(
        {
            "count": g["Count"].median(),
            "median": g["Median Time(us)"].median(),
            "bwmin": bandwidth.groupby(communication["Collective"]).min(),
            "bwmed": bandwidth.groupby(communication["Collective"]).median(),
            "ranks": g["Rank"].nunique(),
        }
    )
    rows = [
        [
            Cell(str(kind)),
            Cell(_num(r["count"], 0), "n"),
            Cell(_num(r["median"], 1), "n"),
            Cell(_num(r["bwmed"], 1), "n"),
            Cell(_num(r["bwmin"], 1), "n"),
            Cell(str(int(r["ranks"])), "n"),
        ]
        for kind, r in stats.iterrows()
    ]
    return Block(
        table=Table(
            ["collective", "count per rank", "median us", "bus GB/s (median)", "bus GB/s (lowest rank)", "ranks"], rows
        )
    )


_FAMILY_COLOURS = {
    "gemm": "var(--c1)",
    "conv": "var(--c4)",
    "attention": "var(--c3)",
    "elementwise": "var(--c2)",
    "reduction": "var(--c5)",
    "normalization": "#8b5cf6",
}


def _roofline(efficiency: pd.DataFrame, limit: int = 60) -> Block:
    """The ops of most GPU time (summed over ranks) on the roofline of the ranks' most common
    device: achieved TFLOP/s over arithmetic intensity, log-log, a roof per dtype seen."""
    ops = efficiency[
        (efficiency["Kind"] == "op")
        & (efficiency["Device"] != "")
        & (efficiency["FLOPs"] > 0)
        & (efficiency["Bytes"] > 0)
    ]
    if ops.empty:
        return Block(
            note=(
                "no op with recorded shapes ran on a device of the table (capture with record_shapes to see kernel "
                "efficiency)"
            )
        )
    device = ops["Device"].mode().iloc[0]
    ops = ops[ops["Device"] == device]
    g = ops.groupby(["Name", "Input Dims", "Dtype", "Family"], as_index=False)[["GPU Time(us)", "FLOPs", "Bytes"]].sum()
    g = g.merge(ops.groupby("Dtype", as_index=False)[["Peak TFLOP/s", "Peak TB/s"]].max(), on="Dtype")
    g = g.nlargest(limit, "GPU Time(us)")
    ai = g["FLOPs"].to_numpy() / g["Bytes"].to_numpy()
    achieved = g["FLOPs"].to_numpy() / g["GPU Time(us)"].to_numpy() / 1e6
    bandwidth = float(g["Peak TB/s"].max())
    peaks = {d: float(p) for d, p in zip(g["Dtype"], g["Peak TFLOP/s"]) if p > 0}
    ridges = [p / bandwidth for p in peaks.values()] if bandwidth > 0 else []
    x_lo, x_hi = np.floor(np.log10(min(ai.min(), *ridges))), np.ceil(np.log10(max(ai.max(), *ridges))) + 0.5
    y_lo = np.floor(np.log10(max(min(achieved.min(), bandwidth * 10**x_lo) if bandwidth else achieved.min(), 1e-6)))
    y_hi = np.ceil(np.log10(2 * max([achieved.max(), *peaks.values()])))  # room above the highest roof for its label
    width, height, left, bottom = 1100, 340, 64, 30

    def x(v: float) -> float:
        return left + (np.log10(v) - x_lo) / (x_hi - x_lo) * (width - left - 20)

    def y(v: float) -> float:
        return 10 + (y_hi - np.log10(max(v, 10**y_lo))) / (y_hi - y_lo) * (height - 20)

    roofs = []
    for dtype, peak in sorted(peaks.items(), key=lambda kv: -kv[1]):
        ridge = peak / bandwidth
        points = [(10**x_lo, bandwidth * 10**x_lo), (ridge, peak), (10**x_hi, peak)]
        roofs.append(
            (
                " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in points),
                f"{dtype.removeprefix('c10::')} {peak:,.0f} TFLOP/s",
                x(10**x_hi) - 4,
                y(peak) - 4,
            )
        )
    total = float(g["GPU Time(us)"].sum())
    dots = []
    for (_, r), a, t in zip(g.iterrows(), ai, achieved):
        bound = min(peaks.get(r["Dtype"], np.inf), a * bandwidth) if bandwidth else peaks.get(r["Dtype"], np.nan)
        title = (
            f"{r['Name']} {r['Input Dims']} {r['Dtype']}: {t:,.2f} TFLOP/s at {a:,.1f} FLOP/byte, "
            f"{100 * t / bound:.0f}% of the roofline, {r['GPU Time(us)'] / 1000:,.2f} ms"
        )
        dots.append(
            (
                x(a),
                y(t),
                3 + 9 * np.sqrt(r["GPU Time(us)"] / total),
                _FAMILY_COLOURS.get(r["Family"], "var(--c5)"),
                title,
            )
        )
    xticks = [(x(10.0**e), f"{10.0**e:g}") for e in range(int(x_lo), int(np.floor(x_hi)) + 1)]
    yticks = [(y(10.0**e), f"{10.0**e:g}") for e in range(int(y_lo), int(y_hi) + 1)]
    legend = [(f, c) for f, c in _FAMILY_COLOURS.items() if f in set(g["Family"])]
    return Block(
        roofline=Roofline(width, height, left, bottom, xticks, yticks, roofs, dots, legend),
        before=f"{device}, {bandwidth:,.2f} TB/s: achieved TFLOP/s of the {len(g)} ops of most GPU time (FLOPs and "
        "bytes from their recorded shapes) over their arithmetic intensity; dot area by GPU time, hover for figures. "
        "Copies and fills (no FLOPs) are in kernel_efficiency.csv.",
    )


_BOUND_COLUMNS = (
    ("cpu_bound", "CPU"),
    ("gpu_compute_bound", "GPU compute"),
    ("gpu_communication_bound", "GPU communication"),
    ("gpu_kernel_launch_overhead", "launch delay"),
    ("gpu_kernel_kernel_overhead", "gaps between kernels"),
)


def _critical_path(path: pd.DataFrame, first: set[int], contributors: int = 3) -> Block:
    """Per rank: the critical path's length, its share by what bounds it, and what lies longest on it;
    past MAX_RANK_ROWS ranks, those of `first` (the slow workers) and the longest paths."""
    if path.empty:
        return Block(
            note="no critical path: the traces hold no CPU ops, or no kernel with its launching call (Ascend captures)"
        )
    lengths = path.groupby("Rank", sort=True)["Path(us)"].first()
    total = len(lengths)
    if total > MAX_RANK_ROWS:
        order = [r for r in lengths.index if r in first] + lengths.sort_values(
            ascending=False, kind="stable"
        ).index.tolist()
        path = path[path["Rank"].isin(list(dict.fromkeys(order))[:MAX_RANK_ROWS])]
    rows = []
    for rank, r in path.groupby("Rank", sort=True):
        shares = r[r["Name"] == ""].set_index("Bound By")["Path Share(%)"]
        top = r[r["Name"] != ""].head(contributors)
        rows.append(
            [
                Cell(str(rank), "n"),
                Cell(_num(float(r["Path(us)"].iloc[0]) / 1000, 2), "n"),
                *[Cell(_num(float(shares.get(bound, 0.0)), 1), "n") for bound, _ in _BOUND_COLUMNS],
                Cell(
                    "; ".join(f"{short(str(t['Name']), 60)} {t['Path Share(%)']:.1f}%" for _, t in top.iterrows()),
                    "name",
                ),
            ]
        )
    held = (
        f"{len(rows)} of {total:,} ranks here (the slow workers and the longest paths); " if len(rows) < total else ""
    )
    return Block(
        table=Table(["rank", "path ms", *[f"{label} %" for _, label in _BOUND_COLUMNS], "longest on the path"], rows),
        note="The longest chain of dependent CPU ops, kernel launches, kernels and synchronisations over the profiled "
        f"steps (the whole trace without steps; HTA's critical path); {held}critical_path.csv has each rank's top "
        "contributors, the merged trace each rank's path as a track.",
    )


@dataclass(frozen=True)
class RankSearch:
    """Every rank's row of the ranks table, for the page's search (columns, pods and nodes by index)."""

    data: dict
    shown: int
    total: int


def _ranks(tables: RankTables, diagnosis: Diagnosis, problems: dict[int, list[str]]) -> tuple[Block, RankSearch | None]:
    """The ranks table: every rank, or past MAX_RANK_ROWS the slow workers, the ranks with
    problems and the slowest, with the search over all of them."""
    slow = {w.rank: w for w in diagnosis.slowWorkers}
    ratios, _ = kernel_ratios(tables)
    r = tables.ranks.assign(ratio=tables.ranks["rank"].map(ratios).to_numpy(dtype=float))
    missing = sorted(set(problems) - set(r["rank"]))
    search = None
    if len(r) + len(missing) > MAX_RANK_ROWS:
        search = _rank_search(r, {k: w.slowdown for k, w in slow.items()}, problems, missing)
        first = list(slow) + sorted(problems)
        first += r.sort_values("stepUs", ascending=False, kind="stable")["rank"].tolist()
        keep = list(dict.fromkeys(int(x) for x in first))[:MAX_RANK_ROWS]
        r = r[r["rank"].isin(keep)].set_index("rank").loc[[k for k in keep if k in set(r["rank"])]].reset_index()
        missing = [k for k in keep if k in set(missing)]
    rows, classes = [], []
    for rank, pod, node, step_us, ratio in zip(r["rank"], r["pod"], r["node"], r["stepUs"], r["ratio"]):
        rank = int(rank)
        rows.append(
            [
                Cell(str(rank), "n"),
                Cell(str(pod)),
                Cell(str(node)),
                Cell(_num(step_us / 1000, 2), "n"),
                Cell(_num(float(ratio), 3), "n"),
                Cell(_num(slow[rank].slowdown, 2) if rank in slow else "", "n"),
                Cell("; ".join(problems.get(rank, []))),
            ]
        )
        classes.append("slow" if rank in slow else "")
    for rank in missing:
        rows.append(
            [
                Cell(str(rank), "n"),
                Cell(),
                Cell(),
                Cell("–", "n"),
                Cell("–", "n"),
                Cell("", "n"),
                Cell("; ".join(problems[rank])),
            ]
        )
        classes.append("")
    note = (
        (
            f"{len(rows)} of {search.total:,} ranks: the slow workers, ranks with problems and the slowest median "
            "step; search for any rank or pod above, every rank is in diagnosis.json (perRank)"
        )
        if search
        else ""
    )
    return Block(
        table=Table(
            ["rank", "pod", "node", "median step ms", "kernel time vs peers", "slowdown", "problems"], rows, classes
        ),
        note=note,
    ), search


def _rank_search(
    r: pd.DataFrame, slowdown: dict[int, float], problems: dict[int, list[str]], missing: list[int]
) -> RankSearch:
    """The ranks table's columns for the page's search: pods and nodes as indices into their
    distinct names (a pod holds several ranks), figures rounded, each rank's problems cut short."""
    pods, pod_names = pd.factorize(r["pod"])
    nodes, node_names = pd.factorize(r["node"])

    def figures(values: pd.Series, digits: int) -> list[float | None]:
        return [None if v != v else v for v in values.round(digits).tolist()]

    text = {str(k): "; ".join(v)[:MAX_PROBLEM_CHARS] for k, v in problems.items()}
    data = {
        "rank": r["rank"].astype(int).tolist() + missing,
        "pod": pods.tolist() + [-1] * len(missing),
        "node": nodes.tolist() + [-1] * len(missing),
        "pods": [str(p) for p in pod_names],
        "nodes": [str(n) for n in node_names],
        "stepMs": figures(r["stepUs"] / 1000.0, 2) + [None] * len(missing),
        "ratio": figures(r["ratio"], 3) + [None] * len(missing),
        "slowdown": {str(k): round(v, 2) for k, v in slowdown.items()},
        "problems": text,
    }
    return RankSearch(data, min(len(r) + len(missing), MAX_RANK_ROWS), len(r) + len(missing))


def render_html(
    *,
    title: str,
    source: str,
    generated: str,
    diagnosis: Diagnosis,
    full: list[Finding],
    tables: RankTables,
    csv: dict[str, pd.DataFrame],
    problems: dict[int, list[str]],
    total_ranks: int,
    merged: str = "merged.trace.json.gz: the ranks' traces (open it in Perfetto).",
    held: str = "",
) -> str:
    step = diagnosis.stepTimeMs
    b = diagnosis.breakdown
    slow = {w.rank for w in diagnosis.slowWorkers}
    ranks = tables.ranks.sort_values("rank")
    ratios, _ = kernel_ratios(tables)
    cards = [
        ("ranks analysed", f"{len(ranks)} / {total_ranks}"),
        ("step time (median)", f"{step.median:,.1f} ms" if step else "–"),
        ("step time (min – max)", f"{step.min:,.1f} – {step.max:,.1f} ms" if step else "–"),
        ("slow workers", ", ".join(f"rank {w.rank}" for w in diagnosis.slowWorkers) or "none"),
    ]
    if diagnosis.confidence is not None:
        cards.append(("confidence", f"{diagnosis.confidence:.2f}"))
    if b:
        cards += [
            ("compute", f"{b.computePct:.1f}%"),
            ("comm. not overlapped", f"{b.commNotOverlappedPct:.1f}%"),
            ("idle", f"{b.idlePct:.1f}%"),
        ]
    kernel_chart = (
        _per_rank_chart(ratios.index.to_numpy(), ratios.to_numpy(), slow, "x peers", 1.0, "peers")
        if len(ratios)
        else Block(note="needs GPU kernels on two or more ranks")
    )
    rank_table, search = _ranks(tables, diagnosis, problems)
    return _TEMPLATES.get_template("report.html").render(
        title=title,
        source=source,
        generated=generated,
        top=full[0].severity if full else "info",
        summary=diagnosis.summary,
        cards=cards,
        findings=_findings(full),
        hangs=_hangs(full),
        slow_workers=_slow_workers(full),
        step_chart=_per_rank_chart(
            ranks["rank"].to_numpy(), ranks["stepUs"].to_numpy() / 1000.0, slow, "ms", step.median if step else None
        ),
        kernel_chart=kernel_chart,
        breakdown_chart=_stacked_chart(tables, slow),
        kernels=_kernels(csv["op_statistic.csv"]),
        functions=_functions(tables),
        communication=_communication(csv["communication.csv"]),
        ranks=rank_table,
        search=search,
        merged=merged,
        held=held,
        efficiency=_roofline(csv["kernel_efficiency.csv"])
        if "kernel_efficiency.csv" in csv
        else Block(note="no kernel efficiency table"),
        critical_path=_critical_path(csv["critical_path.csv"], slow)
        if "critical_path.csv" in csv
        else Block(note="no critical path table"),
    )
