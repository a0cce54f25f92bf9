"""Per-category checks over the rank tables: memory operations and runtime calls (PerfTracker's
1 % rule), kernels slower than on their peers, unusual Python functions, communication, launch
overhead and CPU-only traces. Each returns model.Finding values."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.causes import BACKWARD, WAITING
from stepscope.analysis.diagnosis.consistency import GPU_RUNTIME, HOST_AHEAD, HOST_BOUND, LAUNCH_BOUND
from stepscope.analysis.diagnosis.outliers import falls_behind, peer_median, stands_out, stands_out_in_groups
from stepscope.analysis.diagnosis.rank_tables import MAIN_THREAD, RankTables
from stepscope.analysis.diagnosis.slow_workers import KERNEL_SLOWER
from stepscope.analysis.diagnosis.wording import function_text, ms, ranks_text, short
from stepscope.analysis.model import Finding

# PerfTracker: a memory operation or runtime call whose time not overlapped with GPU compute is
# above 1 % of the captured wall time is abnormal; how loud it is then follows its share
# (consistency.WARNING_SHARE).
BOTTLENECK_RATIO = 0.01
# A Python function stands out when it takes at least this many times its peers' time...
FUNCTION_RATIO = 2.0
# ... and at least this share of the median step (or 1 ms) more.
FUNCTION_MIN_SHARE = 0.05
NOT_OVERLAPPED_SHARE = 0.10
BANDWIDTH_BEHIND = 0.7
SHORT_KERNEL_SHARE = 0.5
SHORT_KERNELS_PER_STEP = 100
LAUNCH_DELAY_US = 100.0
IDLE_PCT = 10.0  # GPU idle share (HTA temporal breakdown) worth a finding
HOST_WAIT_SHARE = 0.5  # ... when at least this much of the idle time is waiting for the host
CPU_COLLECTIVE_SHARE = 0.20


def _median_step_us(tables: RankTables) -> float:
    steps = tables.step_us.dropna()
    if len(steps):
        return float(steps.median())
    captured = tables.ranks["capturedUs"]
    return float(captured.median()) if len(captured) else 0.0


def one_percent_rule(frame: pd.DataFrame, key: str, category: str, what: str) -> list[Finding]:
    """Memory operations or runtime calls whose bottleneck ratio is above 1 %, one finding per kind."""
    if frame.empty:
        return []
    over = frame[frame["bottleneckRatio"] > BOTTLENECK_RATIO]
    out = []
    for name, rows in over.groupby(key, sort=False):
        worst = float(rows["bottleneckRatio"].max())
        med = float(rows["bottleneckRatio"].median())
        ranks = rows["rank"].tolist()
        out.append(
            Finding(
                "warning",
                category,
                ranks,
                f"{what} {name} take {100 * med:.1f}% of the captured time without overlapping GPU compute on "
                f"{ranks_text(ranks)} (up to {100 * worst:.1f}%): overlap them with compute or remove them",
                med,
                {
                    "kind": name,
                    "bottleneckRatio": {
                        str(r): round(float(v), 5) for r, v in zip(rows["rank"], rows["bottleneckRatio"])
                    },
                    "claim": GPU_RUNTIME if category == "launch" else None,
                },
            )
        )
    return out


def slower_kernels(kernels: pd.DataFrame, median_step_us: float, already: set[int]) -> list[Finding]:
    """Kernels that run far longer on some ranks than on their peers, one finding per kernel.
    `kernels` is slow_workers.kernel_ratios' table; ranks already named as slow workers carry
    their kernels in that finding."""
    if kernels.empty:
        return []
    # Arrays of the millions of rows, the frame filtered once, to the flagged ones.
    others = ~kernels["rank"].isin(already).to_numpy()
    z_ok = np.zeros(len(kernels), dtype=bool)
    z_ok[others] = stands_out_in_groups(
        kernels["meanUs"].to_numpy()[others], pd.factorize(kernels["name"])[0][others], min_ratio=KERNEL_SLOWER
    )
    flagged = kernels[z_ok & (kernels["excessUsPerStep"].to_numpy() >= 0.01 * median_step_us)]
    out = []
    for name, rows in flagged.groupby("name", sort=False):
        ranks = rows["rank"].tolist()
        ratio = float(rows["ratio"].median())
        excess = float(rows["excessUsPerStep"].max())
        out.append(
            Finding(
                "warning",
                "kernel",
                ranks,
                f"kernel {short(str(name))} runs {ratio:.2f}x longer on {ranks_text(ranks)} than on the other ranks "
                f"(+{ms(excess)}/step)",
                excess / median_step_us if median_step_us else 0.0,
                {"kernel": name, "ratio": {str(r): round(float(v), 3) for r, v in zip(rows["rank"], rows["ratio"])}},
            )
        )
    return out


def top_kernels(tables: RankTables, limit: int = 3) -> list[Finding]:
    """Where the GPU time goes: the kernels with the largest share of all ranks' kernel time."""
    k = tables.kernels
    if k.empty or k["sumUs"].sum() <= 0:
        return []
    total = k.groupby("name")["sumUs"].sum().sort_values(ascending=False)
    share = total / total.sum()
    # Template instances of one kernel read the same once shortened: they count as one family here.
    families = (
        share.groupby(share.index.map(lambda n: short(str(n), 50)), sort=False).sum().sort_values(ascending=False)
    )
    text = ", ".join(f"{n} {100 * v:.0f}%" for n, v in families.head(limit).items())
    return [
        Finding(
            "info",
            "kernel",
            tables.ranks["rank"].tolist(),
            f"most GPU time goes to {text}",
            0.0,
            {"kernels": [{"name": n, "share": round(float(v), 4)} for n, v in share.head(20).items()]},
        )
    ]


