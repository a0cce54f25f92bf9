"""What a captured session holds, from a store listing: per-rank summaries, raw traces and stacks,
and per-pod NVML samples. Two layouts are understood: stepscope's (ranks/rank-<r>.*, nodes/<pod>/)
and a flat folder of raw Kineto traces, one per rank, the rank in the file name or inside (HTA's
layout, and the agent's session folder with its rank-<r>.stacks.json).
Reading never raises for one bad rank: each problem is kept with its rank for the report."""

from __future__ import annotations

import collections
import contextlib
import functools
import re
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from stepscope.analysis.loading.allocation import give_back_free_memory
from stepscope.analysis.loading.parallel import analysis_workers, usable_cores, worker_pool
from stepscope.analysis.loading.trace import NOT_A_TRACE
from stepscope.analysis.model import (
    RANK_DIGITS,
    SUMMARY_VERSION,
    RankSummary,
    compact,
    compact_schema,
    decode_summaries,
    summaries_table,
    table_summaries,
)
from stepscope.analysis.statistics.gpu_scope import DEFAULT_COMM_KERNELS, CommKernels
from stepscope.analysis.statistics.summary import rank_from_name
from stepscope.contracts import layout
from stepscope.storage import Store, StoreError, open_store

_RAW_TRACE = re.compile(r"^[^/]+\.json(?:\.gz)?$")
# An Ascend NPU capture (torch_npu): its folder's parsed output, and the file naming its rank.
_ASCEND_TRACE = re.compile(r"^(?:(.*)/)?ASCEND_PROFILER_OUTPUT/trace_view\.json$")
_ASCEND_RANK = re.compile(r"^(?:(.*)/)?profiler_info_(\d+)\.json$")
# The agent's own folder holds traces next to its state and stacks files (wire.md).
_FLAT_STACKS = re.compile(r"^rank-(\d+)\.stacks\.json$")
_NOT_TRACE = re.compile(r"\.(state|stacks|summary)\.json$|^(session|request)\.json$")
# Raw traces summarised in parallel processes, when together at least this large.
PARALLEL_BYTES = 64 << 20
# Gaps below this are ranks that sent nothing; a number above it (a corrupt rank field or file
# name) is not taken to mean that every rank up to it is missing. The merged trace numbers pids
# for as many ranks.
MAX_RANKS = 10**RANK_DIGITS
# A rank's summary or stacks file is a few tens of KB (41 KB for the benchmark's 286 MB rank); one
# far larger is no such file, and decoding it would hold several times its size.
MAX_JSON_FILE_BYTES = 32 << 20
# Ranks whose summaries are decoded together, then copied out of the bytes they were read from.
COMPACT_EVERY = 256
# A session's table above this size (thousands of ranks) leaves free about as much again of what
# reading held: worth giving back to the system before the diagnosis allocates its own.
GIVE_BACK_ABOVE = 128 << 20

T = TypeVar("T")


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


def open_session(
    source: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    credentials: dict | None = None,
    ambient_credentials: bool = True,
) -> tuple[Store, str | None]:
    """The store holding a session, and the one file to analyse when `source` is a single trace."""
    path = Path(source.removeprefix("file://")) if "://" not in source or source.startswith("file://") else None
    if path is not None and not path.exists():
        raise StoreError(f"{source} does not exist")
    if "://" not in source and path is not None and path.is_file():
        return open_store(str(path.resolve().parent)), path.name
    return open_store(
        source, endpoint=endpoint, region=region, credentials=credentials, ambient_credentials=ambient_credentials
    ), None


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
            if not (
                kind == "summary" and files.summary == layout.rank_summary(int(m[1]))
            ):  # the Arrow one, where both are
                setattr(files, kind, key)
            continue
        m = layout.NODE_METRICS.match(key)
        if m:
            metrics[m[1]] = key
    if ranks or metrics:
        return SessionFiles(store, [ranks[r] for r in sorted(ranks)], metrics)
    raw = sorted(k for k in keys if _RAW_TRACE.match(k) and not _NOT_TRACE.search(k))
    flat = [RankFiles(rank_from_name(k), trace=k) for k in raw]
    ascend_ranks = {m[1] or "": int(m[2]) for k in keys if (m := _ASCEND_RANK.match(k))}
    flat += [RankFiles(ascend_ranks.get(m[1] or ""), trace=k) for k in sorted(keys) if (m := _ASCEND_TRACE.match(k))]
    for key in keys:
        m = _FLAT_STACKS.match(key)
        if m:
            owner = next((f for f in flat if f.rank == int(m[1])), None)
            if owner is None:
                flat.append(owner := RankFiles(int(m[1])))
            owner.stacks = key
    return SessionFiles(store, flat, {}, layout="flat")


