"""What a captured session holds, from a store listing: per-rank summaries, raw traces and stacks,
and per-pod NVML samples. Two layouts are understood: stepscope's (ranks/rank-<r>.*, nodes/<pod>/)
and a flat folder of raw Kineto traces, one per rank, the rank in the file name or inside (HTA's
layout, and the agent's session folder with its rank-<r>.stacks.json).
Reading never raises for one bad rank: each problem is kept with its rank for the report."""
from __future__ import annotations

import contextlib
import functools
import re
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from stepscope.analysis.loading.parallel import analysis_workers, worker_pool
from stepscope.analysis.loading.trace import NOT_A_TRACE
from stepscope.analysis.model import RANK_DIGITS, SUMMARY_VERSION, RankSummary, decode_summary
from stepscope.analysis.statistics.gpu_scope import DEFAULT_COMM_KERNELS, CommKernels
from stepscope.analysis.statistics.summary import rank_from_name
from stepscope.contracts import layout
from stepscope.storage import Store, StoreError, open_store

_RAW_TRACE = re.compile(r"^[^/]+\.json(?:\.gz)?$")
# The agent's own folder holds traces next to its state and stacks files (wire.md).
_FLAT_STACKS = re.compile(r"^rank-(\d+)\.stacks\.json$")
_NOT_TRACE = re.compile(r"\.(state|stacks|summary)\.json$|^(session|request)\.json$")
# Raw traces summarised in parallel processes, when together at least this large.
PARALLEL_BYTES = 64 << 20
# Gaps below this are ranks that sent nothing; a number above it (a corrupt rank field or file
# name) is not taken to mean that every rank up to it is missing. The merged trace numbers pids
# for as many ranks.
MAX_RANKS = 10 ** RANK_DIGITS
# A rank's summary or stacks file is a few tens of KB (41 KB for the benchmark's 286 MB rank); one
# far larger is no such file, and decoding it would hold several times its size.
MAX_JSON_FILE_BYTES = 32 << 20


class _Frame(msgspec.Struct):
    file: str | None = None
    line: int | None = None
    function: str | None = None


class _Thread(msgspec.Struct):
    main: bool | None = None
    frames: list[_Frame] | None = None


class _StacksShape(msgspec.Struct):
    """The parts of a stacks file (wire.md) the hang findings read, to check a file before use."""
    step: int | None = None
    secondsSinceStep: float | None = None
    threads: list[_Thread] | None = None


@dataclass
class RankFiles:
    rank: int | None  # None: an HTA-layout trace whose rank only its distributedInfo says
    summary: str | None = None
    trace: str | None = None
    stacks: str | None = None


@dataclass
class SessionFiles:
    store: Store
    ranks: list[RankFiles]
    metrics: dict[str, str] = field(default_factory=dict)  # pod -> key
    layout: str = "stepscope"  # or "flat": a folder of traces (HTA's layout, the agent's folder)


def open_session(source: str, *, endpoint: str | None = None, region: str | None = None, credentials: dict | None = None,
                 ambient_credentials: bool = True) -> tuple[Store, str | None]:
    """The store holding a session, and the one file to analyse when `source` is a single trace."""
    path = Path(source.removeprefix("file://")) if "://" not in source or source.startswith("file://") else None
    if path is not None and not path.exists():
        raise StoreError(f"{source} does not exist")
    if "://" not in source and path is not None and path.is_file():
        return open_store(str(path.resolve().parent)), path.name
    return open_store(source, endpoint=endpoint, region=region, credentials=credentials, ambient_credentials=ambient_credentials), None


def find_files(store: Store, only: str | None = None) -> SessionFiles:
    """Group the session's keys by rank."""
    keys = [only] if only else store.list()
    ranks: dict[int, RankFiles] = {}
    metrics: dict[str, str] = {}
    for key in keys:
        m = layout.RANK_FILE.match(key)
        if m:
            files = ranks.setdefault(int(m[1]), RankFiles(int(m[1])))
            kind = m[2].split(".", 1)[0]
            setattr(files, kind, key)
            continue
        m = layout.NODE_METRICS.match(key)
        if m:
            metrics[m[1]] = key
    if ranks or metrics:
        return SessionFiles(store, [ranks[r] for r in sorted(ranks)], metrics)
    raw = sorted(k for k in keys if _RAW_TRACE.match(k) and not _NOT_TRACE.search(k))
    flat = [RankFiles(rank_from_name(k), trace=k) for k in raw]
    for key in keys:
        m = _FLAT_STACKS.match(key)
        if m:
            owner = next((f for f in flat if f.rank == int(m[1])), None)
            if owner is None:
                flat.append(owner := RankFiles(int(m[1])))
            owner.stacks = key
    return SessionFiles(store, flat, {}, layout="flat")


