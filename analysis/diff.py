"""Compare two runs (like HTA's trace diff): kernels and Python functions added, removed, slower,
faster, from the rank summaries of a control run (A) and a test run (B).

Times are per step and rank (a run's totals over all its ranks divided by the steps they captured),
so runs of different length or rank count compare; a kernel is slower or faster by its mean
duration per call, since a change in how often it runs is its own column.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.analysis.model import RankSummary
from stepscope.analysis.rank_tables import build_tables

MIN_CHANGE = 0.05  # a mean duration 5 % apart is slower or faster; closer is noise
COLUMNS = ["kind", "name", "status", "countA", "countB", "usA", "usB", "deltaUs", "meanUsA", "meanUsB", "ratio"]


@dataclass(frozen=True)
class RunDiff:
    table: pd.DataFrame  # COLUMNS, largest absolute change per step first
    stepMsA: float | None
    stepMsB: float | None
    ranksA: int
    ranksB: int

    def headline(self) -> str:
        if self.stepMsA and self.stepMsB:
            change = self.stepMsB / self.stepMsA - 1.0
            word = "slower" if change > 0 else "faster"
            return f"B's median step is {self.stepMsB:.2f} ms vs A's {self.stepMsA:.2f} ms ({100 * abs(change):.1f}% {word})"
        return "no step times to compare (traces without ProfilerStep): compare kernels and functions below"


def _per_step(summaries: list[RankSummary]) -> tuple[pd.DataFrame, float | None, int]:
    ok = [s for s in summaries if not s.error]
    tables = build_tables(ok)
    steps = float(tables.ranks["steps"].clip(lower=1).sum()) or 1.0
    parts = []
    for kind, frame, column in (("kernel", tables.kernels, "sumUs"), ("function", tables.functions, "exclusiveUs")):
        if frame.empty:
            continue
        g = frame.groupby("name", sort=False)
        parts.append(pd.DataFrame({"kind": kind, "count": g["count"].sum() / steps, "us": g[column].sum() / steps,
                                   "calls": g["count"].sum(), "total": g[column].sum()}))
    table = pd.concat(parts).reset_index() if parts else pd.DataFrame(columns=["name", "kind", "count", "us", "calls", "total"])
    step_us = tables.step_us.dropna()
    return table, (float(step_us.median()) / 1000.0 if len(step_us) else None), len(ok)


def diff_runs(a: list[RankSummary], b: list[RankSummary], *, min_change: float = MIN_CHANGE) -> RunDiff:
    ta, step_a, ranks_a = _per_step(a)
    tb, step_b, ranks_b = _per_step(b)
    m = ta.merge(tb, on=["kind", "name"], how="outer", suffixes=("A", "B"))
    for column in ("countA", "countB", "usA", "usB", "callsA", "callsB", "totalA", "totalB"):
        m[column] = m[column].fillna(0.0).astype(float)
    m["meanUsA"] = np.where(m["callsA"] > 0, m["totalA"] / m["callsA"].where(m["callsA"] > 0, 1.0), np.nan)
    m["meanUsB"] = np.where(m["callsB"] > 0, m["totalB"] / m["callsB"].where(m["callsB"] > 0, 1.0), np.nan)
    m["ratio"] = m["meanUsB"] / m["meanUsA"]
    m["deltaUs"] = m["usB"] - m["usA"]
    m["status"] = np.select(
        [m["callsA"] == 0, m["callsB"] == 0, m["ratio"] >= 1.0 + min_change, m["ratio"] <= 1.0 / (1.0 + min_change)],
        ["added", "removed", "slower", "faster"], "unchanged")
    m = m.iloc[np.argsort(-m["deltaUs"].abs().to_numpy(), kind="stable")]
    return RunDiff(m[COLUMNS].reset_index(drop=True), step_a, step_b, ranks_a, ranks_b)


def format_table(table: pd.DataFrame, *, top: int, name_width: int = 60) -> str:
    """A fixed-width text table of the `top` largest changes."""
    head = f"{'status':<10} {'kind':<8} {'A us/step':>11} {'B us/step':>11} {'delta':>11} {'B/A mean':>9}  name"
    lines = [head, "-" * len(head)]
    for row in table.head(top).itertuples(index=False):
        name = row.name if len(row.name) <= name_width else row.name[: name_width - 3] + "..."
        ratio = "" if np.isnan(row.ratio) else f"{row.ratio:.2f}x"
        lines.append(f"{row.status:<10} {row.kind:<8} {row.usA:>11,.1f} {row.usB:>11,.1f} {row.deltaUs:>+11,.1f} {ratio:>9}  {name}")
    return "\n".join(lines)