def is_ascend_capture(key: str) -> bool:
    """The key is an Ascend NPU capture's trace_view.json (its times are epoch µs as strings)."""
    return _ASCEND_TRACE.match(key) is not None


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
    return store.get_bytes(key, max_bytes=MAX_JSON_FILE_BYTES)


def failed(rank: int, error: str, **known: Any) -> RankSummary:
    return RankSummary(version=SUMMARY_VERSION, rank=rank, error=error, **known)


def read_summary(
    store: Store, files: RankFiles, fallback_rank: int, top: int = 50, comm: CommKernels = DEFAULT_COMM_KERNELS
) -> RankSummary:
    """The rank's summary: the uploaded one, else one made now from its raw trace (keeping the
    `top` kernels of each type and Python functions, `comm` its communication kernels), else an error."""
    return _read_summary(store, files, fallback_rank, top, comm)[0]


def _read_summary(
    store: Store, files: RankFiles, fallback_rank: int, top: int = 50, comm: CommKernels = DEFAULT_COMM_KERNELS
) -> tuple[RankSummary, bool]:
    """read_summary, and whether its raw trace was parsed whole doing it."""
    rank = files.rank if files.rank is not None else fallback_rank
    chunk = _chunk(store, [(files, rank, _uploaded(store, files))], top, comm)
    return table_summaries(chunk.table)[0], chunk.whole[0]


def _uploaded(store: Store, files: RankFiles) -> bytes | str:
    """The bytes of the rank's uploaded summary, or why they cannot be read ('' where none was)."""
    if not files.summary:
        return ""
    try:
        return read_small(store, files.summary)
    except StoreError as exc:
        return f"cannot read {files.summary}: {exc}"


def _from_trace(
    store: Store, files: RankFiles, rank: int, top: int, comm: CommKernels, problem: str
) -> tuple[RankSummary, bool]:
    """A rank without a usable uploaded summary (`problem` says why; '' where none was uploaded):
    summarised from its raw trace, else failed with why; and whether the trace was parsed whole."""
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


@dataclass
class _Chunk:
    """Summaries of a few hundred ranks as one table, and for each row its files and whether its
    raw trace was parsed whole."""

    table: pa.Table
    files: list[RankFiles]
    whole: list[bool]


def _chunk(store: Store, group: list[tuple[RankFiles, int, bytes | str]], top: int, comm: CommKernels) -> _Chunk:
    """The ranks of `group` (files, the rank to show where it knows none, its uploaded summary's
    bytes or why there are none): the uploaded summaries decoded together, the others made from
    raw traces or failed one by one."""
    blobs = [k for k, (_, _, data) in enumerate(group) if isinstance(data, bytes)]
    table, rows, errors = decode_summaries([data for _, _, data in group if isinstance(data, bytes)])
    # A chunk per summary until here: every later step would pay per chunk.
    table = compact(table.combine_chunks())
    negative = pc.less(table.column("rank"), 0)
    kept = pc.indices_nonzero(pc.invert(negative)).to_pylist()
    alone: list[tuple[int, RankSummary, bool]] = []
    for i in pc.indices_nonzero(negative).to_pylist():
        files, rank, _ = group[blobs[rows[i]]]
        summary = table_summaries(table.slice(i, 1))[0]
        summary.warnings.append(f"{files.summary} says rank {summary.rank}; shown as rank {rank}")
        summary.rank = rank
        alone.append((blobs[rows[i]], summary, False))
    problems = {blobs[i]: f"{group[blobs[i]][0].summary} is not a valid summary ({why})" for i, why in errors.items()}
    problems |= {k: data for k, (_, _, data) in enumerate(group) if isinstance(data, str)}
    for k, problem in problems.items():
        files, rank, _ = group[k]
        summary, whole = _outcome(functools.partial(_from_trace, store, files, rank, top, comm, problem), files, rank)
        alone.append((k, summary, whole))
    if len(kept) < len(table):
        table = table.take(kept)
    order = [blobs[rows[i]] for i in kept] + [k for k, _, _ in alone]
    if alone:
        table = pa.concat_tables([table, compact(summaries_table([s for _, s, _ in alone]))])
    parsed = dict.fromkeys(order, False) | {k: w for k, _, w in alone}
    return _Chunk(table.combine_chunks(), [group[k][0] for k in order], [parsed[k] for k in order])


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


