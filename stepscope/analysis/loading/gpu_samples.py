"""The sidecar's GPU samples file (nodes/<pod>/gpu-metrics.csv.gz, docs/wire.md) as columns.

Its `ts_us` is Unix epoch microseconds, the clock of a Kineto trace's `ts` +
`baseTimeNanoseconds` / 1000, so the samples line up with the captured steps.

The file is untrusted input (a small gzip can inflate to terabytes): it is inflated in chunks up
to a cap on its uncompressed bytes, and at most MAX_CELLS values are parsed; a file over either is
cut at a row and says so in its warnings.
"""
from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from stepscope.analysis.settings import MAX_METRICS_MB_ENV, metrics_cap_bytes

REQUIRED_COLUMNS = ("ts_us", "gpu")
# 32 M values (256 MB of float64: 600 k rows of an H100's 51 columns) beside the byte cap
# (settings.DEFAULT_MAX_METRICS_MB) leave room for a node's minute at 1 kHz.
MAX_CELLS = 32_000_000
_READ = 1 << 20


def read_metrics(data: bytes | Path, max_bytes: int | None = None) -> pd.DataFrame:
    """A gpu-metrics.csv.gz (path or bytes, gzip or plain) as float64 columns sorted by ts_us.

    A truncated gzip keeps the complete rows before the cut, a file over `max_bytes` of CSV (by
    default the environment's cap) or MAX_CELLS values the rows before the cap, and either says
    so in `frame.attrs["warnings"]`; anything that is not such a file raises ValueError.
    """
    limit = metrics_cap_bytes() if max_bytes is None else max_bytes
    raw, warnings = _bounded(_chunks(data), limit)
    if not raw.strip():
        raise ValueError("gpu metrics file is empty")
    header = raw[: raw.find(b"\n") + 1 or len(raw)]
    rows = MAX_CELLS // max(header.count(b",") + 1, 1)
    try:
        frame = pd.read_csv(io.BytesIO(raw), dtype=np.float64, nrows=rows + 1)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ValueError(f"not a gpu metrics CSV: {error}") from error
    if len(frame) > rows:
        frame = frame.iloc[:rows]
        warnings.append(f"gpu metrics file cut after {rows:,} rows ({MAX_CELLS:,} values): the rest is not analysed")
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"gpu metrics file lacks column(s) {missing}; has {list(frame.columns)[:8]}")
    frame = frame.dropna(subset=list(REQUIRED_COLUMNS)).sort_values(["ts_us", "gpu"], kind="stable").reset_index(drop=True)
    frame.attrs["warnings"] = warnings
    return frame


def _chunks(data: bytes | Path) -> Iterator[bytes]:
    if not isinstance(data, (str, Path)):
        yield from (bytes(data[i: i + _READ]) for i in range(0, len(data), _READ))
        return
    with open(data, "rb") as f:
        yield from iter(lambda: f.read(_READ), b"")


def _bounded(chunks: Iterator[bytes], limit: int) -> tuple[bytes, list[str]]:
    """The file's bytes, gunzipped when it is gzip (every member), at most `limit` of them and then
    up to the last complete row; with warnings saying what was cut."""
    first = next(chunks, b"")
    if first[:2] != b"\x1f\x8b":
        out = bytearray(first)
        for chunk in chunks:
            if len(out) > limit:
                break
            out += chunk
        return _cut(out, limit)
    out = bytearray()
    inflater, pending, fed = zlib.decompressobj(wbits=31), first, False
    while len(out) <= limit:
        try:
            while pending and len(out) <= limit:
                out += inflater.decompress(pending, limit + 1 - len(out))
                pending, fed = inflater.unconsumed_tail, True
                if inflater.eof:  # another gzip member may follow (concatenated gzip files are one file)
                    pending = inflater.unused_data + pending
                    inflater, fed = zlib.decompressobj(wbits=31), False
        except zlib.error as error:
            if not out:
                raise ValueError(f"gpu metrics file is not valid gzip: {error}") from error
            return _truncated(out)
        pending = next(chunks, b"") if len(out) <= limit else b""
        if not pending and len(out) <= limit:
            return _truncated(out) if fed else (bytes(out), [])
    return _cut(out, limit)


def _truncated(out: bytearray) -> tuple[bytes, list[str]]:
    out = out[: out.rfind(b"\n") + 1]
    rows = max(out.count(b"\n") - 1, 0)
    return bytes(out), [f"gpu metrics file is truncated; kept the {rows} complete rows"]


def _cut(out: bytearray, limit: int) -> tuple[bytes, list[str]]:
    if len(out) <= limit:
        return bytes(out), []
    out = out[: out.rfind(b"\n", 0, limit) + 1]
    return bytes(out), [f"gpu metrics file cut after {limit >> 20:,} MiB of CSV ({MAX_METRICS_MB_ENV}): the rest is not analysed"]
