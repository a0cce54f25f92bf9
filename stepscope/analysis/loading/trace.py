"""Load a Kineto (PyTorch profiler) JSON trace into columns.

The file is streamed (plain or gzip, decompressed with isal's igzip) and cut into pieces of about
`CHUNK_BYTES` at event boundaries; msgspec decodes each piece into typed structs holding only the
fields the analysis reads (events of other phases than "X" only as far as their duration), which are
turned into numpy columns at once and dropped. Memory stays
bounded by the columns plus one piece, whatever the size of the file.

The rows kept are the ones Holistic Trace Analysis (HTA 0.5.0) keeps: events with a duration and a
category, except the `Trace` span. Times are microseconds: the trace format's `ts` is always in
µs (`displayTimeUnit` only tells viewers how to show it). Like HTA, a trace with fractional
(nanosecond-resolution) timestamps is rounded inwards to whole microseconds (start up, end down),
so every interval metric can be checked against HTA number by number.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from operator import attrgetter, is_not
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol, Union, overload

import msgspec
import numpy as np
from isal import igzip

from stepscope.analysis.settings import (
    DEFAULT_MAX_TRACE_EVENTS,
    DEFAULT_MAX_TRACE_MB,
    MAX_TRACE_EVENTS_ENV,
    MAX_TRACE_MB_ENV,
    trace_caps,
)
from stepscope.contracts.wire import MAX_SCHEDSTAT_STEPS

CHUNK_BYTES = 16 << 20
# A metadata header larger than this before "traceEvents" is not a Kineto trace, and neither is
# an event list with no event boundary in this many bytes.
MAX_HEADER_BYTES = 64 << 20
MAX_WINDOW_BYTES = 64 << 20
# Category names of PyTorch 1.8's Kineto next to today's.
KERNEL_CATS = ("kernel", "Kernel")
MEMCPY_CATS = ("gpu_memcpy", "Memcpy")
MEMSET_CATS = ("gpu_memset", "Memset")
RUNTIME_CATS = ("cuda_runtime", "Runtime", "cuda_driver")
PYTHON_CAT = "python_function"
OPERATOR_CAT = "cpu_op"
SYNC_CAT = "cuda_sync"
# An operator's input shapes beyond this many bytes of JSON are cut (a list of thousands of tensors).
MAX_SHAPES_TEXT = 256
STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
# Ops whose recorded shapes (record_shapes) are kept: the ones efficiency.py derives FLOPs and
# bytes for. Only these, so that a trace with shapes on every op costs no memory for the rest.
SHAPED_OPS = re.compile(
    r"^(aten::(mm|addmm|bmm|baddbmm|_scaled_mm|cudnn_convolution|miopen_convolution|_convolution|convolution_backward"
    r"|_scaled_dot_product_(flash|efficient|cudnn)_attention(_backward)?|_flash_attention_(forward|backward)"
    r"|_efficient_attention_(forward|backward)|add|add_|sub|sub_|mul|mul_|div|div_|relu|relu_|gelu|silu|silu_|sigmoid|tanh"
    r"|neg|exp|rsqrt|pow|where|copy_|fill_|_softmax|_log_softmax|sum|mean|native_layer_norm|_fused_rms_norm)"
    r"|flash_attn::_flash_attn_(forward|backward))$"
)
_ERROR_AT = re.compile(r"\(byte (\d+)\)")
_UUID = re.compile(r"[A-Za-z0-9-]{1,64}")
# No op of a training step lasts a day, and a trace spans seconds to minutes: a row over this long,
# or starting this far from the trace's median start, is a corrupt number.
MAX_EVENT_US = 86_400e6

# Distinct names and string process ids are held as Python strings (about 100 bytes each besides
# their text): a trace of unique names would hold more than its columns. The largest real trace
# has 69 KB of distinct names.
MAX_STRING_BYTES = 128 << 20
_STRING_OVERHEAD = 100


class TraceError(Exception):
    """The trace cannot be read; the message names the file and says why."""


@dataclass(frozen=True)
class Limits:
    """How much of one rank's trace is read: uncompressed bytes, rows kept (events with a duration)."""

    max_bytes: int = DEFAULT_MAX_TRACE_MB << 20
    max_events: int = DEFAULT_MAX_TRACE_EVENTS


class TraceCut(ValueError):
    """The trace goes on past a cap of `Limits`: what was read before it is whole events."""

    def __init__(self, reason: str, meta: TraceMeta | None = None) -> None:
        super().__init__(reason)
        self.meta = meta


# A JSON file without trace events (hparams.json, a config beside the traces): no trace at all.
NOT_A_TRACE = 'no "traceEvents" array: not a Kineto/Chrome trace'


# Numbers as written by any profiler version: some write them as strings, some as null.
_Num = int | float | str | None
_NO_RAW = msgspec.Raw()


