"""`stepscope analyze DIR|URI|TRACE`: diagnose a captured session and write its report.

Reads ranks/rank-<r>.summary.arrow (or .summary.json from older sidecars; summarising ranks/rank-<r>.trace.json.gz where
no summary was uploaded), ranks/rank-<r>.stacks.json and nodes/<pod>/gpu-metrics.csv.gz from a directory or an
object-store URI, or a folder of raw Kineto traces (HTA's layout), or one trace file. One bad rank
is a problem in the report, never the end of the analysis; nothing that was captured is changed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from stepscope.analysis.diagnosis.diagnose import diagnose
from stepscope.analysis.diagnosis.rank_tables import RankTables, build_tables, usable
from stepscope.analysis.gathering.session_files import (
    SessionFiles,
    SessionRanks,
    find_files,
    is_ascend_capture,
    local_path,
    open_session,
    read_ranks,
)
from stepscope.analysis.loading.allocation import reuse_freed_memory
from stepscope.analysis.loading.gpu_samples import read_metrics
from stepscope.analysis.loading.parallel import analysis_workers, worker_pool
from stepscope.analysis.model import Diagnosis, table_critical_path
from stepscope.analysis.reporting.merged_trace import (
    MergePlan,
    MergeRank,
    critical_path_events,
    expected_size,
    merge_order,
)
from stepscope.analysis.reporting.report import write_report
from stepscope.analysis.settings import (
    DEFAULT_MAX_METRICS_MB,
    DEFAULT_MAX_TRACE_EVENTS,
    DEFAULT_MAX_TRACE_MB,
    MAX_METRICS_MB_ENV,
    MAX_TRACE_EVENTS_ENV,
    MAX_TRACE_MB_ENV,
    metrics_cap_bytes,
    trace_caps,
)
from stepscope.analysis.statistics.gpu_scope import (
    COMM_KERNEL_PATTERNS,
    DEFAULT_COMM_KERNELS,
    HTA_COMM_KERNELS,
    CommKernels,
)
from stepscope.storage import StoreError, open_store

log = logging.getLogger(__name__)

# Perfetto's in-browser importer gives up on JSON traces of a few GB (its WebAssembly memory holds
# about 2 GB, more than the JSON itself): the merged trace stays within this much uncompressed
# JSON, keeping the ranks that explain the diagnosis first, and says which it holds and why.
MERGED_LIMIT_MB = 1024
_COUNTER_PID = 10_000_000


# Exit codes of `stepscope analyze` a script can tell apart.
EXIT_OK, EXIT_NONE, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3


class AnalysisError(ValueError):
    """Nothing could be analysed at all (no such folder, nothing in it); the message says why. A
    ValueError, so that callers outside the analysis catch it as the bad input it is."""


def _read_metrics(files: SessionFiles, problems: dict[int, list[str]], table: pa.Table) -> dict[str, pd.DataFrame]:
    if not files.metrics:
        return {}
    metrics: dict[str, pd.DataFrame] = {}
    for pod, key in files.metrics.items():
        try:
            # From a file, read in chunks: the object may be far larger than the cap on what is read of it.
            with local_path(files.store, key) as path:
                metrics[pod] = read_metrics(path)
        except (StoreError, ValueError, OSError, EOFError) as exc:
            _pod_problem(
                pod, f"GPU metrics of pod {pod} unreadable ({key}): {exc}", len(files.metrics), problems, table
            )
            continue
        for warning in metrics[pod].attrs.get("warnings", []):
            _pod_problem(pod, f"GPU metrics of pod {pod} ({key}): {warning}", len(files.metrics), problems, table)
    return metrics


def _pod_problem(pod: str, text: str, pods: int, problems: dict[int, list[str]], table: pa.Table) -> None:
    """A problem of a pod's metrics file goes to the ranks that ran there; ranks summarised here
    from raw traces know no pod, and like hardware.findings they take a session's only file as theirs."""
    ranks = table.column("rank").to_numpy()
    owners = ranks[table.column("pod").to_numpy(zero_copy_only=False) == pod].tolist() or (
        ranks.tolist() if pods == 1 else []
    )
    for rank in owners:
        problems.setdefault(rank, []).append(text)
    log.warning("%s", text)


