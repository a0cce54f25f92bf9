"""Compare two runs (like HTA's trace diff): kernels and Python functions added, removed, slower,
faster, from the rank summaries of a control run (A) and a test run (B).

Times are per step and rank (a run's totals over all its ranks divided by the steps they captured),
so runs of different length or rank count compare. A kernel or function is slower or faster by
what it costs a step (a kernel called twice as often at 0.8x the time per call costs more: slower),
and only beyond the noise band: the step-to-step spread of the step times inside each capture,
so two runs of the same code report no change. The rank whose cost changed most is named beside
the average (a function slowed on one rank of four moves the average by a quarter). Names are
kept whole: template variants of one kernel are different rows, never one added and one removed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.rank_tables import build_tables
from stepscope.analysis.model import RankSummary

MIN_CHANGE = 0.05  # a cost per step 5 % apart (or the noise band, if wider) is slower or faster
# ... and by at least this share of the step: a change below it is no change a user acts on.
MIN_STEP_SHARE = 0.002
RANK_BAND = 2.0
COLUMNS = [
    "kind",
    "name",
    "status",
    "countA",
    "countB",
    "usA",
    "usB",
    "deltaUs",
    "meanUsA",
    "meanUsB",
    "ratio",
    "rank",
    "rankDeltaUs",
]


@dataclass(frozen=True)
class RunDiff:
    table: pd.DataFrame  # COLUMNS, largest absolute change per step first
    stepMsA: float | None
    stepMsB: float | None
    ranksA: int
    ranksB: int
    noise: float = 0.0  # the relative change within which a cost counts as unchanged

    def headline(self) -> str:
        if self.stepMsA and self.stepMsB:
            change = self.stepMsB / self.stepMsA - 1.0
            word = "slower" if change > 0 else "faster"
            return (
                f"B's median step is {self.stepMsB:.2f} ms vs A's {self.stepMsA:.2f} ms ({100 * abs(change):.1f}% "
                f"{word})"
            )
        return "no step times to compare (traces without ProfilerStep): compare kernels and functions below"


def _per_step(summaries: list[RankSummary]) -> tuple[pd.DataFrame, pd.DataFrame, float | None, float, int, int]:
    """Per item: calls and µs per step and rank; per (item, rank): µs per step; the median step
    (ms); the relative step-to-step spread; the steps per rank; the ranks read."""
    ok = [s for s in summaries if not s.error]
    tables = build_tables(ok)
    steps = float(tables.ranks["steps"].clip(lower=1).sum()) or 1.0
    per_rank_steps = tables.ranks.set_index("rank")["steps"].clip(lower=1)
    parts, ranks = [], []
    for kind, frame, column in (("kernel", tables.kernels, "sumUs"), ("function", tables.functions, "exclusiveUs")):
        if frame.empty:
            continue
        g = frame.groupby("name", sort=False)
        parts.append(
            pd.DataFrame(
                {
                    "kind": kind,
                    "count": g["count"].sum() / steps,
                    "us": g[column].sum() / steps,
                    "calls": g["count"].sum(),
                    "total": g[column].sum(),
                }
            )
        )
        by_rank = frame.groupby(["name", "rank"], sort=False)[column].sum().reset_index()
        by_rank["us"] = by_rank[column] / by_rank["rank"].map(per_rank_steps).to_numpy(dtype=float)
        ranks.append(by_rank.assign(kind=kind)[["kind", "name", "rank", "us"]])
    table = (
        pd.concat(parts).reset_index()
        if parts
        else pd.DataFrame(columns=["name", "kind", "count", "us", "calls", "total"])
    )
    by_rank = pd.concat(ranks) if ranks else pd.DataFrame(columns=["kind", "name", "rank", "us"])
    step_us = tables.step_us.dropna()
    durations = tables.steps["durationUs"].to_numpy(dtype=float) if not tables.steps.empty else np.empty(0)
    # Robust spread (MAD as a standard deviation) of the steps over their median.
    spread = (
        float(1.4826 * np.median(np.abs(durations - np.median(durations))) / np.median(durations))
        if len(durations) > 1
        else 0.0
    )
    per_rank = int(tables.ranks["steps"].median()) if len(tables.ranks) else 1
    table = table.merge(_step_samples(tables.functions), on=["kind", "name"], how="left")
    return (
        table,
        by_rank,
        (float(step_us.median()) / 1000.0 if len(step_us) else None),
        spread,
        max(per_rank, 1),
        len(ok),
    )


def _step_samples(functions: pd.DataFrame) -> pd.DataFrame:
    """Per function: the variance of its cost over its (rank, step) samples and how many there
    are (summaries with FunctionStat.stepsUs); a function's own noise, which a hiccup of a busy
    machine (one call 10x longer in one step) makes large."""
    if functions.empty or not functions["stepsUs"].map(len).any():
        return pd.DataFrame(columns=["kind", "name", "varUs", "samples"])
    f = functions[functions["stepsUs"].map(len) > 0]
    per = pd.DataFrame(
        {
            "name": f["name"].to_numpy(),
            "rank": f["rank"].to_numpy(),
            "us": f["stepsUs"].map(lambda v: list(enumerate(v))).to_numpy(),
        }
    ).explode("us")
    per["step"], per["us"] = per["us"].str[0], per["us"].str[1].astype(float)
    per = per.groupby(["name", "rank", "step"])["us"].sum().groupby("name")
    return pd.DataFrame(
        {"kind": "function", "varUs": per.var(ddof=1).fillna(0.0), "samples": per.count()}
    ).reset_index()


def _rank_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per item, the rank whose cost per step changed most, and by how much."""
    m = a.merge(b, on=["kind", "name", "rank"], how="outer", suffixes=("A", "B")).fillna({"usA": 0.0, "usB": 0.0})
    m["d"] = m["usB"] - m["usA"]
    m["base"] = np.minimum(m["usA"], m["usB"])
    if m.empty:
        return pd.DataFrame(columns=["kind", "name", "rank", "rankDeltaUs", "rankBaseUs"])
    top = m.loc[m["d"].abs().groupby([m["kind"], m["name"]]).idxmax()]
    return top.rename(columns={"d": "rankDeltaUs", "base": "rankBaseUs"})[
        ["kind", "name", "rank", "rankDeltaUs", "rankBaseUs"]
    ]