class _Args(msgspec.Struct, gc=False, frozen=True):
    stream: _Num = -1
    correlation: _Num = -1
    external_id: _Num = msgspec.field(default=-1, name="External id")
    external_id_old: _Num = msgspec.field(default=-1, name="external id")
    bytes: _Num = -1
    python_id: _Num = msgspec.field(default=-1, name="Python id")
    python_parent: _Num = msgspec.field(default=-1, name="Python parent id")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: _Num = msgspec.field(default=None, name="In msg nelems")
    out_nelems: _Num = msgspec.field(default=None, name="Out msg nelems")
    group_size: _Num = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    # A "Stream Wait Event" (cuda_sync) names the cudaEventRecord it waits on and that event's stream.
    wait_record: _Num = msgspec.field(default=-1, name="wait_on_cuda_event_record_corr_id")
    wait_stream: _Num = msgspec.field(default=-1, name="wait_on_stream")
    # Kept raw (a slice of the piece, copied for SHAPED_OPS only): most ops' shapes are never read.
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    cat: str | None = None
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    args: _Args = _NO_ARGS


class _Complete(_Event, tag_field="ph", tag="X"):
    """An event of phase "X", the only phase with a duration."""


# The Trace Event Format's phases other than "X" (Google's "Trace Event Format" document, "Event
# Descriptions"; S, T, p and F are its deprecated async phases): events of these are read only as
# far as their "dur", which must be absent or null, and dropped.
_OTHER_PHASES = "BEiICbneSTpFstfPNODMVvRc()"
_SKIPPED = tuple(
    msgspec.defstruct(f"_Phase{ord(p)}", [("dur", None, None)], tag_field="ph", tag=p, gc=False) for p in _OTHER_PHASES
)
_ANY_PHASE: Any = Union.__getitem__((_Complete, *_SKIPPED))


class TraceMeta(msgspec.Struct):
    """The top-level keys the analysis reads; Kineto writes some before traceEvents, some after."""

    distributedInfo: Any = None
    baseTimeNanoseconds: int | None = None
    deviceProperties: Any = None
    stepscopeSchedstat: Any = None  # wire.SCHEDSTAT_KEY: the agent's scheduler times per step
    stepscopeThrottled: Any = None  # wire.THROTTLED_KEY: the time its CPU limit throttled it
    stepscopeStopped: Any = None  # wire.STOPPED_KEY: the agent's stop watch, how late it woke
    stepscopeGpu: Any = None  # wire.GPU_KEY: the GPU the rank computes on, from the agent


class _Tail(TraceMeta):
    traceEvents: list[_Event] = []


class _SkippingTail(TraceMeta):
    traceEvents: list[_ANY_PHASE] = []


class Decoders(NamedTuple):
    """How decode_pieces turns the event list into what its sink takes: `events` decodes a piece
    "[...]" cut at an event boundary, `last` a bare array's last piece, `tail` the text after the
    last cut with "{\"traceEvents\":" put in front (an object with traceEvents and TraceMeta's keys).
    `collectives`: look in each piece for collective arguments, for a sink that reads them."""

    events: Any
    last: Any
    tail: Any
    collectives: bool = True


class Sink(Protocol):
    def add(self, events: Any, collectives: bool = True) -> None: ...


_EVENTS = msgspec.json.Decoder(list[_Event])
_SKIPPING_EVENTS = msgspec.json.Decoder(list[_ANY_PHASE])
_META = msgspec.json.Decoder(TraceMeta)
_TAIL = msgspec.json.Decoder(_Tail)
_SKIPPING_TAIL = msgspec.json.Decoder(_SkippingTail)


class _Skipping:
    """Decodes with `fast`, which reads events of other phases than "X" only as far as it takes to
    drop them (flows and instants are over 40% of Kineto's events: a quarter less decode time), and
    with `full` from the first piece `fast` refuses on: an unknown or missing "ph", a duration
    on another phase. Either way the rows kept are the same."""

    def __init__(self, fast: msgspec.json.Decoder, full: msgspec.json.Decoder) -> None:
        self.fast: msgspec.json.Decoder | None = fast
        self.full = full

    def decode(self, piece: memoryview | bytes) -> Any:
        if self.fast is not None:
            try:
                return self.fast.decode(piece)
            except msgspec.ValidationError:
                self.fast = None  # not the text it expects: this trace is read in full from here
        return self.full.decode(piece)


def _typed() -> Decoders:
    """The loader's decoders, for one trace."""
    events = _Skipping(_SKIPPING_EVENTS, _EVENTS)
    return Decoders(events, events, _Skipping(_SKIPPING_TAIL, _TAIL))


@dataclass
class Collectives:
    """Collective arguments (message sizes, group) of the few events that carry them ("In msg nelems")."""

    row: np.ndarray  # row of the event in the Trace columns
    name: list[str]
    in_nelems: np.ndarray
    out_nelems: np.ndarray
    group_size: np.ndarray
    dtype: list[str]