def missing_ranks(ranks: list[int]) -> list[int]:
    """Gaps in the rank numbers found. Ranks above the highest one are not counted missing: a
    session may select some pods of a job, and HTA's sample sets keep 2 ranks of 128."""
    known = {r for r in ranks if 0 <= r < MAX_RANKS}
    return sorted(set(range(min(known), max(known) + 1)) - known) if known else []


def _in_order(read: Callable[[Any], T], items: list[Any], workers: int) -> Iterator[T]:
    """read(item) of every item, in order, at most `workers` at once and at most twice as many
    results held ahead of the caller (so what is read waits in memory only briefly)."""
    if workers <= 1 or len(items) < 2:
        yield from map(read, items)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="stepscope-read") as threads:
        pending: collections.deque[Future[T]] = collections.deque()
        for item in items:
            pending.append(threads.submit(read, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _summaries(
    files: SessionFiles, top: int, on_rank: Callable[[str], object], pool: Executor, comm: CommKernels
) -> Iterator[_Chunk]:
    """Every rank's summary (_read_summary), COMPACT_EVERY ranks to a chunk. Uploaded summaries are
    read from the store as many at a time as it takes (Store.parallel_reads; the store's own retries apply to each) and
    decoded together as they come, so memory holds the columns and not every rank's file; large
    raw traces in a directory are summarised in the pool's processes (the summariser is
    single-threaded and streams, so a process holds a couple of hundred MB whatever the trace size)."""
    jobs = [(f, f.rank if f.rank is not None else i) for i, f in enumerate(files.ranks)]
    root = getattr(files.store, "root", None)
    raw = [Path(root) / f.trace for f, _ in jobs if f.trace and not f.summary] if root is not None else []
    if len(raw) < 2 or sum(p.stat().st_size for p in raw if p.exists()) < PARALLEL_BYTES:

        def fetch(job: tuple[RankFiles, int]) -> tuple[RankFiles, int, bytes | str]:
            return job[0], job[1], _uploaded(files.store, job[0])

        # Decoding a chunk is Arrow's work outside the GIL: a chunk per core decodes while the next is read.
        cores = usable_cores()
        with ThreadPoolExecutor(cores, thread_name_prefix="stepscope-decode") as decoders:
            decoding: collections.deque[Future[_Chunk]] = collections.deque()
            group: list[tuple[RankFiles, int, bytes | str]] = []
            for got in _in_order(fetch, jobs, files.store.parallel_reads):
                on_rank(got[0].trace or got[0].summary or got[0].stacks or "")
                group.append(got)
                if len(group) >= COMPACT_EVERY:
                    decoding.append(decoders.submit(_chunk, files.store, group, top, comm))
                    group = []
                    if len(decoding) > cores:
                        yield decoding.popleft().result()
            if group:
                decoding.append(decoders.submit(_chunk, files.store, group, top, comm))
            while decoding:
                yield decoding.popleft().result()
        return
    futures = {pool.submit(_read_summary, files.store, f, rank, top, comm): (f, rank) for f, rank in jobs}
    for done in as_completed(futures):
        f = futures[done][0]
        on_rank(f.trace or f.summary or f.stacks or "")
    read = [(futures[future][0], *_outcome(future.result, *futures[future])) for future in futures]
    for i in range(0, len(read), COMPACT_EVERY):
        part = read[i : i + COMPACT_EVERY]
        yield _Chunk(
            compact(summaries_table([s for _, s, _ in part])), [f for f, _, _ in part], [w for _, _, w in part]
        )


def _outcome(read: Callable[[], tuple[RankSummary, bool]], files: RankFiles, rank: int) -> tuple[RankSummary, bool]:
    """The rank's summary, or a failed one saying why: a rank whose reading fails in a way
    nobody foresaw (its worker process killed, an analysis bug) costs that rank alone."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - one bad rank never stops the others
        return failed(
            rank, f"{files.trace or files.summary or files.stacks}: reading failed: {type(exc).__name__}: {exc}"
        ), False


@dataclass
class SessionRanks:
    table: pa.Table  # one row per rank (compact_schema()), sorted; a rank that could not be read has `error`
    stacks: dict[int, dict]
    problems: dict[int, list[str]]
    traces: dict[int, str]  # rank -> raw trace key
    skipped: list[str] = field(default_factory=list)  # files of a trace folder that are no traces
    parsed: set[int] = field(default_factory=set)  # ranks whose raw trace this run read whole

    @functools.cached_property
    def summaries(self) -> list[RankSummary]:
        """The rows as RankSummary objects, for the readers of a few ranks (the analysis reads `table`)."""
        return table_summaries(self.table)


@dataclass
class _Read:
    files: RankFiles
    rank: int
    error: str
    whole: bool


def read_ranks(
    files: SessionFiles,
    on_rank: Callable[[str], object] = lambda name: None,
    top: int = 50,
    pool: Executor | None = None,
    comm: CommKernels = DEFAULT_COMM_KERNELS,
) -> SessionRanks:
    """Every rank's summary, stacks and problems; `on_rank` hears of each rank file set read.
    Raw traces are summarised in `pool` (a pool of its own when None), `comm` their communication kernels.
    The summaries go into one table as they are read, a few hundred ranks at a time."""
    if pool is None:
        with worker_pool(analysis_workers(len(files.ranks))) as own:
            return read_ranks(files, on_rank, top, own, comm)
    read: list[_Read] = []
    chunks = []
    for chunk in _summaries(files, top, on_rank, pool, comm):
        ranks, errors = chunk.table.column("rank").to_pylist(), chunk.table.column("error").to_pylist()
        read += [_Read(f, r, e, w) for f, r, e, w in zip(chunk.files, ranks, errors, chunk.whole)]
        chunks.append(chunk.table)
    table = pa.concat_tables(chunks) if chunks else compact_schema().empty_table()
    stacks: dict[int, dict] = {}
    problems: dict[int, list[str]] = {}
    traces: dict[int, str] = {}
    parsed: set[int] = set()
    next_free = max([f.rank for f in files.ranks if f.rank is not None] + [-1]) + 1
    # A file in a folder of traces that is no trace, with no rank in its name, is no rank at all.
    skipped = [
        r.files.trace
        for r in read
        if r.files.rank is None and r.files.trace and not r.files.summary and NOT_A_TRACE in r.error
    ]
    kept = [i for i, r in enumerate(read) if r.files.trace not in skipped or r.files.summary]
    taken: dict[int, int] = {}  # rank -> its row in `table`
    # Ranks a trace says it is (distributedInfo) are claimed before a failed file takes its place
    # in file order, so no unreadable file renumbers a readable rank.
    for i in sorted(kept, key=lambda i: bool(read[i].error)):
        r = read[i]
        rank = r.rank
        if rank in taken:
            if r.files.rank is not None and r.files.rank not in taken:
                rank = r.files.rank  # the file's name says which rank it is for
            else:
                rank, next_free = next_free, next_free + 1
            problems.setdefault(rank, []).append(
                f"{r.files.summary or r.files.trace} also says rank {r.rank}; shown as rank {rank}"
            )
        taken[rank] = i
        if r.files.trace:
            traces[rank] = r.files.trace
        if r.whole:
            parsed.add(rank)
        data, why = read_stacks(files.store, r.files)
        if data is not None:
            stacks[rank] = data
        if why:
            problems.setdefault(rank, []).append(why)
    missing = missing_ranks(list(taken))
    if missing:
        gaps = compact(
            summaries_table([failed(rank, "no trace or summary was uploaded for this rank") for rank in missing])
        )
        taken.update({rank: len(table) + i for i, rank in enumerate(missing)})
        table = pa.concat_tables([table, gaps])
    order = sorted(taken)
    rows = [taken[r] for r in order]
    if rows != list(range(len(table))):
        table = table.take(rows)
    table = table.set_column(table.schema.get_field_index("rank"), "rank", pa.array(order, type=pa.int64()))
    # One chunk: the diagnosis' tables then view its numbers (pandas over Arrow's buffers) rather than copy them.
    table = table.combine_chunks()
    if table.nbytes > GIVE_BACK_ABOVE:
        give_back_free_memory()  # the summaries' bytes and the chunks before they were joined
    _add_problems(table, problems)
    return SessionRanks(table, stacks, problems, traces, skipped, parsed)


def _add_problems(table: pa.Table, problems: dict[int, list[str]]) -> None:
    """Each rank's error and warnings go to its problems, for the report."""
    warnings = table.column("warnings")
    ranks, errors = table.column("rank").to_pylist(), table.column("error").to_pylist()
    for i in pc.indices_nonzero(
        pc.or_(pc.not_equal(table.column("error"), ""), pc.greater(pc.list_value_length(warnings), 0))
    ).to_pylist():
        if errors[i]:
            problems.setdefault(ranks[i], []).append(errors[i])
        if texts := warnings[i].as_py():
            problems.setdefault(ranks[i], []).extend(texts)
