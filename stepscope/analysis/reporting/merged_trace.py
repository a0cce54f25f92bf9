"""merged.trace.json.gz: the raw Kineto traces of the ranks that explain the diagnosis in one file
that opens in Perfetto, plus the nodes' NVML counter tracks, within a limit on its uncompressed
size (what Perfetto's importer must hold).

Each rank is streamed by its own worker (analysis/loading/parallel.py): the trace is cut into pieces at
event boundaries (trace.decode_pieces), the pids, flow ids and timestamps are rewritten in the text
with whole-piece byte and numpy operations (no Python per event), and the piece is deflated at
once. Ranks reuse the same pids (the GPU is pid 0 on every node) and the same correlation ids, so
each rank's pids and flow ids get the rank put in front; Kineto's `ts` counts from the trace's
baseTimeNanoseconds, which differs between ranks, so each rank's `ts` move by its base minus the
merged trace's. A worker's output is a raw deflate stream ended by a sync flush, so the main process
joins the ranks it keeps, in order, into one gzip member without recompressing anything (CRCs are
combined): a single member, because Perfetto's gzip reader stops at the end of the first one.
"""

from __future__ import annotations

import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import msgspec
import numpy as np
import pandas as pd
from isal import isal_zlib

from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.loading.parallel import pool_workers
from stepscope.analysis.loading.trace import Decoders, TraceMeta, decode_pieces, open_trace
from stepscope.analysis.model import RANK_DIGITS, CriticalPathSummary, Diagnosis

# A rank's pids and flow ids get "1" and the rank in five digits put in front (pid 783658 of rank
# 3 -> 100003783658, pid 0 -> 1000030): unique across up to 100,000 ranks, integers as Perfetto
# wants, and for Kineto's `"pid": 123` a plain bytes.replace. What that leaves malformed (string,
# negative or null values, e.g. pid "Spans") is fixed up afterwards: such pids become "2" + the
# rank + their order of appearance, anything else is restored.
_ODD = rb'1\d{%d}("(?:[^"\\]|\\.)*"|-\d+|null|true|false)' % RANK_DIGITS
_ODD_PID = re.compile(rb'"pid":' + _ODD)
_ODD_ID = re.compile(rb'"id":' + _ODD)
_KEYS = (b'"pid"', b'"id"', b'"ts"')
# Other writers' spacing around the colon, made Kineto's: a literal replacement, done in C.
_SPACED = {key: re.compile(re.escape(key) + rb"\s*:\s*") for key in _KEYS}
# A flat event with at most one nested object (its args), around a "process_name".
_EVENT = re.compile(rb'\{[^{}]*"process_name"[^{}]*(?:\{[^{}]*\}[^{}]*)?\}')
_DIGITS = 20  # bytes looked at for one timestamp's integer part
_INT_DIGITS = 17  # integer parts up to this long are shifted in int64 (µs timestamps have 16)
_LEVEL = 1  # isal's fastest level: the output is mostly compressed once and opened once
_OPEN = b'{"traceEvents":['
_WHY_CHARS = 300  # of a reason in the trace's own note of what it holds


class _Meta(msgspec.Struct):
    name: str = ""
    ph: str = "M"
    pid: object = None
    tid: object = 0
    args: dict = {}


class _RawTail(TraceMeta):
    """The text after the last cut, with every top-level key decode_pieces copies over."""

    traceEvents: list[msgspec.Raw] = []


class _Checked:
    """Decodes a piece as JSON (which checks it) and gives back its events' text, comma-separated.
    The Raw slices are dropped before returning: they pin the window's buffer."""

    _raw = msgspec.json.Decoder(list[msgspec.Raw])

    def decode(self, piece: memoryview | bytes) -> bytes:
        return b",".join(self._raw.decode(piece))


class _Unchecked:
    """The events' text of a piece "[...]" as it is: for a trace this run has already parsed. A
    bytearray, which the rewrite may change in place."""

    @staticmethod
    def decode(piece: memoryview | bytes) -> bytearray:
        return bytearray(piece[1:-1])