@dataclass
class Shapes:
    """The recorded inputs of SHAPED_OPS events: JSON text of their "Input Dims", "Input type" and
    "Concrete Inputs" (b"" where absent)."""

    row: np.ndarray
    dims: list[bytes]
    types: list[bytes]
    concrete: list[bytes]


@dataclass
class Trace:
    path: str
    rank: int | None
    world_size: int
    backend: str
    cats: list[str]  # category code -> string
    names: list[str]  # name code -> string
    cat: np.ndarray  # int32 codes
    name: np.ndarray  # int32 codes
    pid: np.ndarray  # int64; string ids get negative codes
    ts: np.ndarray  # float64 microseconds
    dur: np.ndarray
    stream: np.ndarray  # int64, -1 for events not on a GPU stream (HTA's convention)
    correlation: np.ndarray  # int64, -1 when absent
    external_id: np.ndarray
    nbytes: np.ndarray  # int64, -1 when absent
    python_id: np.ndarray
    python_parent: np.ndarray
    collectives: Collectives
    tid: np.ndarray  # int64 thread ids; string ids get negative codes
    shape: np.ndarray  # int32 code of an operator's input shapes (shape_texts), -1 where not recorded
    shape_texts: list[str]
    rounded: bool  # fractional timestamps were rounded inwards as HTA does
    first_event_ts: float  # ts of traceEvents[0] when it is a kept row, else NaN (HTA links to it)
    warnings: list[str] = field(default_factory=list)
    base_ns: int = 0  # baseTimeNanoseconds: ts (µs) + base_ns / 1000 = Unix epoch µs
    shapes: Shapes = field(default_factory=lambda: Shapes(np.empty(0, np.int64), [], [], []))
    devices: list[tuple[str, int, int]] = field(
        default_factory=list
    )  # deviceProperties: (name, numSms, totalGlobalMem)
    # Of cuda_sync rows (-1 elsewhere): the correlation of the cudaEventRecord a stream waits on, and its stream.
    wait_record: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    wait_stream: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # The training thread's scheduler counters as each captured step began: rows of (step, CPU ns,
    # run-queue ns), from the agent (wire.SCHEDSTAT_KEY); none in other traces.
    schedstat: np.ndarray = field(default_factory=lambda: np.empty((0, 3), np.int64))
    # Rows of (step, ns its cgroup's CPU limit held it throttled so far), at the same boundaries
    # (wire.THROTTLED_KEY); none where the agent found no cgroup CPU controller.
    throttled: np.ndarray = field(default_factory=lambda: np.empty((0, 2), np.int64))
    # Rows of (step, ns the agent's stop watch woke late so far, ns of that in the run queue), at
    # the same boundaries (wire.STOPPED_KEY); none where the agent had no stop watch.
    stopped: np.ndarray = field(default_factory=lambda: np.empty((0, 3), np.int64))
    # The UUID of the GPU the rank computes on, from the agent (wire.GPU_KEY); "" in other traces.
    gpu_uuid: str = ""

    def __len__(self) -> int:
        return len(self.ts)

    def cat_mask(self, names: tuple[str, ...] | str) -> np.ndarray:
        wanted = (names,) if isinstance(names, str) else names
        return np.array([c in wanted for c in self.cats], dtype=bool)[self.cat]

    def name_mask(self, predicate: Callable[[str], bool], rows: np.ndarray | None = None) -> np.ndarray:
        """Rows (all, or those given) whose name satisfies `predicate`: a table lookup per row."""
        table = np.fromiter(map(predicate, self.names), dtype=bool, count=len(self.names))
        return table[self.name if rows is None else self.name[rows]]

    def device_rows(self) -> np.ndarray:
        """Rows of work on a GPU: kernels, copies and sets. (HTA's own test, stream != -1, also takes
        ROCm runtime calls, which carry a stream argument; only its metrics use that.)"""
        return np.flatnonzero(self.cat_mask(KERNEL_CATS + MEMCPY_CATS + MEMSET_CATS) & (self.stream != -1))

    @property
    def end(self) -> np.ndarray:
        """Ends, never before the starts (inward rounding leaves sub-µs events with end < start)."""
        return np.maximum(self.ts + self.dur, self.ts)


