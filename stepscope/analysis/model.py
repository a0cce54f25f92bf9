"""The rank summary and the diagnosis: the data the edge (sidecar) and the analysis Job exchange.

Private to stepscope.analysis and versioned inside the file (`version`): the same package writes
summaries at the edge and reads them in the Job. msgspec Structs keep encoding and decoding of
thousands of summaries fast. Times are microseconds unless a name says otherwise; percentages are
0..100. Field names are camelCase because they are written as JSON and shown to users.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any

import msgspec

SUMMARY_VERSION = 1
# Ranks of one session are numbered below 10 ** RANK_DIGITS: the session reader takes a higher
# number for a corrupt one, and the merged trace writes each rank in as many digits into its pids.
RANK_DIGITS = 5


class Struct(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=False):
    pass


class StepRow(Struct):
    """One profiler step: HTA's temporal breakdown and the Ascend step table."""

    step: int
    startUs: float
    durationUs: float
    # HTA temporal breakdown (GPU time of the step by idle / compute / non-compute kernels).
    idleUs: float = 0.0
    computeUs: float = 0.0
    nonComputeUs: float = 0.0
    # Ascend step table.
    computingUs: float = 0.0
    commNotOverlappedUs: float = 0.0
    overlappedUs: float = 0.0
    communicationUs: float = 0.0
    freeUs: float = 0.0
    # Traces without GPU events: time of the step inside at least one collective call (gloo), the
    # union of their intervals, so calls running at once on the backend's threads count once (the
    # per-kind CollectiveStat.sumUs counts each). None on GPU traces and in older summaries.
    collectiveUs: float | None = None
    # The training thread's time on a CPU and waiting in the run queue in the step (Linux schedstat,
    # recorded by stepscope's agent); None where the trace has no such counters.
    cpuUs: float | None = None
    runDelayUs: float | None = None
    # Of runDelayUs, the time its cgroup's CPU limit held it throttled (cgroup cpu.stat, recorded by
    # the agent; at most the run-queue time: the cgroup may be throttled while this thread sleeps).
    # None where the agent found no cgroup CPU controller.
    throttledUs: float | None = None
    # The time its process was stopped in the step (a SIGSTOP, a frozen cgroup, a paused container:
    # how late the agent's stop watch woke beyond its wait for a CPU, wire.STOPPED_KEY), in its
    # sleeps and collectives too. None where the agent had no stop watch.
    stoppedUs: float | None = None


class TemporalBreakdown(Struct):
    idleUs: float
    computeUs: float
    nonComputeUs: float
    idlePct: float
    computePct: float
    nonComputePct: float
    spanUs: float = 0.0  # HTA's kernel_time: first kernel start to last kernel end


class StreamIdle(Struct):
    stream: int
    hostWaitUs: float
    kernelWaitUs: float
    otherUs: float


class IdleBreakdown(Struct):
    """HTA's idle-time categories (consecutive-kernel threshold semantics)."""

    hostWaitUs: float
    kernelWaitUs: float
    otherUs: float
    streams: list[StreamIdle] = []  # the same split per GPU stream, as HTA reports it


class KernelTypeShare(Struct):
    type: str  # COMM | COMP | MEM
    sumUs: float
    pct: float


class KernelStat(Struct):
    """One kernel name: PerfTracker's major-kernel row and HTA's top-kernel row."""

    name: str
    type: str
    count: int
    sumUs: float
    meanUs: float
    medianUs: float
    minUs: float
    maxUs: float
    stdUs: float = 0.0
    notOverlappedUs: float = 0.0
    bottleneckRatio: float = 0.0  # time not overlapped with compute / captured wall time


class CollectiveStat(Struct):
    kind: str  # AllReduce, AllGather, ReduceScatter, SendRecv, Broadcast, ...
    count: int
    sumUs: float
    medianUs: float
    algorithm: str = ""
    protocol: str = ""
    bytes: int = 0
    busBandwidthGBs: float = 0.0
    bottleneckRatio: float = 0.0
    # Durations in issue order, so the diagnosis can line up the i-th collective across ranks
    # (the rank that arrived last waits least).
    durationsUs: list[float] = []


