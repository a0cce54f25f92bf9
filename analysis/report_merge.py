"""merged.trace.json.gz: every rank's raw Kineto trace in one file that opens in Perfetto, plus
the nodes' NVML counter tracks.

Ranks reuse the same pids (the GPU is pid 0 on every node) and the same correlation ids, so each
rank's pids and flow ids get the rank put in front. Events are never decoded into Python objects
one by one: the trace is parsed into raw event slices (which also checks it is valid JSON), the
pids and ids are rewritten in the text, and only the few process_name events are decoded, to put
the rank into process names.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import msgspec
from isal import igzip

# A rank's pids and flow ids get "1" and the rank in five digits put in front (pid 783658 of rank
# 3 -> 100003783658, pid 0 -> 1000030): unique across up to 100,000 ranks, integers as Perfetto
# wants, and for Kineto's `"pid": 123` a plain bytes.replace, with no Python work per event. What
# that leaves malformed (string, negative or null values, e.g. pid "Spans") is fixed up afterwards:
# pids from the trace's own list become "2" + the rank + their index, anything else is restored.
RANK_DIGITS = 5
_ODD = rb'1\d{%d}("(?:[^"\\]|\\.)*"|-\d+|null|true|false)' % RANK_DIGITS
_ODD_PID = re.compile(rb'"pid":' + _ODD)
_ODD_ID = re.compile(rb'"id":' + _ODD)
_SPACED = re.compile(rb'"(pid|id)"\s*:\s*')
_PID_VALUE = re.compile(rb'"pid"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|null|true|false)')
_PROCESS_NAME = re.compile(rb'"name"\s*:\s*"process_name"')
# A flat event with at most one nested object (its args), around a "process_name".
_EVENT = re.compile(rb'\{[^{}]*"process_name"[^{}]*(?:\{[^{}]*\}[^{}]*)?\}')
_TS = re.compile(rb'"ts"(\s*):(\s*)(-?\d+(?:\.\d+)?)')


class _Events(msgspec.Struct):
    traceEvents: list[msgspec.Raw] = []
    baseTimeNanoseconds: int = 0


class _Meta(msgspec.Struct):
    name: str = ""
    ph: str = "M"
    pid: object = None
    tid: object = 0
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


def _pid_map(pids: set, rank: int) -> dict[object, int]:
    numbers = {p for p in pids if isinstance(p, int) and not isinstance(p, bool) and p >= 0}
    others = sorted((p for p in pids if p not in numbers), key=str)
    mapped: dict[object, int] = {p: int(f"1{rank:0{RANK_DIGITS}d}{p}") for p in numbers}
    mapped.update({p: int(f"2{rank:0{RANK_DIGITS}d}{i}") for i, p in enumerate(others)})
    return mapped


def _prefixed(body: bytes, rank: int, pids: dict[object, int]) -> bytes:
    """Every "pid" and "id" value in the text with the rank's prefix (see RANK_DIGITS)."""
    # Kineto writes '"pid": 1'; anything else is normalised first (a regex pass, rare).
    body = body.replace(b'"pid": ', b'"pid":').replace(b'"id": ', b'"id":')
    if re.search(rb'"(?:pid|id)"\s+:|"(?:pid|id)":\s', body):
        body = _SPACED.sub(lambda m: b'"%s":' % m[1], body)
    prefix = b"1%0*d" % (RANK_DIGITS, rank)
    body = body.replace(b'"pid":', b'"pid":' + prefix).replace(b'"id":', b'"id":' + prefix)

    def odd_pid(m: re.Match) -> bytes:
        value = msgspec.json.decode(m[1])
        return b'"pid":%d' % pids[value] if value in pids else b'"pid":' + m[1]

    return _ODD_ID.sub(lambda m: b'"id":' + m[1], _ODD_PID.sub(odd_pid, body))


def _process_names(body: bytes) -> dict[object, str]:
    """pid -> name from the trace's process_name events, found by text search (a handful of
    events among millions) and decoded one by one."""
    names: dict[object, str] = {}
    for hit in _PROCESS_NAME.finditer(body):
        start = max(0, hit.start() - 4096)
        around = (m for m in _EVENT.finditer(body[start: hit.end() + 4096]) if m.start() <= hit.start() - start < m.end())
        event = next(around, None)
        if event is None:
            continue
        try:
            meta = msgspec.json.decode(event[0], type=_Meta)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        names[meta.pid] = str(meta.args.get("name", ""))
    return names


def _rank_events(data: bytes, rank: int, base_ns: list[int]) -> tuple[bytes, list[bytes]]:
    """(the rank's events joined by commas with pids and ids rewritten, process metadata naming
    each of its processes "rank <r>: <name>", written after the trace's own so that it wins).

    Kineto's `ts` counts from the trace's baseTimeNanoseconds, which differs between ranks: the
    first rank's base becomes the merged trace's (`base_ns` holds it) and the others' `ts` move."""
    decoded = msgspec.json.decode(data, type=_Events)
    body, base = b",".join(decoded.traceEvents), decoded.baseTimeNanoseconds
    del decoded
    pids = _pid_map({msgspec.json.decode(v) for v in set(_PID_VALUE.findall(body))}, rank)
    names = _process_names(body)
    body = _prefixed(body, rank, pids)
    if not base_ns:
        base_ns.append(base)
    elif base != base_ns[0]:
        shift = (base - base_ns[0]) / 1000.0

        def moved(m: re.Match) -> bytes:
            value = float(m[3]) + shift
            return b'"ts"%s:%s%s' % (m[1], m[2], (b"%d" % value) if value.is_integer() else repr(value).encode())

        body = _TS.sub(moved, body)
    meta_events = []
    for order, (old, new) in enumerate(sorted(pids.items(), key=lambda item: item[1])):
        meta_events.append(msgspec.json.encode(_Meta(name="process_name", pid=new, args={"name": f"rank {rank}: {names.get(old) or old}".rstrip(": ")})))
        meta_events.append(msgspec.json.encode(_Meta(name="process_sort_index", pid=new, args={"sort_index": rank * 1000 + order})))
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
        events = counters(base_ns[0] / 1000.0 if base_ns else 0.0)
        if events:
            part = msgspec.json.encode(events)[1:-1]  # the list's items, comma-separated
            gz.write(part if first else b"," + part)
        gz.write(b"]}")
    return merged