@contextlib.contextmanager
def local_path(store: Store, key: str) -> Iterator[Path]:
    """A file on this machine with the object's content: the file itself for a directory store,
    else a temporary download removed afterwards (raw traces can be hundreds of MB)."""
    root = getattr(store, "root", None)
    if root is not None:
        yield Path(root) / key
        return
    with tempfile.TemporaryDirectory(prefix="stepscope-") as tmp:
        yield store.download(key, Path(tmp) / Path(key).name)


def read_small(store: Store, key: str) -> bytes:
    """The object's bytes, when it holds at most MAX_JSON_FILE_BYTES (its size is checked before
    it is read); else StoreError."""
    with local_path(store, key) as path:
        try:
            size = path.stat().st_size
            if size > MAX_JSON_FILE_BYTES:
                raise StoreError(f"{key} holds {size / 1e6:,.0f} MB, more than the {MAX_JSON_FILE_BYTES >> 20} MiB such a file may")
            return path.read_bytes()
        except OSError as exc:
            raise StoreError(f"cannot read {key}: {exc.strerror or exc}") from exc


def failed(rank: int, error: str, **known: Any) -> RankSummary:
    return RankSummary(version=SUMMARY_VERSION, rank=rank, error=error, **known)


def read_summary(store: Store, files: RankFiles, fallback_rank: int, top: int = 50,
                 comm: CommKernels = DEFAULT_COMM_KERNELS) -> RankSummary:
    """The rank's summary: the uploaded one, else one made now from its raw trace (keeping the
    `top` kernels of each type and Python functions, `comm` its communication kernels), else an error."""
    return _read_summary(store, files, fallback_rank, top, comm)[0]


def _read_summary(store: Store, files: RankFiles, fallback_rank: int, top: int = 50,
                  comm: CommKernels = DEFAULT_COMM_KERNELS) -> tuple[RankSummary, bool]:
    """read_summary, and whether its raw trace was parsed whole doing it."""
    rank = files.rank if files.rank is not None else fallback_rank
    problem = ""
    if files.summary:
        try:
            summary = decode_summary(read_small(store, files.summary))
            if summary.rank < 0:
                summary.warnings.append(f"{files.summary} says rank {summary.rank}; shown as rank {rank}")
                summary.rank = rank
            return summary, False
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError) as exc:
            problem = f"{files.summary} is not a valid summary ({exc})"
        except StoreError as exc:
            problem = f"cannot read {files.summary}: {exc}"
    if files.trace:
        from stepscope.analysis.statistics.summary import summarize_file
        try:
            with local_path(store, files.trace) as path:
                summary = summarize_file(path, rank=files.rank, top=top, comm=comm)
        except StoreError as exc:
            return failed(rank, f"cannot read {files.trace}: {exc}"), False
        if problem:
            summary.warnings.append(problem + "; summarised the raw trace instead")
        if summary.rank is None or summary.rank < 0:
            summary.rank = rank
        return summary, not summary.error
    if problem:
        return failed(rank, problem), False
    if files.stacks:
        return failed(rank, "no trace or summary was uploaded, only Python stacks (see the hang findings)"), False
    return failed(rank, "no trace or summary was uploaded for this rank"), False


def read_stacks(store: Store, files: RankFiles) -> tuple[dict | None, str]:
    """The rank's stacks file, or None and why it could not be read."""
    if not files.stacks:
        return None, ""
    try:
        data = msgspec.json.decode(read_small(store, files.stacks))
    except (msgspec.DecodeError, StoreError, RecursionError) as exc:
        return None, f"{files.stacks} cannot be read: {exc}"
    if not isinstance(data, dict):
        return None, f"{files.stacks} is not a stacks file (expected a JSON object)"
    try:
        msgspec.convert(data, _StacksShape)
    except msgspec.ValidationError as exc:
        return None, f"{files.stacks} is not a stacks file ({exc})"
    return data, ""


def missing_ranks(summaries: list[RankSummary]) -> list[int]:
    """Gaps in the rank numbers found. Ranks above the highest one are not counted missing: a
    session may select some pods of a job, and HTA's sample sets keep 2 ranks of 128."""
    known = {s.rank for s in summaries if 0 <= s.rank < MAX_RANKS}
    return sorted(set(range(min(known), max(known) + 1)) - known) if known else []