class MemoryOpStat(Struct):
    kind: str  # Memcpy HtoD | Memcpy DtoH | Memcpy DtoD | Memset | ...
    count: int
    sumUs: float
    bytes: int = 0
    bandwidthGBs: float = 0.0
    bottleneckRatio: float = 0.0


class RuntimeStat(Struct):
    name: str  # cudaLaunchKernel, cudaMemcpyAsync, hipLaunchKernel, ...
    count: int
    sumUs: float
    bottleneckRatio: float = 0.0
    notOverlappedUs: float = 0.0  # time of the calls while no GPU compute runs


class LaunchStats(Struct):
    """HTA's CUDA launch statistics."""

    launches: int
    launchDelayMedianUs: float = 0.0
    launchDelayP95Us: float = 0.0
    shortKernels: int = 0  # kernels shorter than the short-kernel threshold
    shortKernelThresholdUs: float = 0.0
    runtimeOutliers: int = 0  # runtime calls far longer than their peers
    launchDelayOutliers: int = 0  # launch delays above HTA's 100 µs cutoff
    launchDelayMeanUs: float = 0.0
    cpuDurationMeanUs: float = 0.0  # mean duration of the launch calls themselves


class FunctionStat(Struct):
    """A Python function (grouped by call stack) with its exclusive time not overlapped with GPU work."""

    name: str
    stack: str
    count: int
    exclusiveUs: float
    notOverlappedUs: float
    bottleneckRatio: float = 0.0
    # Exclusive µs in each captured step (RankSummary.steps' order); empty without steps or in
    # older summaries. A cause repeats every step; a hiccup of a loaded machine does not.
    stepsUs: list[float] = []


class DeviceSpec(Struct):
    """The rank's GPU (deviceProperties' name) and its datasheet peaks (statistics/devices.py)."""

    name: str
    model: str  # the row of the device table it matched
    tflops: dict[str, float] = {}  # dense TFLOP/s by dtype class: fp32, tf32, bf16, fp16, fp8
    tbs: float = 0.0  # memory bandwidth, TB/s


class PathShare(Struct):
    """An op, kernel or gap on a rank's critical path and its time on it."""

    name: str
    boundBy: str  # HTA's bound_by: cpu_bound, gpu_compute_bound, gpu_kernel_kernel_overhead, ...
    us: float


class CriticalPathSummary(Struct):
    """The longest chain of dependent CPU ops, launches, kernels and syncs over the rank's profiled
    steps (HTA's critical_path_analysis, metrics/critical_path.py)."""

    totalUs: float
    startUs: float
    endUs: float
    byBound: dict[str, float] = {}  # µs on the path by what bounds it
    top: list[PathShare] = []  # the ops and kernels of most time on the path
    # The longest edges of the path for the merged trace: [start µs, duration µs, index into
    # spanNames (the op, kernel or gap), boundBy].
    spans: list[tuple[float, float, int, str]] = []
    spanNames: list[str] = []


class OpEfficiency(Struct):
    """FLOPs and bytes of an op, from its recorded shapes, over the time of the kernels it launched
    (statistics/efficiency.py); for a kernel, its share of its ops' FLOPs and bytes."""

    name: str  # op (aten::addmm) or kernel
    family: str  # gemm | conv | attention | elementwise | reduction | normalization
    count: int
    gpuUs: float
    flops: float
    bytes: float
    tflops: float = 0.0  # achieved
    tbs: float = 0.0
    dtype: str = ""
    shapes: str = ""  # the op's input dims (for a kernel: those of its op of most time)
    related: str = ""  # an op's kernel of most time; a kernel's op of most time
    peakTflops: float = 0.0  # the device's for this dtype (0: unknown)
    peakTbs: float = 0.0
    # Achieved over the roofline at this arithmetic intensity, min(peak, intensity x bandwidth), in %;
    # None without the device's peaks.
    pctOfPeak: float | None = None