class _Columns:
    """Accumulates the columns of one trace piece by piece."""

    def __init__(self, max_events: int = DEFAULT_MAX_TRACE_EVENTS) -> None:
        self.max_events = max_events
        self.cat_codes: dict[str, int] = {}
        self.name_codes: dict[str, int] = {}
        self.id_codes: dict[str, int] = {}
        self.parts: dict[str, list[np.ndarray]] = {
            k: []
            for k in (
                "cat",
                "name",
                "pid",
                "ts",
                "dur",
                "stream",
                "correlation",
                "external_id",
                "nbytes",
                "python_id",
                "python_parent",
                "tid",
                "shape",
                "wait_record",
                "wait_stream",
            )
        }
        self.shape_codes: dict[str, int] = {}
        self.coll: dict[str, list] = {k: [] for k in ("row", "name", "in_nelems", "out_nelems", "group_size", "dtype")}
        self.shapes: dict[str, list] = {k: [] for k in ("row", "dims", "types", "concrete")}
        self.shaped_names: list[bool] = []  # name code -> in SHAPED_OPS
        self.rows = 0
        self.string_bytes = 0
        self.first_event_ts = float("nan")
        self.seen_events = 0
        self.old_external_ids = False

    def add(self, events: list[_Event], collectives: bool = True) -> None:
        """Append the kept rows of decoded events; `collectives` False when the piece has no collective args.

        C-level iteration (map/attrgetter/compress) keeps the cost to a few tens of ns per event and
        column; arguments only some rows carry are read for those rows only. Raises TraceCut once
        `max_events` rows are kept, having kept the first of them.
        """
        kept = list(compress(events, map(is_not, map(_get("dur"), events), repeat(None))))
        cut = len(kept) > self.max_events - self.rows
        if cut:
            kept = kept[: max(self.max_events - self.rows, 0)]
        if self.seen_events == 0 and events:
            first = events[0]
            if first.dur is not None and first.cat not in (None, "Trace") and first.ts is not None:
                self.first_event_ts = first.ts
            self.old_external_ids = any(e.args.external_id_old != -1 for e in kept[:1000])
        self.seen_events += len(events)
        self._add_kept(kept, collectives)
        if cut:
            raise TraceCut(f"cut after {self.max_events:,} events with a duration ({MAX_TRACE_EVENTS_ENV})")

    def _add_kept(self, kept: list[_Event], collectives: bool) -> None:
        if not kept:
            return
        cat = _codes(self.cat_codes, map(_get("cat"), kept), len(kept))
        ts = _floats(kept, "ts")
        # An event without a category interns None too: dropped here, with the Trace-category events.
        drop = np.isnan(ts) | np.isin(cat, [self.cat_codes.get(c, -1) for c in (None, "Trace")])  # type: ignore[arg-type]  # None: see above
        if drop.any():
            kept = list(compress(kept, ~drop))
            cat, ts = cat[~drop], ts[~drop]
            if not kept:
                return
        n = len(kept)
        p = self.parts
        p["cat"].append(cat)
        p["ts"].append(ts)
        before = [(table, len(table)) for table in (self.name_codes, self.id_codes, self.shape_codes)]
        names = _codes(self.name_codes, map(_get("name"), kept), n)
        p["name"].append(names)
        p["dur"].append(_floats(kept, "dur"))
        stream = _ints(kept, "args.stream")
        p["stream"].append(stream)
        p["correlation"].append(_ints(kept, "args.correlation"))
        has_coll = np.zeros(n, dtype=bool)
        if collectives:
            has_coll = np.fromiter(map(is_not, map(_get("args.in_nelems"), kept), repeat(None)), bool, n)
        on_stream = stream != -1
        memory = np.isin(cat, [self.cat_codes[c] for c in MEMCPY_CATS + MEMSET_CATS if c in self.cat_codes])
        python = cat == self.cat_codes.get(PYTHON_CAT, -1)
        sync = cat == self.cat_codes.get(SYNC_CAT, -1)
        shaped = self._shaped(names) & ~on_stream
        if shaped.any():  # the ops of interest that carry shapes (record_shapes)
            maybe = np.flatnonzero(shaped)
            shaped[maybe] = (
                np.fromiter(map(len, map(_get("args.input_dims"), compress(kept, shaped))), np.int64, len(maybe)) > 0
            )
        p["tid"].append(self._ids(kept, "tid"))
        operator = cat == self.cat_codes.get(OPERATOR_CAT, -1)
        shape = np.full(n, -1, dtype=np.int32)
        if operator.any():
            dims = [bytes(d)[:MAX_SHAPES_TEXT] for d in map(_get("args.input_dims"), compress(kept, operator))]
            shape[operator] = _codes(
                self.shape_codes, (d.decode("utf-8", "replace") for d in dims), int(operator.sum())
            )
        p["shape"].append(shape)
        for key, attr, rows in (
            ("pid", "pid", on_stream),
            ("nbytes", "args.bytes", memory),
            ("python_id", "args.python_id", python),
            ("python_parent", "args.python_parent", python),
            ("wait_record", "args.wait_record", sync),
            ("wait_stream", "args.wait_stream", sync),
            # External ids link collective kernels to the op holding their sizes.
            ("external_id", "args.external_id", has_coll | on_stream | shaped),
        ):
            column = np.full(n, -1, dtype=np.int64)
            if rows.any():
                some = list(compress(kept, rows))
                column[rows] = self._ids(some) if key == "pid" else _ints(some, attr)
                if key == "external_id" and self.old_external_ids:
                    column[rows] = np.where(column[rows] >= 0, column[rows], _ints(some, "args.external_id_old"))
            p[key].append(column)
        if has_coll.any():
            some = list(compress(kept, has_coll))
            c = self.coll
            c["row"].append(self.rows + np.flatnonzero(has_coll))
            c["name"] += _strings(some, "args.collective")
            c["dtype"] += _strings(some, "args.dtype")
            for key in ("in_nelems", "out_nelems", "group_size"):
                c[key].append(_ints(some, f"args.{key}"))
        if shaped.any():
            some = list(compress(kept, shaped))
            self.shapes["row"].append(self.rows + np.flatnonzero(shaped))
            for key, attr in (("dims", "args.input_dims"), ("types", "args.input_type"), ("concrete", "args.concrete")):
                texts = list(map(bytes, map(_get(attr), some)))
                self.shapes[key] += texts
                self.string_bytes += sum(map(len, texts))
        self.rows += n
        for table, count in before:
            self._count_strings(table, count)

    def _count_strings(self, table: dict[str, int], before: int) -> None:
        """Count the strings added to `table` since it held `before` (they are at its end); raise
        TraceCut past MAX_STRING_BYTES."""
        new = len(table) - before
        if not new:
            return
        self.string_bytes += sum(map(len, islice(reversed(table), new))) + _STRING_OVERHEAD * new
        if self.string_bytes > MAX_STRING_BYTES:
            raise TraceCut(f"cut after {MAX_STRING_BYTES >> 20} MiB of distinct event names and recorded input shapes")

    def _shaped(self, names: np.ndarray) -> np.ndarray:
        """Rows whose op is one of SHAPED_OPS, by a table over the name codes seen so far."""
        table = self.shaped_names
        if len(table) < len(self.name_codes):
            table += [SHAPED_OPS.match(n) is not None for n in list(self.name_codes)[len(table) :]]
        return np.asarray(table, dtype=bool)[names]

    def _ids(self, events: list[_Event], attr: str = "pid") -> np.ndarray:
        """Process or thread ids; the few string ids (and integers beyond int64) get negative codes."""
        items = list(map(_get(attr), events))
        try:
            return np.array(items, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            codes = self.id_codes
            return np.array(
                [
                    v if isinstance(v, int) and _int64(v) == v else -1 - codes.setdefault(str(v), len(codes))
                    for v in items
                ],
                dtype=np.int64,
            )

    def column(self, key: str, dtype) -> np.ndarray:
        return _joined(self.parts[key], dtype)


@overload
def _int(value: Any, default: int = -1) -> int: ...
@overload
def _int(value: Any, default: None) -> int | None: ...
def _int(value: Any, default: int | None = -1) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def _get(attr: str) -> attrgetter:
    return attrgetter(attr)


def _codes(table: dict, values: Iterable, n: int) -> np.ndarray:
    """Intern strings: code = position of first appearance in `table`."""
    lookup = defaultdict(None, table)
    lookup.default_factory = lookup.__len__
    codes = np.fromiter(map(lookup.__getitem__, values), np.int32, n)
    table.update(lookup)
    return codes


def _floats(events: list[_Event], attr: str) -> np.ndarray:
    try:
        return np.fromiter(map(_get(attr), events), np.float64, len(events))
    except TypeError:
        return np.array(list(map(_get(attr), events)), dtype=np.float64)  # null -> NaN


def _int64(value: Any) -> int:
    """int(value), -1 when int() refuses it or it does not fit an int64 (a corrupt id or size)."""
    n = _int(value)
    return n if n is not None and -(1 << 63) <= n < (1 << 63) else -1


def _ints(events: list[_Event], attr: str) -> np.ndarray:
    """Integers as int64, -1 for null or anything int() refuses (HTA's stream normalisation)."""
    try:
        return np.fromiter(map(_get(attr), events), np.int64, len(events))
    except (TypeError, ValueError, OverflowError):
        return np.fromiter(map(_int64, map(_get(attr), events)), np.int64, len(events))


def _strings(events: list[_Event], attr: str) -> list[str]:
    """Optional string arguments, "" where absent."""
    values = np.array(list(map(_get(attr), events)), dtype=object)
    values[np.equal(values, None)] = ""  # type: ignore[call-overload]  # numpy's stubs have no object-array overload
    return values.tolist()


def open_trace(path: Path) -> BinaryIO:
    """The trace's bytes as a stream, gunzipped when the file is gzip (whatever its name)."""
    f = open(path, "rb")
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return igzip.IGzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]  # a binary file object, typed as its own class
    return f