def _merge_plan(
    files: SessionFiles,
    read: SessionRanks,
    diagnosis: Diagnosis,
    tables: RankTables,
    hardware: dict[str, pd.DataFrame],
    limit_bytes: int,
    local: contextlib.ExitStack,
) -> MergePlan:
    """The ranks the merged trace may hold, in order of importance, on one time base (the earliest
    rank's clock). Traces in a remote store are downloaded (into `local`) only while they may fit."""
    bases = tables.ranks.set_index("rank")["traceBaseUs"]
    order = [(r, why) for r, why in merge_order(diagnosis, tables, read.stacks) if r in read.traces]
    known = [float(bases[r]) for r, _ in order if bases[r] > 0]
    base_us = min(known) if known else 0.0
    rows = {r: i for i, r in enumerate(read.table.column("rank").to_pylist())}
    paths = read.table.column("criticalPath")
    ranks, expected, left_out = [], 0, {}
    for rank, why in order:
        if is_ascend_capture(read.traces[rank]):
            left_out[rank] = (
                "left out of the merged trace: an Ascend capture (its times are strings of epoch µs); "
                f"open {read.traces[rank]} in MindStudio Insight"
            )
            continue
        if expected >= limit_bytes:  # nothing more fits: not worth a download
            left_out[rank] = (
                f"left out of the merged trace: the ranks before it fill its {limit_bytes / 1e6:,.0f} MB limit"
            )
            continue
        path = local.enter_context(local_path(files.store, read.traces[rank]))
        try:
            size = expected_size(path)
        except OSError as exc:
            left_out[rank] = f"left out of the merged trace: {exc}"
            continue
        shift = round(float(bases[rank]) - base_us) if bases[rank] > 0 else 0
        extra = critical_path_events(rank, table_critical_path(paths, rows[rank]), shift)
        ranks.append(
            MergeRank(
                rank,
                path,
                why=why,
                shift_us=shift,
                checked=rank in read.parsed,
                size_hint=size + len(extra),
                extra=extra,
            )
        )
        expected += size + len(extra)
    counters = []
    if hardware:
        from stepscope.analysis.reporting.gpu_counters import counter_events

        counters = [
            e
            for i, (pod, m) in enumerate(sorted(hardware.items()))
            for e in counter_events(m, pod, base_us=base_us, pid=_COUNTER_PID + i)
        ]
    return MergePlan(
        ranks, counters, limit_bytes, base_us, sources={r.rank: read.traces[r.rank] for r in ranks}, left_out=left_out
    )