_TAIL = msgspec.json.Decoder(_RawTail)
CHECKED = Decoders(_Checked(), _Checked(), _TAIL, collectives=False)
UNCHECKED = Decoders(_Unchecked(), _Checked(), _TAIL, collectives=False)


@dataclass(frozen=True)
class MergeRank:
    rank: int
    path: Path
    why: str = ""  # why the merged trace holds it (slow, hung, reference, rank 0, ...)
    shift_us: int = 0  # added to every ts: the rank's time base minus the merged trace's, >= 0
    checked: bool = False  # this run parsed the file already (its summary was made from it)
    size_hint: int = 0  # uncompressed bytes of the trace file (expected_size), to plan which ranks fit the limit
    extra: bytes = b""  # events added after the trace's own, already on the merged trace's pids and time base


@dataclass
class MergedTrace:
    ranks: list[int] = field(default_factory=list)  # held, in order
    bytes: int = 0  # uncompressed JSON written
    left_out: dict[int, str] = field(default_factory=dict)  # rank -> why


@dataclass(frozen=True)
class _Segment:
    rank: int
    path: str
    size: int  # uncompressed bytes
    crc: int
    error: str = ""


class _Deflater:
    """Raw deflate of one part of the merged trace, ended by a sync flush so parts can be joined;
    counts the uncompressed bytes and their CRC-32."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.size, self.crc = out, 0, 0
        self._z = isal_zlib.compressobj(_LEVEL, isal_zlib.DEFLATED, -15)

    def write(self, data: bytes | bytearray) -> None:
        if data:
            self.out.write(self._z.compress(data))
            self.size += len(data)
            self.crc = isal_zlib.crc32(data, self.crc)

    def close(self) -> None:
        self.out.write(self._z.flush(isal_zlib.Z_SYNC_FLUSH))


@dataclass(frozen=True)
class _Values:
    """How the values of one key ("pid") are written in a piece."""

    count: int  # `"key"` found
    colon: bool  # each followed at once by a colon (else other spacing, or the key's text in a string)
    spaced: int  # of which `"key": v`, as Kineto writes them
    regular: bool  # all `"key":v` or `"key": v` (else some other spacing)
    numeric: bool  # all start with a digit
    after: np.ndarray  # offsets just after each `"key"`


def after_each(body: bytes | bytearray, key: bytes) -> np.ndarray:
    """Offsets just after each occurrence of `key` (4 bytes or more) in `body`: its first four
    bytes are compared as one 32-bit word at every offset (an unaligned, overlapping view of the
    bytes, one numpy pass), the rest where those match."""
    if len(body) < len(key):
        return np.empty(0, dtype=np.int64)
    words = np.ndarray((len(body) - 3,), dtype="<u4", buffer=body, strides=(1,))
    at = np.flatnonzero(words == int.from_bytes(key[:4], "little"))
    at = at[at <= len(body) - len(key)]
    if len(key) > 4:
        arr = np.frombuffer(body, dtype=np.uint8)
        for i, byte in enumerate(key[4:], 4):
            at = at[arr[at + i] == byte]
    return at + len(key)


def _values(body: bytes | bytearray, keys: Sequence[bytes]) -> list[_Values]:
    """_Values of each key, from the bytes after its occurrences."""
    arr = np.frombuffer(body, dtype=np.uint8)
    last = len(arr) - 1
    out = []
    for key in keys:
        at = after_each(body, key)
        colon, after, then = (arr[np.minimum(at + i, last)] for i in range(3))
        spaced = after == ord(" ")
        first = np.where(spaced, then, after)
        blank = (first == ord(" ")) | (first == ord("\t")) | (first == ord("\n")) | (first == ord("\r"))
        out.append(
            _Values(
                len(at),
                bool((colon == ord(":")).all()),
                int(spaced.sum()),
                not blank.any(),
                bool(((first >= ord("0")) & (first <= ord("9"))).all()),
                at,
            )
        )
    return out


class _RankRewriter:
    """The sink of decode_pieces for one rank: rewrites each piece and deflates it."""

    def __init__(self, rank: int, shift_us: int, out: _Deflater) -> None:
        self.rank, self.shift, self.out = rank, shift_us, out
        self.prefix = b"1%0*d" % (RANK_DIGITS, rank)
        self.odd: dict[object, int] = {}  # string/negative/null pid -> its number
        self.names: dict[int, str] = {}  # new pid -> the trace's own process name
        self.first = True

    def add(self, events: bytes | bytearray | list[msgspec.Raw], collectives: bool = True) -> None:
        text = events if isinstance(events, (bytes, bytearray)) else b",".join(events)
        if not text or text.isspace():
            return
        if not self.first:
            self.out.write(b",")  # apart, not joined: that would copy the piece
        self.out.write(self._rewritten(text))
        self.first = False

    def _rewritten(self, body: bytes | bytearray) -> bytes | bytearray:
        keys = _KEYS if self.shift else _KEYS[:2]
        found = _values(body, keys)
        # shift_ts takes any whitespace after the colon; nothing else does.
        if not all(f.regular for f in found[:2]) or not all(f.colon for f in found):
            for key in keys:
                body = _SPACED[key].sub(key + b":", body)
            found = _values(body, keys)
        # The timestamps first, while the offsets found are still those of the text.
        if self.shift:
            body = shift_ts(body, self.shift, found[2].after + 1 if found[2].colon else None)
        for key, f in zip(keys[:2], found):
            spaced, compact = key + b": ", key + b":"
            if f.spaced == f.count:  # as Kineto writes them: one pass
                body = body.replace(spaced, compact + self.prefix)
            else:
                body = body.replace(spaced, compact).replace(compact, compact + self.prefix)
        if not found[0].numeric:
            body = _ODD_PID.sub(self._odd_pid, body)
        if not found[1].numeric:
            body = _ODD_ID.sub(lambda m: b'"id":' + m[1], body)
        self._note_names(body)
        return body

    def _odd_pid(self, m: re.Match) -> bytes:
        value = msgspec.json.decode(m[1])
        if isinstance(value, (dict, list)):
            return b'"pid":' + m[1]
        key = (type(value).__name__, value)
        if key not in self.odd:
            self.odd[key] = int(f"2{self.rank:0{RANK_DIGITS}d}{len(self.odd)}")
            self.names.setdefault(self.odd[key], str(value))
        return b'"pid":%d' % self.odd[key]

    def _note_names(self, body: bytes | bytearray) -> None:
        """Process names from the piece's process_name events, found by text search (a handful
        among millions of events) and decoded one by one."""
        at = body.find(b'"process_name"')
        while at >= 0:
            start = max(0, at - 4096)
            around = (m for m in _EVENT.finditer(body, start, at + 4096) if m.start() <= at < m.end())
            event = next(around, None)
            if event is not None:
                try:
                    meta = msgspec.json.decode(event[0], type=_Meta)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    meta = None
                if meta is not None and meta.name == "process_name" and isinstance(meta.pid, int):
                    self.names[meta.pid] = str(meta.args.get("name", ""))
            at = body.find(b'"process_name"', at + 1)

    def metadata(self) -> bytes:
        """process_name "rank <r>: <name>" and a sort index for each process named in the trace,
        written after the trace's own so that they win."""
        events = []
        for order, (pid, name) in enumerate(sorted(self.names.items())):
            events.append(_Meta(name="process_name", pid=pid, args={"name": f"rank {self.rank}: {name or pid}"}))
            events.append(_Meta(name="process_sort_index", pid=pid, args={"sort_index": self.rank * 1000 + order}))
        return msgspec.json.encode(events)[1:-1]


