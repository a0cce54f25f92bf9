"""The report's CSV tables, in the Ascend profiler's shapes where it has one (step_trace_time,
kernel_details, op_statistic, communication), one row per rank and item, times in microseconds."""

from __future__ import annotations

import pandas as pd

from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.diagnosis.slow_workers import kernel_ratios
from stepscope.analysis.diagnosis.wording import short

# Past this many ranks, the per-rank kernel tables hold this many ranks (the full figures of every
# rank are in its summary, ranks/rank-<r>.summary.arrow).
DETAIL_RANKS = 64


def step_trace_time(tables: RankTables) -> pd.DataFrame:
    s = tables.steps
    return pd.DataFrame(
        {
            "Rank": s["rank"],
            "Step": s["step"],
            "Computing": s["computingUs"],
            "Communication(Not Overlapped)": s["commNotOverlappedUs"],
            "Overlapped": s["overlappedUs"],
            "Communication": s["communicationUs"],
            "Free": s["freeUs"],
            "Stage": s["stageUs"],
            "ProfilerStep Span": s["durationUs"],
            "Idle(HTA)": s["idleUs"],
            "Compute(HTA)": s["computeUs"],
            "Non-compute(HTA)": s["nonComputeUs"],
        }
    ).sort_values(["Rank", "Step"], kind="stable")


def kernel_details(tables: RankTables, ranks: list[int] | None = None) -> pd.DataFrame:
    """Each kernel of each rank (of `ranks` where given) with its peers' average time."""
    k = tables.kernels if ranks is None else tables.kernels[tables.kernels["rank"].isin(ranks)]
    out = pd.DataFrame(
        {
            "Rank": k["rank"],
            "Name": k["name"],
            "Type": k["type"],
            "Count": k["count"],
            "Total Time(us)": k["sumUs"],
            "Avg Time(us)": k["meanUs"],
            "Median Time(us)": k["medianUs"],
            "Min Time(us)": k["minUs"],
            "Max Time(us)": k["maxUs"],
            "Std(us)": k["stdUs"],
            "Not Overlapped(us)": k["notOverlappedUs"],
            "Bottleneck Ratio": k["bottleneckRatio"],
            "Short Name": _short_names(k["name"]),
        }
    )
    _, compared = kernel_ratios(tables)
    if not compared.empty:
        # kernel_ratios' rows are rows of tables.kernels, under their labels.
        peers = compared[["peerMeanUs", "ratio"]].reindex(k.index)
        out["Peers Avg Time(us)"] = peers["peerMeanUs"].to_numpy()
        out["Ratio To Peers"] = peers["ratio"].to_numpy()
    return out.sort_values(["Rank", "Total Time(us)"], ascending=[True, False], kind="stable")


def _short_names(names: pd.Series) -> pd.Series:
    """The readable form of each kernel name (wording.short), beside the full one; once per name,
    as every rank repeats the same kernels."""
    return names.map({n: short(str(n), 120) for n in names.unique()})


OP_STATISTIC_COLUMNS = [
    "OP Type",
    "Core Type",
    "Count",
    "Total Time(us)",
    "Min Time(us)",
    "Avg Time(us)",
    "Max Time(us)",
    "Ratio(%)",
    "Ranks",
    "Short Name",
]


def op_statistic(tables: RankTables) -> pd.DataFrame:
    """Kernels over all ranks: how often, how long, and their share of all kernel time."""
    k = tables.kernels
    if k.empty:
        return pd.DataFrame(columns=OP_STATISTIC_COLUMNS)
    g = k.groupby(["name", "type"], sort=False)
    out = pd.DataFrame(
        {
            "Count": g["count"].sum(),
            "Total Time(us)": g["sumUs"].sum(),
            "Min Time(us)": g["minUs"].min(),
            "Max Time(us)": g["maxUs"].max(),
            "Ranks": g["rank"].nunique(),
        }
    ).reset_index()
    out["Avg Time(us)"] = out["Total Time(us)"] / out["Count"].where(out["Count"] > 0, 1)
    total = out["Total Time(us)"].sum()
    out["Ratio(%)"] = 100.0 * out["Total Time(us)"] / (total if total > 0 else 1.0)
    out = out.rename(columns={"name": "OP Type", "type": "Core Type"})
    out["Short Name"] = _short_names(out["OP Type"])
    return out[OP_STATISTIC_COLUMNS].sort_values("Total Time(us)", ascending=False, kind="stable")