class _Window:
    """A byte window over the stream, refilled in place so that pieces cost no new allocations."""

    def __init__(self, stream: BinaryIO, max_bytes: int) -> None:
        self.stream: Any = stream  # BinaryIO has no readinto in typeshed; gzip/isal/open files have
        self.buf = bytearray(min(CHUNK_BYTES, max_bytes + 1))
        self.filled = 0
        self.eof = False
        self.capped = False  # the stream goes on past max_bytes
        self.max_bytes = max_bytes
        self.dropped = 0  # bytes of the stream before buf[0], to name positions in error messages

    def fill(self) -> None:
        """Read until the window is full, the stream ends or max_bytes of it are read."""
        end = min(len(self.buf), self.max_bytes - self.dropped)
        with memoryview(self.buf) as view:
            while self.filled < end:
                n = self.stream.readinto(view[self.filled : end])
                if not n:
                    self.eof = True
                    return
                self.filled += n
        if end < len(self.buf) and not self.eof:
            self.eof = not self.stream.read(1)
            self.capped = not self.eof

    def grow(self) -> None:
        self.buf += bytearray(len(self.buf))

    def keep_from(self, start: int, prefix: bytes = b"") -> None:
        """Drop the bytes before `start` (after writing `prefix` in front of the rest)."""
        rest = self.filled - start
        self.buf[len(prefix) : len(prefix) + rest] = self.buf[start : self.filled]
        self.buf[: len(prefix)] = prefix
        self.filled = len(prefix) + rest
        self.dropped += start - len(prefix)

    def data(self) -> bytes:
        return bytes(self.buf[: self.filled])