def shift_ts(body: bytes | bytearray, shift: int, after: np.ndarray | None = None) -> bytes | bytearray:
    """`body` with `shift` (whole µs, >= 0) added to every `"ts":N` (with any spaces after the colon).

    Only the integer part changes, so fractional (ns-resolution) digits stay exact. The new integer
    parts are written right-aligned into their slots (the writer's spaces after the colon and the
    old digits) with numpy, all at once: Kineto's `"ts": N` leaves a space for a number that grows
    by a digit, so a piece is mostly rewritten in place. Where a slot is too small, room is made
    first with one bytes.replace (`"ts":` + as many spaces as the shift has digits, JSON
    whitespace). Values numpy cannot take (negative, exponents) are done one by one, a rare case.
    `after`: the offsets just after each `"ts":` in `body` where the caller has them. A bytearray
    is rewritten in place where it can be (and returned)."""
    if not shift or b'"ts":' not in body:
        return body
    buf = body if isinstance(body, bytearray) else bytearray(body)
    if not _shift_slots(buf, shift, padded=False, after=after):
        buf = bytearray(body.replace(b'"ts":', b'"ts":' + b" " * len(str(shift))))
        _shift_slots(buf, shift, padded=True)
    return buf


_POW10 = 10 ** np.arange(19, dtype=np.int64)


