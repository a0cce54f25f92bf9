"""stepscope's analysis: from captured Kineto traces to a diagnosis and a report.

Its stages are subpackages, each importing only the stages before it (tests/test_architecture.py):
  metrics/     one rank's trace -> its RankSummary (what the sidecar uploads)
  loading/     a captured session (folder, store URI, trace files) -> its ranks' summaries, stacks
               and GPU samples
  diagnosis/   the ranks' summaries -> the Diagnosis and its findings
  reporting/   the report: diagnosis.json, index.html, CSV tables, the merged Perfetto trace
  comparison/  two runs -> what changed
model.py holds the types they exchange; pipeline.py is `stepscope analyze`.

Code outside stepscope.analysis calls only the functions below and uses the types of
stepscope.analysis.model. Each loads its stage when called, so importing this package costs
nothing: the sidecar imports it at start and needs pandas only once a capture ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from pathlib import Path

    import pandas as pd

    from stepscope.analysis.comparison.diff import RunDiff
    from stepscope.analysis.gathering.session_files import SessionRanks
    from stepscope.analysis.gathering.shards import ShardResult
    from stepscope.analysis.model import Diagnosis, Finding, RankSummary
    from stepscope.storage import Store


def summarize(
    trace: str | Path,
    *,
    rank: int | None = None,
    pod: str = "",
    node: str = "",
    samples: pd.DataFrame | None = None,
    top: int = 50,
    comm_kernel_patterns: Sequence[str] = (),
) -> RankSummary:
    """One rank's trace file as its RankSummary, the top `top` kernels and functions of each kind;
    with `samples` (read_metrics of its node's GPU samples) its GPU's per-step statistics too;
    `comm_kernel_patterns` (spec.analysis.commKernelPatterns) count as communication too.
    Never raises: a trace that cannot be summarised gives a summary with `error` set."""
    from stepscope.analysis.statistics.gpu_scope import DEFAULT_COMM_KERNELS
    from stepscope.analysis.statistics.summary import summarize_file

    return summarize_file(
        trace,
        rank=rank,
        pod=pod,
        node=node,
        top=top,
        samples=samples,
        comm=DEFAULT_COMM_KERNELS.with_user(list(comm_kernel_patterns)),
    )


def read_metrics(data: bytes | Path) -> pd.DataFrame:
    """The sidecar's GPU samples file (gpu-metrics.csv.gz, path or bytes) as columns sorted by time;
    ValueError when it is no such file (a truncated one keeps its complete rows and says so)."""
    from stepscope.analysis.loading.gpu_samples import read_metrics as read

    return read(data)


def load(
    source: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    credentials: dict | None = None,
    top: int = 50,
) -> SessionRanks:
    """Every rank's summary, stacks and problems of the session at `source` (folder, store URI, folder
    of Kineto traces or one trace file), raw traces summarised on the way; StoreError when
    `source` cannot be opened."""
    from stepscope.analysis.gathering.session_files import find_files, open_session, read_ranks

    store, only = open_session(source, endpoint=endpoint, region=region, credentials=credentials)
    return read_ranks(find_files(store, only), top=top)


def unsummarised_ranks(store: Store) -> list[int]:
    """The ranks of the session in `store` that have a raw trace and no summary."""
    from stepscope.analysis.gathering.session_files import find_files
    from stepscope.analysis.gathering.shards import unsummarised

    return unsummarised(find_files(store).ranks)


def summarise_shard(store: Store, index: int, shards: int) -> ShardResult:
    """Shard `index` of `shards` of the session's raw traces summarised into `store`, where the
    reduce reads them as uploaded summaries (gathering/shards.py says how ranks are dealt)."""
    from stepscope.analysis.gathering.shards import summarise_shard as run

    return run(store, index, shards)


def diagnose(
    summaries: list[RankSummary],
    *,
    stacks: dict[int, dict] | None = None,
    hardware: dict[str, pd.DataFrame] | None = None,
) -> tuple[Diagnosis, list[Finding]]:
    """The Diagnosis for the session's status and every finding, worst first, from the ranks'
    summaries (plus hang stacks by rank and GPU samples by pod)."""
    from stepscope.analysis.diagnosis.diagnose import diagnose as run

    return run(summaries, stacks=stacks, hardware=hardware)


def report(
    source: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    credentials: dict | None = None,
    progress: bool = True,
    output: str | None = None,
    merged_limit_mb: int | None = None,
    on_ranks: Callable[[int, int, list[str]], object] | None = None,
    ambient_credentials: bool = True,
    comm_kernel_patterns: Sequence[str] = (),
) -> Diagnosis:
    """Diagnose the session at `source` and write its report into <source>/report/ (or `output`);
    what `stepscope analyze` and the analysis Job run. Returns the Diagnosis; raises a ValueError
    (command.AnalysisError) when there is nothing to analyse. `on_ranks` hears how many ranks were
    analysed of how many, and which files were no traces. `ambient_credentials` False: the store
    only with `credentials` (storage.open_store), as the analysis Job of a cluster session.
    `comm_kernel_patterns` (spec.analysis.commKernelPatterns) count as communication in raw traces."""
    from stepscope.analysis.pipeline import MERGED_LIMIT_MB, analyze_uri
    from stepscope.analysis.statistics.gpu_scope import DEFAULT_COMM_KERNELS

    return analyze_uri(
        source,
        endpoint=endpoint,
        region=region,
        credentials=credentials,
        progress=progress,
        output=output,
        merged_limit_mb=MERGED_LIMIT_MB if merged_limit_mb is None else merged_limit_mb,
        on_ranks=on_ranks or (lambda analysed, total, skipped: None),
        ambient_credentials=ambient_credentials,
        comm=DEFAULT_COMM_KERNELS.with_user(list(comm_kernel_patterns)),
    )


def diff(
    a: str, b: str, *, endpoint: str | None = None, region: str | None = None, min_change: float | None = None
) -> tuple[RunDiff, bool]:
    """What changed from run `a` to run `b` (the same kinds of source as load), and whether the
    comparison rests on edge summaries (their top kernels only)."""
    from stepscope.analysis.comparison.diff import MIN_CHANGE
    from stepscope.analysis.comparison.diff_command import compare

    return compare(a, b, endpoint=endpoint, region=region, min_change=MIN_CHANGE if min_change is None else min_change)


# The `stepscope analyze` and `stepscope diff` subcommands (stepscope/cli.py's contract).


def add_analyze_arguments(parser: argparse.ArgumentParser) -> None:
    from stepscope.analysis.pipeline import add_arguments

    add_arguments(parser)


def run_analyze(args: argparse.Namespace) -> int:
    from stepscope.analysis.pipeline import run

    return run(args)


def add_diff_arguments(parser: argparse.ArgumentParser) -> None:
    from stepscope.analysis.comparison.diff_command import add_arguments

    add_arguments(parser)


def run_diff(args: argparse.Namespace) -> int:
    from stepscope.analysis.comparison.diff_command import run

    return run(args)
