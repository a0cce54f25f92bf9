"""merged.trace.json.gz: every rank's raw Kineto trace in one file that opens in Perfetto, plus
the nodes' NVML counter tracks.

Ranks reuse the same pids (the GPU is pid 0 on every node) and the same correlation ids, so each
rank's pids become rank * PID_STRIDE + n and its flow ids are shifted by rank << 40. Events are
not decoded one by one: the trace is parsed once into raw event slices (which also checks it is
valid JSON), the pids and ids are rewritten with a byte-level substitution, and only the few
metadata events are decoded, to put the rank into process names.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import msgspec
from isal import igzip

PID_STRIDE = 1000
_FLOW_SHIFT = 40
_PID = re.compile(rb'"pid"(\s*):(\s*)("(?:[^"\\]|\\.)*"|-?\d+)')
_ID = re.compile(rb'"id"(\s*):(\s*)(\d+)')
_TS = re.compile(rb'"ts"(\s*):(\s*)(-?\d+(?:\.\d+)?)')
_METADATA = (b'"ph": "M"', b'"ph":"M"')


class _Events(msgspec.Struct):
    traceEvents: list[msgspec.Raw] = []
    baseTimeNanoseconds: int = 0


class _Meta(msgspec.Struct, omit_defaults=True):
    name: str = ""
    ph: str = "M"
    pid: object = None
    tid: object = None
    args: dict = {}


def read_raw_trace(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip (any name); raises OSError/EOFError on a
    truncated or unreadable file."""
    with path.open("rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        with igzip.open(path, "rb") as f:
            return f.read()
    return path.read_bytes()


def _rank_events(data: bytes, rank: int, base_ns: list[int]) -> tuple[bytes, list[bytes]]:
    """(non-metadata events joined by commas with pids and ids rewritten, rewritten metadata events).

    Kineto's `ts` counts from the trace's baseTimeNanoseconds, which differs between ranks: the
    first rank's base becomes the merged trace's (`base_ns` holds it) and the others' `ts` move."""
    decoded = msgspec.json.decode(data, type=_Events)
    events, base = [bytes(r) for r in decoded.traceEvents], decoded.baseTimeNanoseconds
    del decoded
    pids: dict[bytes, int] = {}

    def new_pid(old: bytes) -> int:
        return pids.setdefault(old, rank * PID_STRIDE + len(pids))

    def pid(m: re.Match) -> bytes:
        return b'"pid"%s:%s%d' % (m[1], m[2], new_pid(m[3]))

    def flow_id(m: re.Match) -> bytes:
        return b'"id"%s:%s%d' % (m[1], m[2], (rank << _FLOW_SHIFT) + int(m[3]))

    is_meta = [any(t in e for t in _METADATA) for e in events]
    body = b",".join(e for e, meta in zip(events, is_meta) if not meta)
    body = _ID.sub(flow_id, _PID.sub(pid, body))
    if not base_ns:
        base_ns.append(base)
    elif base != base_ns[0]:
        shift = (base - base_ns[0]) / 1000.0

        def moved(m: re.Match) -> bytes:
            value = float(m[3]) + shift
            return b'"ts"%s:%s%s' % (m[1], m[2], (b"%d" % value) if value.is_integer() else repr(value).encode())

        body = _TS.sub(moved, body)
    meta_events = []
    named: set[int] = set()
    for raw, meta in zip(events, is_meta):
        if not meta:
            continue
        event = msgspec.json.decode(raw, type=_Meta)
        event.pid = new_pid(msgspec.json.encode(event.pid))
        if event.name == "process_name":
            event.args = {**event.args, "name": f"rank {rank}: {event.args.get('name', '')}"}
            named.add(event.pid)
        meta_events.append(msgspec.json.encode(event))
    for old, new in pids.items():
        if new not in named:
            meta_events.append(msgspec.json.encode(_Meta(name="process_name", pid=new, args={"name": f"rank {rank}: {old.decode(errors='replace').strip(chr(34))}"})))
        meta_events.append(msgspec.json.encode(_Meta(name="process_sort_index", pid=new, args={"sort_index": new})))
    return body, meta_events


def write_merged_trace(out: BinaryIO, traces: Iterable[tuple[int, Path]], counters: Callable[[float], list[dict]], *,
                       on_error: Callable[[int, str], None], on_done: Callable[[int], None] = lambda rank: None) -> list[int]:
    """Stream the merged trace, gzip-compressed, to `out`; returns the ranks it holds. A rank whose
    trace cannot be read is reported through `on_error` and left out. `counters(base_us)` gives
    the hardware counter events on the merged trace's time base."""
    merged: list[int] = []
    base_ns: list[int] = []
    with igzip.open(out, "wb", compresslevel=1) as gz:
        gz.write(b'{"displayTimeUnit": "ms", "traceEvents": [')
        first = True
        for rank, path in traces:
            try:
                body, meta = _rank_events(read_raw_trace(path), rank, base_ns)
            except (OSError, EOFError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                on_error(rank, f"left out of the merged trace: {exc}")
                continue
            for part in (body, *meta):
                if part:
                    gz.write(part if first else b"," + part)
                    first = False
            merged.append(rank)
            on_done(rank)
        for event in counters(base_ns[0] / 1000.0 if base_ns else 0.0):
            part = msgspec.json.encode(event)
            gz.write(part if first else b"," + part)
            first = False
        gz.write(b"]}")
    return merged