def _shift_slots(buf: bytearray, shift: int, padded: bool, after: np.ndarray | None = None) -> bool:
    """shift_ts on `buf` in place; False (and `buf` unchanged) where a slot has no room for its new
    number and the text was not `padded`.

    Adding the shift only changes a number's last digits (those the shift has, and as far as a
    carry runs), so they are added column by column from the right over all rows at once: a
    handful of passes over one byte a row. Rows with fewer digits than the shift, or whose carry
    runs past their first digit, are written whole from their integer value; numbers numpy cannot
    take (negative, exponents, too long) one by one."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    last = len(arr) - 1
    colon = (after_each(buf, b'"ts":') if after is None else after) - 1
    start = colon + 1  # the number's first byte, after the writer's own spaces
    for _ in range(_DIGITS):
        space = arr[np.minimum(start, last)] == ord(" ")
        if not space.any():
            break
        start += space
    end = _run_end(arr, start, _DIGITS + 1)
    width = end - start  # integer digits (a number of _DIGITS+ digits is "odd")
    stop = np.minimum(end, last)
    fraction = np.flatnonzero((arr[stop] == ord(".")) & (end < last))
    stop[fraction] = np.minimum(_run_end(arr, end[fraction] + 1, len(arr)), last)
    follow = arr[stop]  # what ends the number: no exponent
    plain = (width > 0) & (width <= _INT_DIGITS) & (end <= last) & (follow != ord("e")) & (follow != ord("E"))
    if not padded and not plain.all():
        return False
    digits = len(str(shift))
    rows = np.flatnonzero(plain & (width > digits))
    places, added, overflow = _added_digits(arr, end[rows], width[rows], shift, digits)
    whole = np.union1d(np.flatnonzero(plain & (width <= digits)), rows[overflow])
    w = width[whole]
    new = _values_of(arr, start[whole], w) + shift
    new_width = np.searchsorted(_POW10, new, side="right")
    end_whole = end[whole]
    room = end_whole - colon[whole] - 1  # the slot: [colon + 1, end), spaces and the old digits
    if (new_width > room).any():
        if not padded:
            return False
        raise ValueError(f"cannot move a timestamp by {shift} us in place")
    keep = ~np.isin(places[1], np.flatnonzero(overflow))  # column writes of rows written whole are dropped
    arr[places[0][keep]] = added[keep]
    j = np.arange(int(room.max(initial=0)))  # place of each byte of a slot, from the right
    inside = j < room[:, None]
    text = np.where(j < new_width[:, None], new[:, None] // _POW10[np.minimum(j, 18)] % 10 + 48, ord(" "))
    arr[(end_whole[:, None] - 1 - j)[inside]] = text[inside]
    for row in np.flatnonzero(~plain).tolist():
        _shift_one(buf, int(start[row]), int(start[row] - colon[row] - 1), shift)
    return True


def _run_end(arr: np.ndarray, at: np.ndarray, most: int) -> np.ndarray:
    """Where the run of ASCII digits starting at each offset `at` ends (at most `most` digits on),
    looking only at the rows still in a run each pass."""
    end = at.copy()
    rows = np.arange(len(end))
    for _ in range(most):
        ch = arr[np.minimum(end[rows], len(arr) - 1)]
        rows = rows[(ch >= 48) & (ch <= 57) & (end[rows] < len(arr))]
        if not rows.size:
            break
        end[rows] += 1
    return end


def _added_digits(
    arr: np.ndarray, end: np.ndarray, width: np.ndarray, shift: int, digits: int
) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
    """The shift added to each number (its digits end before `end`, `width` of them, more than
    the shift has), column by column from the right: ((byte offsets, row of each), new digit
    bytes, rows whose carry runs past their first digit, which need a digit more)."""
    offsets, owners, values = [], [], []
    carry = np.zeros(len(end), dtype=np.uint8)
    rows = np.arange(len(end))
    for j in range(digits):
        at = end - 1 - j
        d = arr[at] - 48 + carry + shift // 10**j % 10
        carry = (d >= 10).astype(np.uint8)
        offsets.append(at)
        owners.append(rows)
        values.append(d - 10 * carry + 48)
    rows = rows[carry.astype(bool)]
    j = digits
    overflow = np.zeros(len(end), dtype=bool)
    while rows.size:
        past = width[rows] <= j
        overflow[rows[past]] = True
        rows = rows[~past]
        at = end[rows] - 1 - j
        d = arr[at] - 47
        offsets.append(at)
        owners.append(rows)
        values.append(np.where(d == 10, 48, d + 48).astype(np.uint8))
        rows = rows[d == 10]
        j += 1
    if not offsets:
        return (np.empty(0, np.int64), np.empty(0, np.int64)), np.empty(0, np.uint8), overflow
    return (np.concatenate(offsets), np.concatenate(owners)), np.concatenate(values), overflow


def _values_of(arr: np.ndarray, start: np.ndarray, width: np.ndarray) -> np.ndarray:
    """The integers of `width` (<= _INT_DIGITS) ASCII digits from each offset `start`."""
    places = width[:, None] - 1 - np.arange(_INT_DIGITS)
    chars = arr[np.minimum(start[:, None] + np.arange(_INT_DIGITS), len(arr) - 1)].astype(np.int64) - 48
    return (chars * np.where(places >= 0, _POW10[np.maximum(places, 0)], 0)).sum(axis=1)


_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _shift_one(buf: bytearray, start: int, pad: int, shift: int) -> None:
    m = _NUMBER.match(buf, start)
    if m is None:
        return  # not a number (null, a string): Perfetto drops the event as the original would
    value = float(m[0]) + shift if any(c in m[0] for c in b".eE") else int(m[0]) + shift
    text = (b"%d" % value) if isinstance(value, int) or value.is_integer() else repr(value).encode()
    if len(text) > pad + len(m[0]):
        raise ValueError(f"cannot move timestamp {m[0].decode()} by {shift} us in place")
    buf[start - pad : m.end()] = text.rjust(pad + len(m[0]))


def _rank_segment(job: MergeRank, folder: str) -> _Segment:
    """Worker: the rank's events, rewritten, as a raw deflate stream in a file under `folder`."""
    path = Path(folder) / f"rank-{job.rank}.deflate"
    try:
        with path.open("wb") as f:
            out = _Deflater(f)
            rewriter = _RankRewriter(job.rank, job.shift_us, out)
            with open_trace(job.path) as stream:
                decode_pieces(stream, rewriter, UNCHECKED if job.checked else CHECKED)
            if job.extra:
                out.write(job.extra if rewriter.first else b"," + job.extra)
                rewriter.first = False
                rewriter.names[path_pid(job.rank)] = "critical path"
            meta = rewriter.metadata()
            if meta:
                out.write(meta if rewriter.first else b"," + meta)
            out.close()
    except (
        OSError,
        EOFError,
        ValueError,
        RecursionError,
        msgspec.DecodeError,
    ) as exc:  # ValidationError is a DecodeError
        path.unlink(missing_ok=True)
        return _Segment(job.rank, "", 0, 0, f"left out of the merged trace: {type(exc).__name__}: {exc}")
    return _Segment(job.rank, str(path), out.size, out.crc)