def analyze_uri(
    uri: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    credentials: dict | None = None,
    progress: bool = True,
    output: str | None = None,
    merged_limit_mb: int = MERGED_LIMIT_MB,
    comm: CommKernels = DEFAULT_COMM_KERNELS,
    on_ranks: Callable[[int, int, list[str]], object] = lambda analysed, total, skipped: None,
    ambient_credentials: bool = True,
) -> Diagnosis:
    """Diagnose the session at `uri` (folder, store URI or one trace file) and write its report
    into <uri>/report/ (or into `output`). Raises AnalysisError when there is nothing to analyse.
    `on_ranks` hears how many ranks were analysed of how many, and which files were no traces.
    `comm`: the kernels of raw traces counted as communication (uploaded summaries keep theirs).
    The caps on each rank's trace and each node's metrics are the environment's (stepscope.analysis.settings)."""
    try:
        trace_caps()
        metrics_cap_bytes()
    except ValueError as exc:
        raise AnalysisError(str(exc)) from exc
    reuse_freed_memory()
    try:
        store, only = open_session(
            uri, endpoint=endpoint, region=region, credentials=credentials, ambient_credentials=ambient_credentials
        )
        files = find_files(store, only)
    except StoreError as exc:
        raise AnalysisError(str(exc)) from exc
    if not files.ranks:
        raise AnalysisError(
            f"nothing to analyse at {uri}: expected ranks/rank-<r>.summary.arrow or .trace.json.gz (a stepscope "
            "session) or Kineto traces (*.json, *.json.gz)"
        )
    bar = tqdm(
        total=len(files.ranks) + 2,
        desc="stepscope analyze",
        unit="rank",
        file=sys.stderr,
        disable=not progress,
        leave=False,
    )
    # One pool of worker processes summarises the raw traces, then rewrites the merged trace's ranks;
    # a session whose ranks uploaded only summaries needs none.
    traces = sum(1 for f in files.ranks if f.trace)
    with (
        contextlib.closing(bar),
        worker_pool(analysis_workers(traces) if traces else 1) as pool,
        contextlib.ExitStack() as local,
    ):
        read = read_ranks(
            files, on_rank=lambda name: (bar.set_postfix_str(name, refresh=False), bar.update(1)), pool=pool, comm=comm
        )
        table, stacks, problems = read.table, read.stacks, read.problems
        if not len(table):
            raise AnalysisError(
                f"nothing to analyse at {uri}: {', '.join(read.skipped)} are not traces (no traceEvents)"
            )
        ok = usable(table)
        on_ranks(len(ok), len(table), read.skipped)
        hardware = _read_metrics(files, problems, table)
        bar.set_postfix_str("diagnosing", refresh=False)
        tables = build_tables(ok)
        diagnosis, full = diagnose(table, stacks=stacks, hardware=hardware, tables=tables)
        bar.update(1)
        out_store = (
            open_store(
                output,
                endpoint=endpoint,
                region=region,
                credentials=credentials,
                ambient_credentials=ambient_credentials,
            )
            if output
            else store
        )
        plan = _merge_plan(files, read, diagnosis, tables, hardware, merged_limit_mb << 20, local)
        bar.total += len(plan.ranks)
        try:
            write_report(
                out_store,
                in_session=output is None,
                source=uri,
                diagnosis=diagnosis,
                full=full,
                tables=tables,
                total_ranks=len(table),
                failed=table.filter(pc.not_equal(table.column("error"), "")).column("rank").to_pylist(),
                problems=problems,
                merge=plan,
                pool=pool,
                on_step=lambda name: (bar.set_postfix_str(name, refresh=False), bar.update(1)),
            )
        except StoreError as exc:
            raise AnalysisError(f"cannot write the report: {exc} (use --output DIR to write it elsewhere)") from exc
    return diagnosis


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        f"exit status: {EXIT_OK} every rank analysed, {EXIT_PARTIAL} some ranks could not be analysed, "
        f"{EXIT_NONE} none could (or nothing to analyse), {EXIT_USAGE} bad arguments"
    )
    parser.add_argument(
        "source",
        nargs="?",
        help=(
            "session folder, store URI (file://, s3://, oss://), folder of Kineto traces or of Ascend NPU captures "
            "(torch_npu's *_ascend_pt folders), or one trace file"
        ),
    )
    parser.add_argument("--endpoint", help="object-store endpoint (MinIO, OSS)")
    parser.add_argument("--region", help="object-store region (needed for oss:// without --endpoint)")
    parser.add_argument("--output", help="write the report files here instead of <source>/report/")
    parser.add_argument(
        "--merged-limit-mb",
        type=int,
        default=MERGED_LIMIT_MB,
        help="uncompressed JSON the merged Perfetto trace may hold, in MiB (default %(default)s)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    libraries = ", ".join(dict.fromkeys(label for label, _ in COMM_KERNEL_PATTERNS))
    parser.add_argument(
        "--comm-kernel",
        action="append",
        default=[],
        metavar="REGEX",
        help=f"count GPU kernels whose name matches REGEX (searched anywhere in the name) as communication, "
        f"besides NCCL's and the built-in patterns ({libraries}); repeatable",
    )
    parser.add_argument(
        "--hta-comm-kernels",
        action="store_true",
        help="count only NCCL kernels as communication, as HTA does (HTA's own breakdown and overlap numbers)",
    )
    # Traces are untrusted input: what one rank or node may cost is capped, and what is over a cap is cut and reported.
    parser.add_argument(
        "--max-trace-mb",
        type=_positive,
        metavar="MiB",
        help=f"uncompressed JSON read of each rank's trace, in MiB; the rest is cut and reported "
        f"(default ${MAX_TRACE_MB_ENV} or {DEFAULT_MAX_TRACE_MB})",
    )
    parser.add_argument(
        "--max-trace-events",
        type=_positive,
        metavar="N",
        help=(
            f"events with a duration kept of each rank's trace (default ${MAX_TRACE_EVENTS_ENV} or "
            f"{DEFAULT_MAX_TRACE_EVENTS})"
        ),
    )
    parser.add_argument(
        "--max-metrics-mb",
        type=_positive,
        metavar="MiB",
        help=(
            f"uncompressed CSV read of each node's GPU metrics, in MiB (default ${MAX_METRICS_MB_ENV} or "
            f"{DEFAULT_MAX_METRICS_MB})"
        ),
    )


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int:
    if not args.source:
        print(
            "stepscope analyze: give a session folder, store URI or trace file (or --session NS/NAME)", file=sys.stderr
        )
        return EXIT_USAGE
    counts: list[tuple[int, int, list[str]]] = []
    # Through the environment, which the worker processes inherit.
    for env, value in (
        (MAX_TRACE_MB_ENV, args.max_trace_mb),
        (MAX_TRACE_EVENTS_ENV, args.max_trace_events),
        (MAX_METRICS_MB_ENV, args.max_metrics_mb),
    ):
        if value is not None:
            os.environ[env] = str(value)
    try:
        comm = (HTA_COMM_KERNELS if args.hta_comm_kernels else DEFAULT_COMM_KERNELS).with_user(args.comm_kernel)
    except re.error as exc:
        print(f"stepscope analyze: --comm-kernel: not a regular expression: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        diagnosis = analyze_uri(
            args.source,
            endpoint=args.endpoint,
            region=args.region,
            progress=not args.no_progress,
            output=args.output,
            merged_limit_mb=args.merged_limit_mb,
            comm=comm,
            on_ranks=lambda *c: counts.append(c),
        )
    except AnalysisError as exc:
        print(f"stepscope analyze: {exc}", file=sys.stderr)
        return EXIT_NONE
    analysed, total, skipped = counts[0]
    for name in skipped:
        print(f"note: skipped {name}: not a trace (no traceEvents)", file=sys.stderr)
    print(diagnosis.summary)
    for f in diagnosis.findings[:10]:
        print(f"  [{f.severity}] {f.category}: {f.message}")
    where = args.output or (
        str(Path(args.source).resolve().parent / "report")
        if Path(args.source).is_file()
        else f"{args.source.rstrip('/')}/report"
    )
    print(f"report: {where}/index.html")
    if analysed < total:
        print(
            f"stepscope analyze: {total - analysed} of {total} rank(s) could not be analysed (see the report)",
            file=sys.stderr,
        )
        return EXIT_NONE if analysed == 0 else EXIT_PARTIAL
    return EXIT_OK