def python_outliers(
    tables: RankTables,
    median_step_us: float,
    slow_ranks: set[int],
    judged: bool = False,
    sampled: frozenset[int] = frozenset(),
) -> list[Finding]:
    """Python functions whose exclusive time on one rank is far above their peers'. Ranks whose
    stacks were sampled (`sampled`) are compared with each other only, never with traced ones as
    if both were exact: a sample's frame holds the time of the C functions under it. On a rank that
    is not slow itself while others are, such a function is most likely where it waits for them
    (DDP's backward blocks on the slow rank's gradients), so it is told as that. Where straggler.py
    has `judged` the job (whether a rank holds it back, and why), they are information only: a
    function that took longer in one step on a busy machine is no finding to act on."""
    f = tables.functions
    ranks = tables.ranks["rank"].to_numpy()
    if f.empty or len(ranks) < 2:
        return []
    f = f[(f["thread"] == MAIN_THREAD) & ~f["name"].str.contains(WAITING) & ~f["name"].str.contains(BACKWARD)]
    f = f.assign(usPerStep=tables.per_step(f, "exclusiveUs"))
    min_excess = max(1000.0, FUNCTION_MIN_SHARE * median_step_us)
    candidates = f.groupby("name")["usPerStep"].max()
    names = candidates.index[candidates >= min_excess]
    if names.empty:
        return []
    f = f[f["name"].isin(names)]
    out = []
    for group in (ranks[~np.isin(ranks, list(sampled))], ranks[np.isin(ranks, list(sampled))]):
        if len(group) >= 2:
            out += _python_outliers(f[f["rank"].isin(group)], group, median_step_us, min_excess, slow_ranks, judged)
    return out


def _python_outliers(
    f: pd.DataFrame, ranks: np.ndarray, median_step_us: float, min_excess: float, slow_ranks: set[int], judged: bool
) -> list[Finding]:
    table = f.pivot_table(index="rank", columns="name", values="usPerStep", aggfunc="sum", fill_value=0.0).reindex(
        ranks, fill_value=0.0
    )
    values = table.to_numpy()
    peers = peer_median(values)
    mask = stands_out(values, min_ratio=FUNCTION_RATIO, min_excess=min_excess)
    out = []
    for i, j in zip(*np.nonzero(mask)):
        rank, name, mine, theirs = int(table.index[i]), str(table.columns[j]), float(values[i, j]), float(peers[i, j])
        times = f"{mine / theirs:.0f}x its peers" if theirs > 0 else "its peers do not spend measurable time there"
        victim = bool(slow_ranks) and rank not in slow_ranks
        waiting = f": probably waiting there for {ranks_text(sorted(slow_ranks))}" if victim else ""
        out.append(
            Finding(
                "info" if victim or judged else "warning",
                "python",
                [rank],
                f"rank {rank} spends {ms(mine)}/step in {function_text(name)}, {times} ({ms(theirs)}/step){waiting}",
                (mine - theirs) / median_step_us if median_step_us else 0.0,
                {"function": name, "usPerStep": round(mine, 1), "peersUsPerStep": round(theirs, 1)},
            )
        )
    return out