class _Member:
    """The one gzip member of the merged trace, assembled from sync-flushed deflate parts."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.size, self.crc = out, 0, 0
        out.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")  # no name, no mtime: same input, same bytes

    def text(self, data: bytes) -> None:
        part = _Deflater(self.out)
        part.write(data)
        part.close()
        self._count(part.size, part.crc)

    def deflated(self, segment: _Segment) -> None:
        with open(segment.path, "rb") as f:
            shutil.copyfileobj(f, self.out, 1 << 20)
        self._count(segment.size, segment.crc)

    def _count(self, size: int, crc: int) -> None:
        self.crc = isal_zlib.crc32_combine(self.crc, crc, size) if self.size else crc
        self.size += size

    def close(self) -> None:
        self.out.write(
            isal_zlib.compressobj(_LEVEL, isal_zlib.DEFLATED, -15).flush(isal_zlib.Z_FINISH)
        )  # the final block
        self.out.write(struct.pack("<II", self.crc & 0xFFFFFFFF, self.size & 0xFFFFFFFF))


_BARE_FOOTER = b'],"displayTimeUnit":"ms"}'


def _footer(held: list[MergeRank], left_out: dict[int, str]) -> bytes:
    """The end of the trace: what it holds and why, beside Perfetto's displayTimeUnit."""
    about = {
        "ranks": [{"rank": r.rank, "why": r.why[:_WHY_CHARS]} for r in held],
        "leftOut": {str(r): why[:_WHY_CHARS] for r, why in sorted(left_out.items())},
    }
    return b'],"displayTimeUnit":"ms","stepscope":' + msgspec.json.encode(about) + b"}"