class OperatorStat(Struct):
    """An operator with the same input shapes (innermost operators only, on the thread that runs
    most of them: the time each takes itself), for the cross-rank comparison of operator time."""

    name: str
    shapes: str  # the profiler's "Input Dims" as JSON text ('' where shapes were not recorded)
    count: int
    sumUs: float
    stepsUs: list[float] = []  # µs in each captured step (RankSummary.steps' order)


class RankSummary(Struct):
    version: int
    rank: int
    worldSize: int = 0
    localRank: int = -1
    gpu: int = -1  # CUDA device index on its node, to join NVML samples; -1 when unknown
    backend: str = ""
    pod: str = ""
    node: str = ""
    source: str = ""
    # Kineto's baseTimeNanoseconds / 1000: step startUs + this = Unix epoch µs, the clock of the
    # NVML samples (0 for traces whose ts is already epoch µs).
    traceBaseUs: float = 0.0
    hasGpu: bool = False
    capturedUs: float = 0.0
    gpuUtilizationPct: float = 0.0
    steps: list[StepRow] = []
    temporal: TemporalBreakdown | None = None
    idle: IdleBreakdown | None = None
    kernelTypes: list[KernelTypeShare] = []
    kernels: list[KernelStat] = []
    overlapPct: float | None = None  # time communicating while computing / time communicating
    launch: LaunchStats | None = None
    memoryOps: list[MemoryOpStat] = []
    runtime: list[RuntimeStat] = []
    collectives: list[CollectiveStat] = []
    functions: list[FunctionStat] = []
    device: DeviceSpec | None = None
    opEfficiency: list[OpEfficiency] = []  # the ops of most GPU time with FLOPs from their shapes
    kernelEfficiency: list[OpEfficiency] = []
    operators: list[OperatorStat] = []
    criticalPath: CriticalPathSummary | None = None
    # Per-step hardware statistics from the node's NVML samples, keyed by metric name.
    hardware: dict[str, list[float]] = {}
    warnings: list[str] = []
    error: str = ""  # set when the trace could not be summarised; the diagnosis reports it
    # The UUID of the GPU the rank computes on, where the agent wrote it into the trace: ranks
    # with the same one share a device ("" where unknown).
    gpuUuid: str = ""


class SlowWorker(Struct):
    rank: int
    stepTimeMs: float
    # How much longer the job's step is with this rank than without it: its step time over its
    # peers' (jobs that do not synchronise), or the step over the step less the peers' wait for it.
    slowdown: float
    pod: str = ""
    node: str = ""
    cause: str = ""  # what it does while the others wait, in a few words
    # What it costs the job per step: its share of the measured lost time (the shares of all slow
    # workers add up to it), and the step without its cause alone.
    lostMsPerStep: float = 0.0
    stepWithoutMs: float = 0.0


class Finding(Struct):
    """One thing the diagnosis found. report/diagnosis.json holds every finding whole; the status
    holds the first few without `score` and `data` (their defaults, which are not encoded)."""

    severity: str  # critical | warning | info
    category: str  # slow-worker | kernel | python | communication | memory | launch | hang | hardware | trace
    ranks: list[int]
    message: str
    # Roughly the share of step time at stake: orders the findings of one severity, worst first.
    # 0 where the evidence has no such measure (an XID, a warning from the trace).
    score: float = 0.0
    # The figures behind the message, for the report (and data["claim"] for consistency.py).
    data: dict[str, Any] = {}

    def __post_init__(self) -> None:
        # Checks pass numpy figures and pandas' rank lists; the status and the report want plain,
        # sorted numbers.
        self.ranks = sorted(int(r) for r in self.ranks)
        self.score = float(self.score)


class Breakdown(Struct):
    computePct: float
    commNotOverlappedPct: float
    overlappedPct: float
    memoryPct: float
    idlePct: float


