"""Ops that dominate the GPU's compute time yet run far below the device's roofline
(statistics/efficiency.py): a GEMM at 10 % of peak costs more than any straggler on most jobs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.diagnosis.wording import ranks_text
from stepscope.analysis.model import Finding

# An op (one name, shape and dtype) dominates when its kernels take this share of the rank's
# compute-kernel time; it runs far below peak under this % of the roofline at its intensity.
DOMINANT_SHARE = 0.05
FAR_BELOW_PCT = 30.0
# Named ops that together take this share of compute time make it a warning, not information.
WARNING_SHARE = 0.25


def efficiency_findings(tables: RankTables, limit: int = 3) -> list[Finding]:
    """One finding naming the dominant ops far below peak, over the ranks where they are."""
    e = tables.efficiency
    if e.empty:
        return []
    k = tables.kernels
    comp = (k["type"] == "COMP").to_numpy()  # two columns of the millions of rows filtered, not all of them
    compute = k["sumUs"][comp].groupby(k["rank"][comp]).sum() if not k.empty else pd.Series(dtype=float)
    e = e[e["kind"] == "op"]
    e = e.assign(
        compute=e["rank"].map(compute).fillna(0.0).to_numpy(),
        model=e["rank"].map(tables.ranks.set_index("rank")["device"]).fillna("").to_numpy(),
    )
    e = e[(e["compute"] > 0) & (e["model"] != "") & e["pctOfPeak"].notna()]
    e = e.assign(share=e["gpuUs"] / e["compute"].where(e["compute"] > 0, 1.0))
    e = e[(e["share"] >= DOMINANT_SHARE) & (e["pctOfPeak"] < FAR_BELOW_PCT)]
    models = dict(zip(e["rank"].astype(int), e["model"]))
    found: dict[tuple[str, str, str], list[tuple[int, float, float, str]]] = {}  # rank, share, % of peak, kernel
    for key, rows in e.groupby(["name", "shapes", "dtype"], sort=False):
        found[key] = list(
            zip(rows["rank"].astype(int), rows["share"].astype(float), rows["pctOfPeak"].astype(float), rows["related"])
        )
    if not found:
        return []
    # The ops of most time at stake first: their share of compute time, less what they achieve.
    ranked = sorted(found.items(), key=lambda kv: -float(np.median([sh * (1 - pct / 100) for _, sh, pct, _ in kv[1]])))
    parts, ops, stake = [], [], 0.0
    for (name, shapes, dtype), rows in ranked[:limit]:
        share = float(np.median([sh for _, sh, _, _ in rows]))
        pct = float(np.median([p for _, _, p, _ in rows]))
        stake += share
        parts.append(f"{name} {shapes} {dtype.removeprefix('c10::')} at {pct:.0f}% ({100 * share:.0f}% of compute)")
        ops.append(
            {
                "op": name,
                "shapes": shapes,
                "dtype": dtype,
                "pctOfPeak": round(pct, 2),
                "computeShare": round(share, 4),
                "kernel": rows[0][3],
                "ranks": sorted({r for r, _, _, _ in rows}),
            }
        )
    ranks = sorted({r for rows in found.values() for r, _, _, _ in rows})
    model = ", ".join(sorted({models[r] for r in ranks}))
    message = (
        f"ops far below the {model}'s roofline on {ranks_text(ranks)}: "
        + "; ".join(parts)
        + " (check dtype, shapes too small or unaligned, unfused elementwise ops)"
    )
    severity = "warning" if stake >= WARNING_SHARE else "info"
    return [
        Finding(
            severity,
            "kernel",
            ranks,
            message,
            stake * (1 - FAR_BELOW_PCT / 100) if severity == "warning" else 0.0,
            {"ops": ops, "device": model},
        )
    ]