def _planned(pending: list[MergeRank], room: int) -> list[MergeRank]:
    """The pending ranks, in order, whose expected sizes (the file's plus what the rewrite adds,
    about 1/16 on Kineto's traces) fit in `room` together; failing that, the first whose file
    alone fits, which the rewrite may still keep within the room."""
    batch, used = [], 0
    for job in pending:
        expected = job.size_hint + job.size_hint // 16
        if used + expected <= room:
            batch.append(job)
            used += expected
    return batch or [job for job in pending if job.size_hint <= room][:1]


def write_merged_trace(
    out: BinaryIO, plan: MergePlan, *, pool: Executor, on_done: Callable[[int], object] = lambda rank: None
) -> MergedTrace:
    """Stream the merged trace (gzip) to `out`: the counter events, then the plan's ranks in order
    while their uncompressed JSON fits the limit with everything else; a rank that does not fit or
    cannot be read is left out with the reason. Ranks are rewritten in `pool`."""
    ranks, limit_bytes = plan.ranks, plan.limit_bytes
    if limit_bytes < len(_OPEN) + len(_BARE_FOOTER):
        raise ValueError(f"a merged trace needs at least {len(_OPEN) + len(_BARE_FOOTER)} bytes, not {limit_bytes}")
    result = MergedTrace(left_out=dict(plan.left_out))
    counter_text = msgspec.json.encode(plan.counters)[1:-1]
    everyone = _footer(list(ranks), {r.rank: "x" * _WHY_CHARS for r in ranks})  # the footer's largest size
    noted = len(_OPEN) + len(everyone) <= limit_bytes  # else there is no room to say what was left out
    room = limit_bytes - len(_OPEN) - len(everyone if noted else _BARE_FOOTER)
    if len(counter_text) > room:
        counter_text = b""
    room -= len(counter_text)
    member = _Member(out)
    member.text(_OPEN + counter_text)
    first = not counter_text
    held: list[MergeRank] = []
    pending = list(ranks)
    with tempfile.TemporaryDirectory(prefix="stepscope-merge-") as folder:
        while pending:
            batch = _planned(pending, room - result.bytes)
            if not batch:
                break
            pending = [job for job in pending if job not in batch]
            for job, segment in zip(batch, _segments(pool, batch, folder)):
                size = segment.size + (0 if first else 1)
                if segment.error:
                    result.left_out[job.rank] = segment.error
                elif result.bytes + size > room:
                    result.left_out[job.rank] = (
                        f"left out of the merged trace: its {segment.size / 1e6:,.0f} MB of JSON do not fit "
                        f"the {limit_bytes / 1e6:,.0f} MB limit after the ranks before it"
                    )
                else:
                    if not first:
                        member.text(b",")
                    member.deflated(segment)
                    first = False
                    result.bytes += size
                    result.ranks.append(job.rank)
                    held.append(job)
                    on_done(job.rank)
                if segment.path:
                    Path(segment.path).unlink(missing_ok=True)
        for job in pending:
            result.left_out[job.rank] = (
                f"left out of the merged trace: its {job.size_hint / 1e6:,.0f} MB of JSON do not fit "
                f"the {limit_bytes / 1e6:,.0f} MB limit after the ranks before it"
            )
    footer = _footer(held, result.left_out) if noted else _BARE_FOOTER
    member.text(footer)
    member.close()
    result.bytes += len(_OPEN) + len(counter_text) + len(footer)
    return result