class StepTime(Struct):
    min: float
    median: float
    max: float


class Diagnosis(Struct):
    """What goes into the session's status (compact: the whole status stays under 32 KiB)."""

    summary: str
    stepTimeMs: StepTime | None = None
    slowWorkers: list[SlowWorker] = []
    breakdown: Breakdown | None = None
    findings: list[Finding] = []
    # 0..1, how sure the summary is (straggler.confidence); absent where the evidence has no such
    # measure (GPU traces judged by kernel and step times alone, hangs). Last: fields keep their places.
    confidence: float | None = None


def encode(obj: msgspec.Struct) -> bytes:
    return msgspec.json.encode(obj)


# The uploaded summary is an Arrow IPC stream of one row whose columns are RankSummary's fields
# (lists of structs for its tables): the analysis Job concatenates thousands of them and reads
# every rank's kernels, steps or functions as one column, never rank by rank in Python. JSON is
# for what a person reads (report/diagnosis.json); older summaries in JSON are still read.
_ARROW_STREAM = b"\xff\xff\xff\xff"


def _arrow_type(info: Any) -> Any:
    """The Arrow type of a field of the model (msgspec.inspect's description of it)."""
    import msgspec.inspect as mi
    import pyarrow as pa

    if isinstance(info, mi.UnionType):
        (inner,) = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return _arrow_type(inner)
    if isinstance(info, mi.StructType):
        return pa.struct([pa.field(f.encode_name, _arrow_type(f.type)) for f in info.fields])
    if isinstance(info, mi.TupleType):  # a struct of fields "0", "1", ...: its items differ in type
        return pa.struct([pa.field(str(i), _arrow_type(t)) for i, t in enumerate(info.item_types)])
    if isinstance(info, mi.ListType):
        return pa.list_(_arrow_type(info.item_type))
    if isinstance(info, mi.DictType):
        return pa.map_(_arrow_type(info.key_type), _arrow_type(info.value_type))
    simple: dict[type, Any] = {
        mi.IntType: pa.int64(),
        mi.FloatType: pa.float64(),
        mi.StrType: pa.string(),
        mi.BoolType: pa.bool_(),
    }
    return simple[type(info)]


@functools.cache
def _summary_info() -> Any:
    import msgspec.inspect as mi

    info = mi.type_info(RankSummary)
    assert isinstance(info, mi.StructType)
    return info


@functools.cache
def summary_schema() -> Any:
    """RankSummary as an Arrow schema (pyarrow.Schema), field for field."""
    import pyarrow as pa

    return pa.schema([pa.field(f.encode_name, _arrow_type(f.type)) for f in _summary_info().fields])


# The columns of a summaries table that hold most of its rows at fleet scale (a few hundred kernels
# and Python functions a rank): their texts are dictionary-encoded once the summaries are read, as
# thousands of ranks repeat the same few hundred names and stacks (a third of the table at 10,240 ranks).
_COMPACT_COLUMNS = ("kernels", "functions")


def _dictionary_texts(kind: Any) -> Any:
    """The Arrow type `kind` with each string in it dictionary-encoded."""
    import pyarrow as pa

    if pa.types.is_string(kind):
        return pa.dictionary(pa.int32(), pa.string())
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_dictionary_texts(f.type)) for f in kind])
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_dictionary_texts(kind.value_type)))
    return kind


@functools.cache
def compact_schema() -> Any:
    """summary_schema() with the texts of its largest columns dictionary-encoded: the form the
    analysis holds a session's summaries in (values and order the same as summary_schema's)."""
    schema = summary_schema()
    for name in _COMPACT_COLUMNS:
        i = schema.get_field_index(name)
        schema = schema.set(i, schema.field(i).with_type(_dictionary_texts(schema.field(i).type)))
    return schema


def compact(table: Any) -> Any:
    """A table of summary_schema() (or already compact) in compact_schema()."""
    return table if table.schema.equals(compact_schema()) else table.cast(compact_schema())