def decode_pieces(
    stream: BinaryIO, cols: Sink, decoders: Decoders | None = None, max_bytes: int | None = None
) -> TraceMeta:
    """Split the stream at event boundaries, decode each piece into `cols` (with the loader's
    decoders unless given others), return the trace metadata. Past `max_bytes` of the stream
    (by default the environment's cap, stepscope.analysis.settings) the whole events before are decoded and
    TraceCut is raised with the metadata known so far; so is a TraceCut of the sink."""
    decoders = decoders or _typed()
    win = _Window(stream, trace_caps()[0] if max_bytes is None else max_bytes)
    win.fill()
    key = win.buf.find(b'"traceEvents"', 0, win.filled)
    while (
        key < 0
        and not win.eof
        and not win.capped
        and win.filled < MAX_HEADER_BYTES
        and win.buf[:1024].lstrip()[:1] != b"["
    ):
        win.grow()
        win.fill()
        key = win.buf.find(b'"traceEvents"', 0, win.filled)
    first = win.buf[: min(win.filled, 1024)].lstrip()[:1]
    if not first:
        raise ValueError("the file is empty")
    bare = first == b"["  # a bare JSON array of events, which the Chrome trace format allows
    meta = TraceMeta()
    if bare:
        start = win.buf.find(b"[")
    else:
        if key < 0:
            raise ValueError(NOT_A_TRACE)
        header = bytes(win.buf[:key]).rstrip()
        if header.endswith(b","):
            meta = _META.decode(header[:-1] + b"}")
        start = win.buf.find(b"[", key, win.filled)
        if start < 0:
            raise ValueError('no event list after "traceEvents"')
    win.keep_from(start)
    try:
        return _decode_events(win, cols, decoders, bare, meta)
    except TraceCut as cut:
        raise TraceCut(str(cut), meta) from None


def _decode_events(win: _Window, cols: Sink, decoders: Decoders, bare: bool, meta: TraceMeta) -> TraceMeta:
    while True:
        win.fill()
        if win.capped:
            _decode_front(win, cols, decoders)
            raise TraceCut(f"cut after {win.max_bytes >> 20:,} MiB of JSON ({MAX_TRACE_MB_ENV})")
        if win.eof:
            break
        if not _decode_front(win, cols, decoders):
            if len(win.buf) >= MAX_WINDOW_BYTES:
                raise ValueError(
                    f"no event boundary within {MAX_WINDOW_BYTES >> 20} MiB after byte {win.dropped}:"
                    " not a Kineto event list"
                )
            win.grow()  # one event larger than the window
    if bare:
        cols.add(decoders.last.decode(win.data()))
        return meta
    rest = decoders.tail.decode(b'{"traceEvents":' + win.data())
    cols.add(rest.traceEvents, collectives=decoders.collectives and _has_collective_args(win.buf, win.filled))
    for name in TraceMeta.__struct_fields__:
        if getattr(meta, name) is None:
            setattr(meta, name, getattr(rest, name))
    return meta


def _has_collective_args(buf: bytearray, end: int) -> bool:
    """PyTorch records message sizes ("In msg nelems") with every collective's arguments."""
    return buf.find(b'In msg nelems"', 0, end) >= 0