def _summaries(files: SessionFiles, top: int, on_rank: Callable[[str], object], pool: Executor,
               comm: CommKernels) -> list[tuple[RankSummary, bool]]:
    """_read_summary of every rank, in files.ranks order. Large raw traces in a directory are
    summarised in the pool's processes (the summariser is single-threaded and streams, so a
    process holds a couple of hundred MB whatever the trace size)."""
    jobs = [(f, f.rank if f.rank is not None else i) for i, f in enumerate(files.ranks)]
    root = getattr(files.store, "root", None)
    raw = [Path(root) / f.trace for f, _ in jobs if f.trace and not f.summary] if root is not None else []
    if len(raw) < 2 or sum(p.stat().st_size for p in raw if p.exists()) < PARALLEL_BYTES:
        out = []
        for f, rank in jobs:
            out.append(_outcome(functools.partial(_read_summary, files.store, f, rank, top, comm), f, rank))
            on_rank(f.trace or f.summary or f.stacks or "")
        return out
    futures = {pool.submit(_read_summary, files.store, f, rank, top, comm): (f, rank) for f, rank in jobs}
    for done in as_completed(futures):
        f = futures[done][0]
        on_rank(f.trace or f.summary or f.stacks or "")
    return [_outcome(future.result, *futures[future]) for future in futures]


def _outcome(read: Callable[[], tuple[RankSummary, bool]], files: RankFiles, rank: int) -> tuple[RankSummary, bool]:
    """The rank's summary, or a failed one saying why: a rank whose reading fails in a way
    nobody foresaw (its worker process killed, an analysis bug) costs that rank alone."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - one bad rank never stops the others
        return failed(rank, f"{files.trace or files.summary or files.stacks}: reading failed: {type(exc).__name__}: {exc}"), False


@dataclass
class SessionRanks:
    summaries: list[RankSummary]  # one per rank, sorted; a rank that could not be read has `error`
    stacks: dict[int, dict]
    problems: dict[int, list[str]]
    traces: dict[int, str]  # rank -> raw trace key
    skipped: list[str] = field(default_factory=list)  # files of a trace folder that are no traces
    parsed: set[int] = field(default_factory=set)  # ranks whose raw trace this run read whole


def read_ranks(files: SessionFiles, on_rank: Callable[[str], object] = lambda name: None, top: int = 50,
               pool: Executor | None = None, comm: CommKernels = DEFAULT_COMM_KERNELS) -> SessionRanks:
    """Every rank's summary, stacks and problems; `on_rank` hears of each rank file set read.
    Raw traces are summarised in `pool` (a pool of its own when None), `comm` their communication kernels."""
    if pool is None:
        with worker_pool(analysis_workers(len(files.ranks))) as own:
            return read_ranks(files, on_rank, top, own, comm)
    summaries: dict[int, RankSummary] = {}
    stacks: dict[int, dict] = {}
    problems: dict[int, list[str]] = {}
    traces: dict[int, str] = {}
    parsed: set[int] = set()
    next_free = max([f.rank for f in files.ranks if f.rank is not None] + [-1]) + 1
    read = list(zip(files.ranks, _summaries(files, top, on_rank, pool, comm)))
    # A file in a folder of traces that is no trace, with no rank in its name, is no rank at all.
    skipped = [f.trace for f, (s, _) in read if f.rank is None and f.trace and not f.summary and NOT_A_TRACE in s.error]
    read = [(f, sw) for f, sw in read if f.trace not in skipped or f.summary]
    # Ranks a trace says it is (distributedInfo) are claimed before a failed file takes its place
    # in file order, so no unreadable file renumbers a readable rank.
    for rank_files, (summary, whole) in sorted(read, key=lambda fs: bool(fs[1][0].error)):
        if summary.rank in summaries:
            taken = summary.rank
            if rank_files.rank is not None and rank_files.rank not in summaries:
                summary.rank = rank_files.rank  # the file's name says which rank it is for
            else:
                summary.rank, next_free = next_free, next_free + 1
            problems.setdefault(summary.rank, []).append(
                f"{rank_files.summary or rank_files.trace} also says rank {taken}; shown as rank {summary.rank}")
        summaries[summary.rank] = summary
        if rank_files.trace:
            traces[summary.rank] = rank_files.trace
        if whole:
            parsed.add(summary.rank)
        data, why = read_stacks(files.store, rank_files)
        if data is not None:
            stacks[summary.rank] = data
        if why:
            problems.setdefault(summary.rank, []).append(why)
    for rank in missing_ranks(list(summaries.values())):
        summaries[rank] = failed(rank, "no trace or summary was uploaded for this rank")
    for s in summaries.values():
        if s.error:
            problems.setdefault(s.rank, []).append(s.error)
        if s.warnings:
            problems.setdefault(s.rank, []).extend(s.warnings)
    return SessionRanks([summaries[r] for r in sorted(summaries)], stacks, problems, traces, skipped, parsed)