def _has_tuple(info: Any) -> bool:
    import msgspec.inspect as mi

    if isinstance(info, mi.TupleType):
        return True
    if isinstance(info, mi.UnionType):
        return any(_has_tuple(t) for t in info.types)
    if isinstance(info, mi.StructType):
        return any(_has_tuple(f.type) for f in info.fields)
    if isinstance(info, mi.ListType):
        return _has_tuple(info.item_type)
    return isinstance(info, mi.DictType) and _has_tuple(info.value_type)


@functools.cache
def _tuple_fields() -> tuple[Any, ...]:
    """The fields of RankSummary that hold tuples somewhere (the critical path's spans)."""
    return tuple(f for f in _summary_info().fields if _has_tuple(f.type))


def _tuples(value: Any, info: Any, make: Any) -> Any:
    """`value` (builtins of the model's type `info`) with each tuple in it made by `make` from its
    items: msgspec writes and reads a tuple as a list, Arrow holds it as a struct of "0", "1", ..."""
    import msgspec.inspect as mi

    if value is None or not _has_tuple(info):
        return value
    if isinstance(info, mi.UnionType):
        return _tuples(value, next(t for t in info.types if not isinstance(t, mi.NoneType)), make)
    if isinstance(info, mi.TupleType):
        return make(value.values() if isinstance(value, dict) else value)
    if isinstance(info, mi.ListType):
        return [_tuples(v, info.item_type, make) for v in value]
    if isinstance(info, mi.DictType):
        return {k: _tuples(v, info.value_type, make) for k, v in value.items()}
    return {
        **value,
        **{f.encode_name: _tuples(value[f.encode_name], f.type, make) for f in info.fields if f.encode_name in value},
    }


def _row_tuples(row: dict, make: Any) -> dict:
    fields = _tuple_fields()
    return (
        {**row, **{f.encode_name: _tuples(row[f.encode_name], f.type, make) for f in fields if f.encode_name in row}}
        if fields
        else row
    )


def _with_defaults(array: Any, info: Any) -> Any:
    """`array` (of the Arrow type of `info`) with the model's defaults where a value was left out:
    Structs encode without their defaults, so that a null stands only for a default of None."""
    import msgspec.inspect as mi
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(info, mi.UnionType):
        return _with_defaults(array, next(t for t in info.types if not isinstance(t, mi.NoneType)))
    if isinstance(info, mi.ListType):
        return pa.ListArray.from_arrays(
            array.offsets, _with_defaults(array.values, info.item_type), mask=array.is_null()
        )
    if not isinstance(info, mi.StructType):
        return array
    children = []
    for i, f in enumerate(info.fields):
        child = _with_defaults(array.field(i), f.type)
        if isinstance(f.type, mi.ListType | mi.DictType):
            # A null list's offsets are equal: without the mask it reads as the empty list.
            cls = pa.ListArray if isinstance(f.type, mi.ListType) else pa.MapArray
            parts = (child.values,) if cls is pa.ListArray else (child.keys, child.items)
            child = cls.from_arrays(child.offsets, *parts)
        elif f.default is not msgspec.NODEFAULT and f.default is not None:
            child = pc.fill_null(child, pa.scalar(f.default, child.type))
        children.append(child)
    return pa.StructArray.from_arrays(children, fields=list(array.type), mask=array.is_null())


def summaries_table(summaries: Sequence[RankSummary]) -> Any:
    """Summaries as one Arrow table (pyarrow.Table), a row per rank, in summary_schema(); a
    null only where the model's default is None."""
    import pyarrow as pa

    rows = [_row_tuples(r, tuple) for r in msgspec.to_builtins(list(summaries))]
    array = pa.array(rows, type=pa.struct(list(summary_schema())))
    return pa.Table.from_struct_array(_with_defaults(array, _summary_info()))


def table_summaries(table: Any) -> list[RankSummary]:
    """The rows of a summaries_table as RankSummary objects (for the few readers that want them)."""
    return msgspec.convert([_row_tuples(r, list) for r in table.to_pylist(maps_as_pydicts="strict")], list[RankSummary])