def _segments(pool: Executor, batch: list[MergeRank], folder: str) -> Iterator[_Segment]:
    """The batch's segments, in order. Where the ranks do not divide evenly over the pool's workers,
    the last wave would leave cores idle while this process only waits: it rewrites the last rank
    itself, beside the workers (3 ranks on 2 workers: 3 rewrites share the 2 cores at once)."""
    here = batch[-1:] if len(batch) % pool_workers(pool) else []
    futures = [pool.submit(_rank_segment, job, folder) for job in batch[: len(batch) - len(here)]]
    mine = [_rank_segment(job, folder) for job in here]
    for future in futures:
        yield future.result()
    yield from mine


@dataclass
class MergePlan:
    """What the merged trace may hold: candidates in order of importance, the counter events on
    the merged time base, the limit, and each candidate's trace key (for the report)."""

    ranks: list[MergeRank]
    counters: list[dict]
    limit_bytes: int
    base_us: float = 0.0
    sources: dict[int, str] = field(default_factory=dict)
    left_out: dict[int, str] = field(default_factory=dict)  # ranks not even tried, and why


def path_pid(rank: int) -> int:
    """The pid of a rank's critical path track: "3" and the rank, apart from the trace's own pids
    ("1" + rank + pid) and the odd ones ("2" + rank + n)."""
    return int(f"3{rank:0{RANK_DIGITS}d}")


def critical_path_events(rank: int, path: CriticalPathSummary | None, shift_us: int) -> bytes:
    """The rank's critical path as a track of its own in the merged trace: its longest edges as
    slices named after the op or kernel they are attributed to (or the gap they are), each with
    what bounds it; the text of the events, without brackets."""
    if path is None or not path.spans:
        return b""
    pid = path_pid(rank)
    events = [
        {
            "ph": "X",
            "cat": "critical_path",
            "pid": pid,
            "tid": 0,
            "ts": start + shift_us,
            "dur": dur,
            "name": path.spanNames[i] if 0 <= i < len(path.spanNames) else bound,
            "args": {"boundBy": bound, "pathSharePct": round(100 * dur / path.totalUs, 3) if path.totalUs else 0.0},
        }
        for start, dur, i, bound in path.spans
    ]
    events.append(
        {
            "ph": "M",
            "name": "thread_name",
            "pid": pid,
            "tid": 0,
            "args": {"name": f"critical path: {path.totalUs / 1000:,.2f} ms, its {len(path.spans)} longest parts"},
        }
    )
    return msgspec.json.encode(events)[1:-1]


