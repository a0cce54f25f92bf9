"""The sidecar's GPU samples file (nodes/<pod>/gpu-metrics.csv.gz, docs/wire.md) as columns.

Its `ts_us` is Unix epoch microseconds, the clock of a Kineto trace's `ts` +
`baseTimeNanoseconds` / 1000, so the samples line up with the captured steps.
"""
from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

REQUIRED_COLUMNS = ("ts_us", "gpu")


def read_metrics(data: bytes | Path) -> pd.DataFrame:
    """A gpu-metrics.csv.gz (path or bytes, gzip or plain) as float64 columns sorted by ts_us.

    A truncated gzip keeps the complete rows before the cut and says so in
    `frame.attrs["warnings"]`; anything that is not such a file raises ValueError.
    """
    raw = Path(data).read_bytes() if isinstance(data, (str, Path)) else bytes(data)
    warnings: list[str] = []
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error):
            raw = _partial_gunzip(raw)
            raw = raw[: raw.rfind(b"\n") + 1]
            rows = max(raw.count(b"\n") - 1, 0)
            warnings.append(f"gpu metrics file is truncated; kept the {rows} complete rows")
    if not raw.strip():
        raise ValueError("gpu metrics file is empty")
    try:
        frame = pd.read_csv(io.BytesIO(raw), dtype=np.float64)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ValueError(f"not a gpu metrics CSV: {error}") from error
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"gpu metrics file lacks column(s) {missing}; has {list(frame.columns)[:8]}")
    frame = frame.dropna(subset=list(REQUIRED_COLUMNS)).sort_values(["ts_us", "gpu"], kind="stable").reset_index(drop=True)
    frame.attrs["warnings"] = warnings
    return frame


def _partial_gunzip(raw: bytes) -> bytes:
    inflater = zlib.decompressobj(wbits=31)
    try:
        return inflater.decompress(raw)
    except zlib.error as error:
        raise ValueError(f"gpu metrics file is not valid gzip: {error}") from error