def table_critical_path(column: Any, row: int) -> CriticalPathSummary | None:
    """The critical path of one row of a summaries_table's criticalPath column (pyarrow ChunkedArray)."""
    info = next(f.type for f in _summary_info().fields if f.encode_name == "criticalPath")
    value = column[row].as_py(maps_as_pydicts="strict")
    return msgspec.convert(_tuples(value, info, list), CriticalPathSummary | None)


def encode_summary(summary: RankSummary) -> bytes:
    """The rank summary as it is uploaded: an Arrow IPC stream of one row (uncompressed, so that
    reading a hostile one allocates no more than its own size)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, summary_schema()) as writer:
        writer.write_table(summaries_table([summary]))
    return sink.getvalue().to_pybytes()


class _Flat:
    """A table of an IPC message's flatbuffer metadata (Message, RecordBatch): just enough of the
    format to check a summary's structure before Arrow reads it. Out-of-range reads raise
    struct.error (or IndexError)."""

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.size = struct.unpack_from("<H", buf, self.vtable)[0]

    def _at(self, index: int) -> int:
        at = 4 + 2 * index
        return struct.unpack_from("<H", self.buf, self.vtable + at)[0] if at + 2 <= self.size else 0

    def scalar(self, index: int, fmt: str) -> int:
        at = self._at(index)
        return struct.unpack_from(fmt, self.buf, self.pos + at)[0] if at else 0

    def table(self, index: int) -> _Flat | None:
        at = self._at(index)
        return _Flat(self.buf, self.pos + at + struct.unpack_from("<I", self.buf, self.pos + at)[0]) if at else None


_RECORD_BATCH = 3  # MessageHeader.RecordBatch
_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def _compressed(metadata: bytes) -> bool:
    """Whether an IPC message's flatbuffer (Message -> RecordBatch) declares body compression: a
    compressed buffer states its own decompressed length, which a hostile file sets at will."""
    view = memoryview(metadata)
    batch = _Flat(view, struct.unpack_from("<I", view, 0)[0]).table(2)  # Message.header
    return batch is not None and batch.table(3) is not None  # RecordBatch.compression


@functools.cache
def _schema_message() -> bytes:
    return bytes(summary_schema().serialize())


def _one_row(data: bytes, head: int) -> bool:
    """Whether `data` is this version's schema message (`head` bytes) followed by exactly one
    uncompressed record batch of one row and the end of the stream, as encode_summary writes it."""
    view = memoryview(data)
    try:
        if view[head : head + 4] != _ARROW_STREAM or view[-8:] != _END:
            return False
        length = struct.unpack_from("<i", view, head + 4)[0]
        meta = view[head + 8 : head + 8 + length]
        message = _Flat(meta, struct.unpack_from("<I", meta, 0)[0])
        batch = message.table(2)
        return (
            message.scalar(1, "<B") == _RECORD_BATCH
            and batch is not None
            and batch.scalar(0, "<q") == 1
            and batch.table(3) is None
            and head + 8 + length + message.scalar(3, "<q") == len(data) - 8
        )
    except (struct.error, IndexError):
        return False


def decode_summaries(blobs: Sequence[bytes]) -> tuple[Any, list[int], dict[int, str]]:
    """Many uploaded summaries at once: the table of those that could be read (summary_schema(),
    pyarrow.Table), which blob each of its rows came from, and why each other blob could not be.

    Summaries written as encode_summary writes them are read together, their messages in one
    stream (Arrow reads and checks thousands of rows in one call); any other (JSON, another
    version's schema, a damaged or hostile file) goes through summary_batch alone."""
    import pyarrow as pa
    import pyarrow.compute as pc

    head = _schema_message()
    together = [i for i, b in enumerate(blobs) if b.startswith(head) and _one_row(b, len(head))]
    alone = sorted(set(range(len(blobs))) - set(together))
    tables, rows, errors = [], [], {}
    if together:
        stream = b"".join([head, *(memoryview(blobs[i])[len(head) : -8] for i in together), _END])
        try:
            table = pa.ipc.open_stream(stream).read_all()
            table.validate(full=True)  # offsets out of bounds would be read later, past the buffer
        except (pa.ArrowException, OSError):
            alone, together = sorted(alone + together), []  # each alone tells which
        else:
            newer = pc.greater(table.column("version"), SUMMARY_VERSION)
            if pc.any(newer).as_py():
                alone, together = sorted(alone + together), []
            else:
                tables.append(table)
                rows += together
    for i in alone:
        try:
            tables.append(pa.Table.from_batches([summary_batch(blobs[i])]))
            rows.append(i)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError) as exc:
            errors[i] = str(exc)
    return (pa.concat_tables(tables) if tables else summary_schema().empty_table()), rows, errors