def communication(tables: RankTables) -> pd.DataFrame:
    c = tables.collectives
    return pd.DataFrame(
        {
            "Rank": c["rank"],
            "Collective": c["kind"],
            "Count": c["count"],
            "Total Time(us)": c["sumUs"],
            "Median Time(us)": c["medianUs"],
            "Bytes": c["bytes"],
            "Bus Bandwidth(GB/s)": c["busBandwidthGBs"],
            "Algorithm": c["algorithm"],
            "Protocol": c["protocol"],
            "Bottleneck Ratio": c["bottleneckRatio"],
        }
    ).sort_values(["Rank", "Total Time(us)"], ascending=[True, False], kind="stable")


EFFICIENCY_COLUMNS = [
    "Rank",
    "Kind",
    "Name",
    "Short Name",
    "Family",
    "Input Dims",
    "Dtype",
    "Count",
    "GPU Time(us)",
    "FLOPs",
    "Bytes",
    "FLOP/Byte",
    "TFLOP/s",
    "TB/s",
    "Peak TFLOP/s",
    "Peak TB/s",
    "% of Roofline",
    "Device",
    "Related",
]


def kernel_efficiency(tables: RankTables) -> pd.DataFrame:
    """Each rank's ops (Kind op) and kernels (Kind kernel) with FLOPs and bytes from shapes,
    achieved rates and their place under the device's roofline (statistics/efficiency.py)."""
    e = tables.efficiency
    names = {
        "rank": "Rank",
        "kind": "Kind",
        "name": "Name",
        "family": "Family",
        "shapes": "Input Dims",
        "dtype": "Dtype",
        "count": "Count",
        "gpuUs": "GPU Time(us)",
        "flops": "FLOPs",
        "bytes": "Bytes",
        "tflops": "TFLOP/s",
        "tbs": "TB/s",
        "peakTflops": "Peak TFLOP/s",
        "peakTbs": "Peak TB/s",
        "pctOfPeak": "% of Roofline",
        "related": "Related",
    }
    if e.empty:
        t = pd.DataFrame(columns=[*names.values(), "Device"])
    else:
        t = e[list(names)].rename(columns=names)
        t["Device"] = e["rank"].map(tables.ranks.set_index("rank")["device"]).to_numpy()
    t["Short Name"] = _short_names(t["Name"]) if len(t) else pd.Series(dtype=str)
    t["FLOP/Byte"] = t["FLOPs"] / t["Bytes"].where(t["Bytes"] > 0)
    return t[EFFICIENCY_COLUMNS].sort_values(
        ["Rank", "Kind", "GPU Time(us)"], ascending=[True, False, False], kind="stable"
    )


def detail_ranks(tables: RankTables, first: list[int], limit: int = DETAIL_RANKS) -> list[int] | None:
    """The ranks whose every kernel and op the detail tables hold: all of them up to `limit`,
    else `first` (the ranks that explain the diagnosis) and the longest median steps up to it;
    None for all."""
    ranks = tables.ranks
    if len(ranks) <= limit:
        return None
    slowest = ranks.sort_values("stepUs", ascending=False, kind="stable")["rank"].astype(int).tolist()
    return list(dict.fromkeys([r for r in first if r in set(ranks["rank"])] + slowest))[:limit]


def report_tables(tables: RankTables, detail: list[int] | None = None) -> dict[str, pd.DataFrame]:
    """File name (under report/) -> table; kernel_details and kernel_efficiency of the `detail`
    ranks only where given (one row per rank and kernel is millions of rows at fleet scale)."""
    kernels, efficiency = kernel_details(tables, detail), kernel_efficiency(tables)
    if detail is not None:
        efficiency = efficiency[efficiency["Rank"].isin(detail)]
    return {
        "step_trace_time.csv": step_trace_time(tables),
        "kernel_details.csv": kernels,
        "op_statistic.csv": op_statistic(tables),
        "communication.csv": communication(tables),
        "kernel_efficiency.csv": efficiency,
        "critical_path.csv": critical_path(tables),
    }


CRITICAL_PATH_COLUMNS = ["Rank", "Bound By", "Name", "Short Name", "Time(us)", "Path Share(%)", "Path(us)"]


def critical_path(tables: RankTables) -> pd.DataFrame:
    """Each rank's critical path (statistics/critical_path.py): a row per bound with Name "" (the
    path's time by what bounds it), then its top contributors."""
    names = {"rank": "Rank", "boundBy": "Bound By", "name": "Name", "us": "Time(us)", "pathUs": "Path(us)"}
    t = (
        tables.criticalPath.rename(columns=names)
        if not tables.criticalPath.empty
        else pd.DataFrame(columns=list(names.values()))
    )
    t["Short Name"] = _short_names(t["Name"]) if len(t) else pd.Series(dtype=str)
    t["Path Share(%)"] = (100 * t["Time(us)"] / t["Path(us)"].where(t["Path(us)"] > 0)).round(2)
    return t[CRITICAL_PATH_COLUMNS]