def diff_runs(a: list[RankSummary], b: list[RankSummary], *, min_change: float = MIN_CHANGE) -> RunDiff:
    ta, ra, step_a, spread_a, n_a, ranks_a = _per_step(a)
    tb, rb, step_b, spread_b, n_b, ranks_b = _per_step(b)
    # Two standard deviations of a difference of two means over the captured steps, from the
    # step-to-step spread inside the captures: a cost that moves less is within the noise.
    noise = max(min_change, 2.0 * max(spread_a, spread_b) * float(np.sqrt(1.0 / n_a + 1.0 / n_b)))
    m = ta.merge(tb, on=["kind", "name"], how="outer", suffixes=("A", "B"))
    for column in ("countA", "countB", "usA", "usB", "callsA", "callsB", "totalA", "totalB", "varUsA", "varUsB"):
        m[column] = m[column].fillna(0.0).astype(float)
    # A function's own noise: two standard errors of the difference of its per-step means.
    samples_a, samples_b = (m[c].astype(float).fillna(1.0).clip(lower=1.0) for c in ("samplesA", "samplesB"))
    own = 2.0 * np.sqrt((m["varUsA"] / samples_a + m["varUsB"] / samples_b).astype(float))
    m["meanUsA"] = np.where(m["callsA"] > 0, m["totalA"] / m["callsA"].where(m["callsA"] > 0, 1.0), np.nan)
    m["meanUsB"] = np.where(m["callsB"] > 0, m["totalB"] / m["callsB"].where(m["callsB"] > 0, 1.0), np.nan)
    m["ratio"] = m["meanUsB"] / m["meanUsA"]
    m["deltaUs"] = m["usB"] - m["usA"]
    m = m.merge(_rank_changes(ra, rb), on=["kind", "name"], how="left")
    step_us = 1000.0 * max(step_a or 0.0, step_b or 0.0)
    # A change counts on the average over ranks, or on the one rank that changed most: each rank
    # alone is noisier than their average, and the most changed of many ranks is picked for being
    # far out, so its band is RANK_BAND times wider.
    floor = MIN_STEP_SHARE * step_us
    # Relative to the smaller cost: 1.5x slower and 1.5x faster are changes alike.
    average = (m["deltaUs"].abs() > noise * np.minimum(m["usA"], m["usB"])) & (
        m["deltaUs"].abs() >= np.maximum(floor, own)
    )
    one_rank = (m["rankDeltaUs"].abs() > RANK_BAND * noise * m["rankBaseUs"]) & (
        m["rankDeltaUs"].abs() >= np.maximum(floor, RANK_BAND * own)
    )
    delta = np.where(average, m["deltaUs"], m["rankDeltaUs"])
    real = (average | one_rank).to_numpy()
    m["status"] = np.select(
        [m["callsA"] == 0, m["callsB"] == 0, real & (delta > 0), real & (delta < 0)],
        ["added", "removed", "slower", "faster"],
        "unchanged",
    )
    m = m.iloc[np.argsort(-m["deltaUs"].abs().to_numpy(), kind="stable")]
    return RunDiff(m[COLUMNS].reset_index(drop=True), step_a, step_b, ranks_a, ranks_b, noise)


def _fit(name: str, width: int) -> str:
    """A long name cut in the middle: template variants of one kernel differ at their end."""
    if len(name) <= width:
        return name
    head = (width - 3) // 2
    return name[:head] + "..." + name[len(name) - (width - 3 - head) :]


def format_table(table: pd.DataFrame, *, top: int, name_width: int = 80) -> str:
    """A fixed-width text table of the `top` largest changes: cost per step (average over ranks),
    the rank that changed most and by how much, the time per call."""
    head = (
        f"{'status':<10} {'kind':<8} {'A us/step':>11} {'B us/step':>11} {'delta':>11} {'most changed rank':>22} "
        f"{'B/A call':>9}  name"
    )
    lines = [head, "-" * len(head)]
    for row in table.head(top).itertuples(index=False):
        ratio = "" if np.isnan(row.ratio) else f"{row.ratio:.2f}x"
        rank = "" if row.rank != row.rank else f"rank {int(row.rank)}: {row.rankDeltaUs:+,.1f}"
        lines.append(
            f"{row.status:<10} {row.kind:<8} {row.usA:>11,.1f} {row.usB:>11,.1f} {row.deltaUs:>+11,.1f} {rank:>22} "
            f"{ratio:>9}  {_fit(row.name, name_width)}"
        )
    return "\n".join(lines)