def _decode_front(win: _Window, cols: Sink, decoders: Decoders) -> bool:
    """Decode the complete events at the front of the window (which starts with '['), keep the rest.

    A candidate cut is a `},`; one inside a string or a nested object leaves the piece unbalanced,
    so msgspec refuses it at its very end and the previous candidate is tried. An error before the
    end is a real fault in the file: reported at once, so a corrupt multi-GB trace costs neither
    time nor an ever-growing window.
    """
    buf = win.buf
    cut = buf.rfind(b"},", 0, win.filled)
    for _ in range(64):
        if cut <= 0:
            return False
        comma = cut + 1
        buf[comma] = ord("]")
        try:
            with memoryview(buf) as view:
                events = decoders.events.decode(view[: comma + 1])
        except msgspec.ValidationError:  # a real type error (ValidationError is a DecodeError too)
            raise
        except msgspec.DecodeError as e:
            buf[comma] = ord(",")
            at = _ERROR_AT.search(str(e))
            if at and int(at.group(1)) < comma:
                raise msgspec.DecodeError(
                    f"{_ERROR_AT.sub('', str(e)).strip()} at byte {win.dropped + int(at.group(1))} of the JSON"
                ) from None
            cut = buf.rfind(b"},", 0, cut)
            continue
        cols.add(events, collectives=decoders.collectives and _has_collective_args(buf, comma))
        win.keep_from(comma + 1, b"[")
        return True
    return False


def load_trace(path: str | Path, limits: Limits | None = None) -> Trace:
    """Read a Kineto trace (.json or .json.gz), within `limits` (by default the environment's,
    stepscope.analysis.settings). Raises TraceError naming the file when it cannot."""
    path = Path(path)
    limits = limits or Limits(*trace_caps())
    cols = _Columns(limits.max_events)
    cut = ""
    try:
        with open_trace(path) as stream:
            meta = decode_pieces(stream, cols, max_bytes=limits.max_bytes)
    except TraceCut as e:
        meta, cut = e.meta or TraceMeta(), f"the trace was {e}: only its beginning is analysed"
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply (a Kineto trace nests a few levels)") from None
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except msgspec.ValidationError as e:
        raise TraceError(f"{path}: unexpected value in the trace: {e}") from None
    except msgspec.DecodeError as e:
        raise TraceError(f"{path}: invalid or truncated JSON ({e})") from None
    except (EOFError, OSError, igzip.BadGzipFile) as e:
        raise TraceError(f"{path}: unreadable or truncated file ({e})") from None
    except ValueError as e:
        raise TraceError(f"{path}: {e}") from None
    if cols.rows == 0:
        raise TraceError(
            f"{path}: the trace has no events with a duration ({cols.seen_events} events in all)"
            + (f"; {cut}" if cut else "")
        )
    trace = _build(path, meta, cols)
    if not len(trace):
        raise TraceError(f"{path}: the trace has no events with a duration left: {trace.warnings[-1]}")
    if cut:
        trace.warnings.append(cut)
    return trace


def impossible_times(ts: np.ndarray, dur: np.ndarray) -> dict[str, np.ndarray]:
    """Masks of the rows whose times no profiler writes, by reason (a row may have several). JSON
    holds no NaN or infinity, and rows without a start are dropped as they are read."""
    middle = float(np.median(ts))
    return {
        "negative duration": dur < 0,
        "longer than a day": dur > MAX_EVENT_US,
        "starting over a day away from the trace's other events": np.abs(ts - middle) > MAX_EVENT_US,
    }


def _sane_rows(
    columns: dict[str, np.ndarray], coll: Collectives, shapes: Shapes
) -> tuple[dict[str, np.ndarray], Collectives, Shapes, str]:
    """The columns without rows of impossible times, and a warning counting them ("" if none)."""
    ts, dur = columns["ts"], columns["dur"]
    # The usual case in four reductions.
    if len(ts) and dur.min() >= 0 and dur.max() <= MAX_EVENT_US and ts.max() - ts.min() <= MAX_EVENT_US:
        return columns, coll, shapes, ""
    reasons = impossible_times(ts, dur)
    bad = np.logical_or.reduce(list(reasons.values()))
    if not bad.any():
        return columns, coll, shapes, ""
    keep = ~bad
    counts = ", ".join(f"{int(mask.sum()):,} {why}" for why, mask in reasons.items() if mask.any())
    warning = f"dropped {int(bad.sum()):,} of {len(bad):,} events with impossible times ({counts})"
    renumber = np.cumsum(keep) - 1
    held = keep[coll.row]
    coll = Collectives(
        row=renumber[coll.row[held]],
        name=list(compress(coll.name, held)),
        in_nelems=coll.in_nelems[held],
        out_nelems=coll.out_nelems[held],
        group_size=coll.group_size[held],
        dtype=list(compress(coll.dtype, held)),
    )
    held = keep[shapes.row]
    shapes = Shapes(
        row=renumber[shapes.row[held]],
        dims=list(compress(shapes.dims, held)),
        types=list(compress(shapes.types, held)),
        concrete=list(compress(shapes.concrete, held)),
    )
    return {k: v[keep] for k, v in columns.items()}, coll, shapes, warning