def merge_order(diagnosis: Diagnosis, tables: RankTables, stacks: Iterable[int]) -> list[tuple[int, str]]:
    """(rank, why) of every analysed rank, those that explain the diagnosis first: the slow ones,
    the hung ones, a healthy reference to compare them with, rank 0; then the others in order."""
    usable = {int(r) for r in tables.ranks["rank"]}
    hung = [r for f in diagnosis.findings if f.category == "hang" for r in f.ranks] or sorted(stacks)
    first = [(w.rank, f"slow worker ({w.slowdown:.2f}x the median step time)") for w in diagnosis.slowWorkers]
    first += [(r, "hung or stuck (see the hang findings)") for r in hung]
    reference = _reference_rank(tables.steps, usable - {r for r, _ in first})
    if reference is not None:
        first.append((reference, "healthy reference: the step time closest to the median"))
    first.append((0, "rank 0"))
    order = dict.fromkeys(r for r, _ in first if r in usable)
    why: dict[int, str] = {}
    for r, reason in first:
        why.setdefault(r, reason)
    return [(r, why[r]) for r in order] + [
        (r, "in rank order, while there is room") for r in sorted(usable) if r not in order
    ]


def _reference_rank(steps: pd.DataFrame, ranks: set[int]) -> int | None:
    medians = (
        steps[steps["rank"].isin(ranks)].groupby("rank")["durationUs"].median()
        if not steps.empty
        else pd.Series(dtype=float)
    )
    if medians.empty:
        return None
    distance = np.abs(medians.to_numpy() - float(np.median(medians.to_numpy())))
    return int(medians.index[np.lexsort((medians.index.to_numpy(), distance))[0]])


def expected_size(path: Path) -> int:
    """Uncompressed bytes of a trace file, from the gzip trailer where it is gzip (ISIZE counts
    modulo 4 GiB: at least the file's own size)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        gzip = f.read(2) == b"\x1f\x8b"
        if gzip:
            f.seek(-4, 2)
            raw = struct.unpack("<I", f.read(4))[0]
            while raw < size:
                raw += 1 << 32
            size = raw
    return size


def describe(plan: MergePlan, result: MergedTrace, uri: str) -> dict:
    """The merged trace's entry in diagnosis.json."""
    held = {job.rank: job for job in plan.ranks}
    return {
        "uri": uri,
        "ranks": result.ranks,
        "bytes": result.bytes,
        "limitBytes": plan.limit_bytes,
        "held": [
            {"rank": r, "why": held[r].why, "source": plan.sources.get(r, ""), "shiftUs": held[r].shift_us}
            for r in result.ranks
        ],
        "leftOut": {str(r): why for r, why in sorted(result.left_out.items())},
    }


def sentence(plan: MergePlan, result: MergedTrace) -> str:
    """One line for the report page: which ranks the merged trace holds and why."""
    if not result.ranks:
        return (
            f"merged.trace.json.gz holds no rank's trace (limit {plan.limit_bytes / 1e6:,.0f} MB of JSON; see "
            "problems)."
        )
    why = {job.rank: job.why for job in plan.ranks}
    held = "; ".join(f"rank {r} ({why[r]})" for r in result.ranks)
    more = (
        f"; {len(result.left_out)} more left out to stay under {plan.limit_bytes / 1e6:,.0f} MB of JSON"
        if result.left_out
        else ""
    )
    return f"merged.trace.json.gz ({result.bytes / 1e6:,.0f} MB of JSON, open it in Perfetto) holds {held}{more}."