def summary_batch(data: bytes) -> Any:
    """One uploaded summary (Arrow IPC, or JSON from an older sidecar) as a one-row pyarrow
    RecordBatch in summary_schema(); ValueError for anything else, a newer version included."""
    import pyarrow as pa

    if not data.startswith(_ARROW_STREAM):
        return summaries_table([decode_summary(data)]).to_batches()[0]
    schema = summary_schema()
    try:
        messages = iter(pa.ipc.MessageReader.open_stream(pa.py_buffer(data)))
        message = next(messages, None)
        if message is None or message.type != "schema":
            raise ValueError("no schema first")
        got = pa.ipc.read_schema(message)
        batches = []
        for message in messages:
            if message.type != "record batch" or _compressed(message.metadata.to_pybytes()):
                raise ValueError(
                    f"unexpected {message.type} message (compressed or dictionary batches are not written)"
                )
            batches.append(pa.ipc.read_record_batch(message, got))
    except (pa.ArrowException, OSError, IndexError, struct.error) as exc:
        raise ValueError(f"not an Arrow summary: {exc}") from exc
    if sum(b.num_rows for b in batches) != 1:
        raise ValueError(f"an Arrow summary holds one row, not {sum(b.num_rows for b in batches)}")
    batch = next(b for b in batches if b.num_rows)
    try:
        batch.validate(full=True)  # offsets out of bounds would be read later, past the buffer
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"not an Arrow summary: {exc}") from exc
    if not got.equals(schema):
        batch = _conform(batch, schema)
    _check_version(batch.column(0)[0].as_py() if batch.schema.names[0] == "version" else None)
    return batch


def _conform(batch: Any, schema: Any) -> Any:
    """A summary of another version's schema in this one's: fields it lacks at their defaults,
    fields this version does not know dropped; a field of another type is refused."""
    import pyarrow as pa

    defaults = {
        f.encode_name: f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
        for f in msgspec.structs.fields(RankSummary)
        if f.default is not msgspec.NODEFAULT or f.default_factory is not msgspec.NODEFAULT
    }
    columns = []
    for f in schema:
        if f.name in batch.schema.names:
            column = batch.column(f.name)
            if not column.type.equals(f.type):
                raise ValueError(f"field {f.name} is {column.type}, expected {f.type}")
            columns.append(column)
        elif f.name in ("version", "rank"):
            raise ValueError(f"field {f.name} is missing")
        else:
            columns.append(pa.array([defaults.get(f.name)], type=f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _check_version(version: int | None) -> None:
    if version is None or version > SUMMARY_VERSION:
        raise ValueError(
            f"summary version {version} is newer than this stepscope understands ({SUMMARY_VERSION}); upgrade the "
            "analysis image"
        )


def decode_summary(data: bytes) -> RankSummary:
    """Read a summary written by this or an older version, as Arrow or JSON; a newer version is
    refused clearly."""
    if data.startswith(_ARROW_STREAM):
        return table_summaries(summary_batch(data))[0]
    summary = msgspec.json.decode(data, type=RankSummary)
    _check_version(summary.version)
    return summary