def _build(path: Path, meta: TraceMeta, cols: _Columns) -> Trace:
    c = cols.coll
    columns, coll, shapes, dropped = _sane_rows(
        {
            key: cols.column(
                key, np.float64 if key in ("ts", "dur") else np.int32 if key in ("cat", "name", "shape") else np.int64
            )
            for key in cols.parts
        },
        Collectives(
            row=_joined(c["row"]),
            name=c["name"],
            in_nelems=_joined(c["in_nelems"]),
            out_nelems=_joined(c["out_nelems"]),
            group_size=_joined(c["group_size"]),
            dtype=c["dtype"],
        ),
        Shapes(_joined(cols.shapes["row"]), cols.shapes["dims"], cols.shapes["types"], cols.shapes["concrete"]),
    )
    ts, dur = columns["ts"], columns["dur"]
    first_ts = cols.first_event_ts
    rounded = bool((ts != np.floor(ts)).any())
    if rounded:
        end = np.floor(ts + dur)
        ts = np.ceil(ts)
        dur = end - ts
        first_ts = float(np.ceil(first_ts))
    info = _distributed_info(meta.distributedInfo)
    warnings = [] if info else ["the trace has no distributedInfo (rank and world size unknown)"]
    return Trace(
        path=str(path),
        base_ns=int(meta.baseTimeNanoseconds or 0),
        rank=_int(info.get("rank"), None),
        world_size=_int(info.get("world_size"), 0),
        backend=str(info.get("backend") or ""),
        cats=list(cols.cat_codes),
        names=list(cols.name_codes),
        cat=columns["cat"],
        name=columns["name"],
        pid=columns["pid"],
        ts=ts,
        dur=dur,
        stream=columns["stream"],
        correlation=columns["correlation"],
        external_id=columns["external_id"],
        nbytes=columns["nbytes"],
        python_id=columns["python_id"],
        python_parent=columns["python_parent"],
        collectives=coll,
        tid=columns["tid"],
        shape=columns["shape"],
        shape_texts=list(cols.shape_codes),
        shapes=shapes,
        devices=_devices(meta.deviceProperties),
        schedstat=_step_counters(meta.stepscopeSchedstat, 3),
        throttled=_step_counters(meta.stepscopeThrottled, 2),
        stopped=_step_counters(meta.stepscopeStopped, 3),
        gpu_uuid=_gpu_uuid(meta.stepscopeGpu),
        wait_record=columns["wait_record"],
        wait_stream=columns["wait_stream"],
        rounded=rounded,
        first_event_ts=first_ts,
        warnings=warnings + [dropped] * bool(dropped),
    )


def _devices(value: Any) -> list[tuple[str, int, int]]:
    """(name, numSms, totalGlobalMem) of each entry of deviceProperties, in its order (at most
    1,024: a hostile header gets no further); an entry that is no object is no device."""
    if not isinstance(value, list):
        return []
    return [
        (str(d.get("name", ""))[:200], _int64(d.get("numSms")), _int64(d.get("totalGlobalMem")))
        for d in value[:1024]
        if isinstance(d, dict)
    ]


def _step_counters(value: Any, width: int) -> np.ndarray:
    """The agent's counters at the step boundaries (wire.SCHEDSTAT_KEY: step, CPU ns, run-queue ns;
    wire.THROTTLED_KEY: step, throttled ns; wire.STOPPED_KEY: step, late ns, run-queue ns) as rows
    in step order: at most MAX_SCHEDSTAT_STEPS entries of `width` non-negative int64s are read (a
    hostile header gets no further), and an entry of any other form is left out."""
    entries = value.get("steps") if isinstance(value, dict) else None
    if not isinstance(entries, list):
        return np.empty((0, width), np.int64)
    rows = [
        e
        for e in entries[:MAX_SCHEDSTAT_STEPS]
        if isinstance(e, list) and len(e) == width and all(type(n) is int and 0 <= n < (1 << 63) for n in e)
    ]
    table = np.array(rows, dtype=np.int64).reshape(-1, width)
    return table[np.argsort(table[:, 0], kind="stable")]


def _gpu_uuid(value: Any) -> str:
    """The agent's GPU UUID (wire.GPU_KEY), where it is one: 1 to 64 letters, digits and dashes."""
    uuid = value.get("uuid") if isinstance(value, dict) else None
    return uuid if isinstance(uuid, str) and _UUID.fullmatch(uuid) else ""


def _joined(parts: list[np.ndarray], dtype: type = np.int64) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def _distributed_info(value: Any) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        # Some writers store it as a Python repr string.
        try:
            parsed = ast.literal_eval(value)
            return parsed if isinstance(parsed, dict) else {}
        except (ValueError, SyntaxError):
            return {}
    return {}