def communication(tables: RankTables, median_step_us: float) -> list[Finding]:
    out: list[Finding] = []
    s = tables.steps
    if not s.empty and s["durationUs"].sum() > 0:
        per_rank = s.groupby("rank")[["commNotOverlappedUs", "stageUs"]].sum()
        share = per_rank["commNotOverlappedUs"] / per_rank["stageUs"].where(per_rank["stageUs"] > 0, 1.0)
        high = share[share >= NOT_OVERLAPPED_SHARE]
        if len(high):
            overlap = tables.ranks.set_index("rank")["overlapPct"].reindex(high.index)
            overlap_text = (
                f"; only {overlap.median():.0f}% of communication overlaps compute" if overlap.notna().any() else ""
            )
            out.append(
                Finding(
                    "warning",
                    "communication",
                    high.index.tolist(),
                    f"communication not overlapped with compute takes {100 * high.median():.0f}% of step time on "
                    f"{ranks_text(high.index.tolist())}"
                    f"{overlap_text}: overlap it (bucketed gradients, async collectives) or reduce it",
                    float(high.median()),
                    {"notOverlappedShare": {str(r): round(float(v), 4) for r, v in high.items()}},
                )
            )
    c = tables.collectives
    if not c.empty:
        c = c[c["busBandwidthGBs"] > 0]
        for kind, rows in c.groupby("kind"):
            bw = rows.groupby("rank")["busBandwidthGBs"].median()
            behind = bw[falls_behind(bw.to_numpy(), max_ratio=BANDWIDTH_BEHIND)]
            if len(behind) and len(behind) < len(bw):
                peers = float(bw.drop(behind.index).median())
                out.append(
                    Finding(
                        "warning",
                        "communication",
                        behind.index.tolist(),
                        f"{kind} bus bandwidth on {ranks_text(behind.index.tolist())} is {behind.median():.1f} GB/s, "
                        f"{behind.median() / peers:.1f}x the other ranks' {peers:.1f} GB/s: check its network link",
                        1.0 - float(behind.median()) / peers,
                        {"kind": kind, "busBandwidthGBs": {str(r): round(float(v), 2) for r, v in bw.items()}},
                    )
                )
    return out


def launch_overhead(tables: RankTables) -> list[Finding]:
    r = tables.ranks[tables.ranks["launches"] > 0]
    if r.empty:
        return []
    out = []
    steps = r["steps"].clip(lower=1)
    short_share = r["shortKernels"] / r["launches"]
    many = r[(short_share >= SHORT_KERNEL_SHARE) & (r["shortKernels"] / steps >= SHORT_KERNELS_PER_STEP)]
    if len(many):
        out.append(
            Finding(
                "warning",
                "launch",
                many["rank"].tolist(),
                f"{100 * float(short_share[many.index].median()):.0f}% of kernels are shorter than "
                f"{many['shortKernelThresholdUs'].median():.0f} us "
                f"({float((many['launches'] / steps[many.index]).median()):.0f} launches/step) on "
                f"{ranks_text(many['rank'].tolist())}: "
                "launch overhead dominates; fuse kernels (torch.compile) or use CUDA graphs",
                float(short_share[many.index].median()) / 4,
                {
                    "shortShare": {str(a): round(float(b), 3) for a, b in zip(many["rank"], short_share[many.index])},
                    "claim": LAUNCH_BOUND,
                },
            )
        )
    delayed = r[r["launchDelayMedianUs"] >= LAUNCH_DELAY_US]
    if len(delayed):
        out.append(
            Finding(
                "info",
                "launch",
                delayed["rank"].tolist(),
                f"kernels start {delayed['launchDelayMedianUs'].median():.0f} us after their launch (median) on "
                f"{ranks_text(delayed['rank'].tolist())}: "
                "the GPU queue is full; the host is ahead, so launch overhead is not the limit",
                0.0,
                {"claim": HOST_AHEAD},
            )
        )
    # HTA's idle categories are summed over streams, so they say how the idle time splits, not how much.
    idle_total = (r["hostWaitUs"] + r["kernelWaitUs"] + r["otherIdleUs"]).where(lambda v: v > 0, 1.0)
    host_share = r["hostWaitUs"] / idle_total
    starved = r[(r["idlePct"] >= IDLE_PCT) & (host_share >= HOST_WAIT_SHARE)]
    if len(starved):
        idle, host = float(starved["idlePct"].median()), float(host_share[starved.index].median())
        out.append(
            Finding(
                "warning",
                "launch",
                starved["rank"].tolist(),
                f"the GPU is idle {idle:.0f}% of the time on {ranks_text(starved['rank'].tolist())}, "
                f"{100 * host:.0f}% of that waiting for the host: "
                "the CPU side (data loading, Python, launches, synchronisation) does not keep the GPU fed",
                idle / 100 * host,
                {
                    "idlePct": {str(a): round(float(b), 2) for a, b in zip(starved["rank"], starved["idlePct"])},
                    "claim": HOST_BOUND,
                },
            )
        )
    return out


