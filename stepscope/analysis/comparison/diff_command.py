"""`stepscope diff A B`: what changed between two runs (sessions, folders, store URIs or single
trace files): kernels and Python functions added, removed, slower, faster."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from stepscope.analysis.comparison.diff import MIN_CHANGE, RunDiff, diff_runs, format_table
from stepscope.analysis.gathering.session_files import find_files, open_session, read_ranks
from stepscope.analysis.model import RankSummary
from stepscope.storage import StoreError

# Raw traces are summarised with every kernel and function: a kernel outside one run's top 50
# is not "added" in the other.
ALL = 1 << 30


def load_run(source: str, *, endpoint: str | None = None, region: str | None = None) -> tuple[list[RankSummary], bool]:
    """The run's rank summaries (raw traces summarised whole), and whether any came from an edge
    summary (which keeps only the top 50 kernels per type); raises ValueError when the source
    holds nothing to compare."""
    try:
        store, only = open_session(source, endpoint=endpoint, region=region)
        files = find_files(store, only)
    except StoreError as exc:
        raise ValueError(str(exc)) from exc
    summaries = read_ranks(files, top=ALL).summaries
    if not any(not s.error for s in summaries):
        why = "; ".join(sorted({s.error for s in summaries})) or "no traces or summaries found"
        raise ValueError(f"nothing to compare in {source}: {why}")
    return summaries, any(f.summary for f in files.ranks)


def compare(a: str, b: str, *, endpoint: str | None = None, region: str | None = None, min_change: float = MIN_CHANGE) -> tuple[RunDiff, bool]:
    """The diff of two runs, and whether it rests on edge summaries (top kernels only)."""
    run_a, partial_a = load_run(a, endpoint=endpoint, region=region)
    run_b, partial_b = load_run(b, endpoint=endpoint, region=region)
    return diff_runs(run_a, run_b, min_change=min_change), partial_a or partial_b


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="control run: session folder, store URI, folder of Kineto traces or one trace file")
    parser.add_argument("b", help="test run, the same kinds")
    parser.add_argument("--kind", choices=("all", "kernel", "function"), default="all", help="what to compare (default %(default)s)")
    parser.add_argument("--status", action="append", choices=("added", "removed", "slower", "faster", "unchanged"),
                        help="show only these (repeatable; default: all but unchanged)")
    parser.add_argument("--top", type=int, default=25, help="rows to print (default %(default)s)")
    parser.add_argument("--min-change", type=float, default=MIN_CHANGE, help="relative change of the cost per step that counts, when wider than the noise band (default %(default)s)")
    parser.add_argument("--csv", type=Path, help="write the whole comparison as CSV")
    parser.add_argument("--json", type=Path, help="write the whole comparison as JSON")
    parser.add_argument("--endpoint", help="object-store endpoint (MinIO, OSS)")
    parser.add_argument("--region", help="object-store region")


def run(args: argparse.Namespace) -> int:
    try:
        result, partial = compare(args.a, args.b, endpoint=args.endpoint, region=args.region, min_change=args.min_change)
    except ValueError as exc:
        print(f"stepscope diff: {exc}", file=sys.stderr)
        return 1
    table = result.table
    if args.kind != "all":
        table = table[table["kind"] == args.kind]
    statuses = args.status or ["added", "removed", "slower", "faster"]
    shown = table[table["status"].isin(statuses)]
    counts = table["status"].value_counts()
    print(f"A: {args.a} ({result.ranksA} rank(s))\nB: {args.b} ({result.ranksB} rank(s))")
    print(result.headline())
    print(f"noise band: costs within {100 * result.noise:.0f}% (twice the step-to-step spread, at least --min-change) count as unchanged")
    print(", ".join(f"{counts.get(s, 0)} {s}" for s in ("added", "removed", "slower", "faster", "unchanged")))
    print(format_table(shown, top=args.top))
    if partial:
        print("note: compared from edge summaries, which keep the top 50 kernels of each type and Python functions; "
              "'added' or 'removed' can mean outside the other run's top 50 (keep raw traces for an exact diff)")
    if args.csv:
        table.to_csv(args.csv, index=False, float_format="%.3f")
    if args.json:
        args.json.write_bytes(msgspec.json.encode({"headline": result.headline(), "stepMsA": result.stepMsA, "stepMsB": result.stepMsB,
                                                   "rows": table.astype(object).where(table.notna(), None).to_dict("records")}))
    return 0
