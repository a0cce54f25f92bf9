"""Writes a session's report into a store: diagnosis.json, index.html, the CSV tables and the
merged Perfetto trace (docs/design.md, "Object-store layout")."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import Executor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.model import Diagnosis, Finding
from stepscope.analysis.reporting.html import render_html
from stepscope.analysis.reporting.merged_trace import MergePlan, describe, sentence, write_merged_trace
from stepscope.analysis.reporting.tables import detail_ranks, report_tables
from stepscope.contracts import layout
from stepscope.storage import Store

REPORT_VERSION = 1


def _builtin(value: Any) -> Any:
    # Figures computed with numpy/pandas reach the findings' data as numpy scalars.
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__}")


def diagnosis_document(
    *,
    source: str,
    generated: str,
    diagnosis: Diagnosis,
    full: list[Finding],
    tables: RankTables,
    total_ranks: int,
    failed: list[int],
    problems: dict[int, list[str]],
    merged: dict[str, Any],
) -> bytes:
    ranks = tables.ranks
    per_rank = [
        {
            "rank": int(r),
            "pod": p,
            "node": n,
            "stepTimeMs": None if np.isnan(s) else round(float(s) / 1000.0, 3),
            "steps": int(c),
        }
        for r, p, n, s, c in zip(ranks["rank"], ranks["pod"], ranks["node"], ranks["stepUs"], ranks["steps"])
    ]
    document = {
        "version": REPORT_VERSION,
        "source": source,
        "generatedAt": generated,
        "ranks": {"total": total_ranks, "analysed": len(ranks), "failed": sorted(failed)},
        "diagnosis": msgspec.to_builtins(diagnosis),
        "findings": [msgspec.structs.asdict(f) for f in full],
        "problems": {str(r): p for r, p in sorted(problems.items())},
        "mergedTrace": merged,
        "perRank": per_rank,
    }
    return msgspec.json.format(msgspec.json.encode(document, enc_hook=_builtin), indent=1)


def _csv(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False, float_format="%.3f").encode()


def report_key(name: str, in_session: bool) -> str:
    """Key of a report file: under report/ in the session's folder, or at the top of an output store."""
    return f"report/{name}" if in_session else name


def write_report(
    store: Store,
    *,
    in_session: bool,
    source: str,
    diagnosis: Diagnosis,
    full: list[Finding],
    tables: RankTables,
    total_ranks: int,
    failed: list[int],
    problems: dict[int, list[str]],
    merge: MergePlan,
    pool: Executor,
    on_step: Callable[[str], object] = lambda name: None,
) -> dict[str, str]:
    """Write every report file; returns name -> URI. A rank left out of the merged trace (no room,
    or its raw trace cannot be read) gets a problem entry; the merged trace is written first, so
    the other files say what it holds. Its ranks are rewritten in `pool`."""
    generated = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    written: dict[str, str] = {}

    def put(name: str, data: bytes) -> None:
        key = report_key(name, in_session)
        store.put_bytes(key, data)
        written[name] = store.uri_for(key)

    merged_name = layout.REPORT_MERGED_TRACE.removeprefix("report/")
    with tempfile.TemporaryDirectory(prefix="stepscope-report-") as tmp:
        out = Path(tmp) / merged_name
        with out.open("wb") as f:
            merged = write_merged_trace(f, merge, pool=pool, on_done=lambda rank: on_step(f"merged rank {rank}"))
        key = report_key(merged_name, in_session)
        store.put_file(key, out)
        written[merged_name] = store.uri_for(key)
    for rank, why in merged.left_out.items():
        problems.setdefault(rank, []).append(why)
    first = (
        [w.rank for w in diagnosis.slowWorkers]
        + [r for f in full if f.category in ("hang", "slow-worker") for r in f.ranks]
        + [0]
    )
    detail = detail_ranks(tables, first)
    csv = report_tables(tables, detail)
    held = (
        (
            f"kernel_details.csv and kernel_efficiency.csv hold {len(detail)} of {len(tables.ranks):,} ranks (the "
            "slow workers and the "
            "longest median steps); every rank's figures are in its summary (ranks/rank-<r>.summary.arrow)"
        )
        if detail
        else ""
    )
    for name, frame in csv.items():
        put(name, _csv(frame))
    on_step("tables")
    put(
        layout.REPORT_DIAGNOSIS.removeprefix("report/"),
        diagnosis_document(
            source=source,
            generated=generated,
            diagnosis=diagnosis,
            full=full,
            tables=tables,
            total_ranks=total_ranks,
            failed=failed,
            problems=problems,
            merged=describe(merge, merged, written[merged_name]),
        ),
    )
    put(
        layout.REPORT_HTML.removeprefix("report/"),
        render_html(
            title="stepscope report",
            source=source,
            generated=generated,
            diagnosis=diagnosis,
            full=full,
            tables=tables,
            csv=csv,
            problems=problems,
            total_ranks=total_ranks,
            merged=sentence(merge, merged),
            held=held,
        ).encode(),
    )
    on_step("report")
    return written