def cpu_only(tables: RankTables, median_step_us: float, slow_ranks: set[int]) -> list[Finding]:
    """Traces without GPU work (gloo): is the step spent waiting in collectives or in Python? With
    a slow worker, the others' top function is where they wait for it (DDP's backward), so the hot
    spot is left to the slow-worker finding."""
    r = tables.ranks
    if r.empty or r["hasGpu"].any() or median_step_us <= 0:
        return []
    out = []
    per = tables.collective_share()
    if len(per):
        kinds = ", ".join(tables.collectives.groupby("kind")["sumUs"].sum().sort_values(ascending=False).index[:3])
        if per.median() >= CPU_COLLECTIVE_SHARE:
            out.append(
                Finding(
                    "info",
                    "communication",
                    per.index.tolist(),
                    f"ranks spend {100 * per.median():.0f}% of each step in {r['backend'].iloc[0] or 'CPU'} "
                    f"collectives ({kinds}) "
                    f"(least: rank {int(per.idxmin())} {100 * per.min():.0f}%, most: rank {int(per.idxmax())} "
                    f"{100 * per.max():.0f}%): "
                    "most of it is waiting for the slowest rank",
                    float(per.median()) / 2,
                    {"collectiveShare": {str(rank): round(float(v), 4) for rank, v in per.items()}},
                )
            )
    f = tables.functions
    f = f[(f["thread"] == MAIN_THREAD) & ~f["name"].str.contains(WAITING)] if not f.empty else f
    if not f.empty and not slow_ranks:
        per_fn = tables.per_step(f, "exclusiveUs").groupby(f["name"]).median().sort_values(ascending=False)
        name, us = str(per_fn.index[0]), float(per_fn.iloc[0])
        out.append(
            Finding(
                "info",
                "python",
                r["rank"].tolist(),
                f"the Python hot spot is {function_text(name)}: {ms(us)}/step ({100 * us / median_step_us:.0f}% of "
                "the step, median over ranks)",
                0.0,
                {"functions": [{"name": n, "usPerStep": round(float(v), 1)} for n, v in per_fn.head(10).items()]},
            )
        )
    return out


def all_checks(
    tables: RankTables,
    kernels: pd.DataFrame,
    slow_ranks: set[int],
    judged: bool = False,
    sampled: frozenset[int] = frozenset(),
) -> list[Finding]:
    median_step_us = _median_step_us(tables)
    return [
        *one_percent_rule(tables.memory, "kind", "memory", "memory operations"),
        *one_percent_rule(tables.runtime, "name", "launch", "runtime calls"),
        *slower_kernels(kernels, median_step_us, slow_ranks),
        *top_kernels(tables),
        *python_outliers(tables, median_step_us, slow_ranks, judged, sampled),
        *communication(tables, median_step_us),
        *launch_overhead(tables),
        *cpu_only(tables, median_step_us, slow_ranks),
    ]
