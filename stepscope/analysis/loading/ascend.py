"""Read an Ascend NPU capture (torch_npu's profiler) into the columns of a Kineto trace.

torch_npu writes one folder per rank, `<host>_<pid>_<time>_ascend_pt/`, with `profiler_info_<rank>.json`
(its "rank_id") and, once parsed, `ASCEND_PROFILER_OUTPUT/` (Ascend's "PyTorch profiling data" pages:
trace_view.json, kernel_details.csv, operator_details.csv, step_trace_time.csv, communication.json).
What this reads of it:

- trace_view.json (a Chrome trace, a bare array, times written as strings of epoch µs): the host
  side — the Python process's `cpu_op` events (ProfilerStep#N among them), `python_function` and
  `user_annotation` events;
- kernel_details.csv: the device's kernels, one row each (Name, Type, Accelerator Core, Start
  Time(us), Duration(us), Stream ID where the profiler level writes it). Rows whose Accelerator
  Core is HCCL (HCCL's collective operations, `hcom_allReduce_...`, waiting included) are the
  communication; every other row is compute.

Times are kept exactly: epoch µs as strings hold more digits than a float64 at 1.7e15 µs (steps
of 0.25 µs), so each is split at its decimal point and taken from the capture's first whole µs,
which becomes the trace's base time. Every kernel gets a correlation of its own and no launching
call (the capture's host->device links are not read): a kernel belongs to the step in which it
starts. The trace's caps apply: trace_view.json is streamed up to the JSON bytes and events of
`Limits`, kernel_details.csv read up to the same bytes and rows.
"""

from __future__ import annotations

import io
import json
import re
from itertools import compress, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from .trace import (
    OPERATOR_CAT,
    PYTHON_CAT,
    Collectives,
    Decoders,
    Limits,
    Trace,
    TraceCut,
    TraceError,
    _codes,
    decode_pieces,
    impossible_times,
)

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TRACE_VIEW = "trace_view.json"
KERNEL_DETAILS = "kernel_details.csv"
STEP_TRACE_TIME = "step_trace_time.csv"
_PROFILER_INFO = re.compile(r"^profiler_info_(\d+)\.json$")
_HOST_CATS = (OPERATOR_CAT, PYTHON_CAT, "user_annotation")
_COMM_CORE = "HCCL"
# profiler_info_<rank>.json is a ~1 KB settings file.
_MAX_INFO_BYTES = 1 << 20
_KERNEL_COLUMNS = ["Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)", "Stream ID"]


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str | None = None
    pid: int | str = 0
    tid: int | str = 0
    ts: str | float | int | None = None
    dur: str | float | int | None = None


class _Tail(msgspec.Struct):
    traceEvents: list[_Event] = []


class _Host:
    """Sink of decode_pieces: the host events with a duration, up to `max_events`."""

    def __init__(self, max_events: int) -> None:
        self.max_events = max_events
        self.events: list[_Event] = []

    def add(self, events: Any, collectives: bool = True) -> None:
        kept = list(compress(events, map(_HOST_CATS.__contains__, map(attrgetter("cat"), events))))
        room = self.max_events - len(self.events)
        self.events += kept[:room]
        if len(kept) > room:
            raise TraceCut(f"cut after {self.max_events:,} host events")


def capture_dir(path: Path) -> Path | None:
    """The `*_ascend_pt` folder `path` is, or whose ASCEND_PROFILER_OUTPUT or trace_view.json it
    is; None for anything else."""
    for candidate in (path, path.parent, path.parent.parent):
        if (candidate / OUTPUT_DIR / TRACE_VIEW).is_file() or (candidate / OUTPUT_DIR / KERNEL_DETAILS).is_file():
            return candidate
    return None


def capture_rank(folder: Path) -> int | None:
    """The rank torch_npu recorded for the capture: profiler_info_<rank>.json's rank_id, else the
    number in its name."""
    for info in sorted(folder.glob("profiler_info_*.json")):
        m = _PROFILER_INFO.match(info.name)
        if not m:
            continue
        try:
            if info.stat().st_size <= _MAX_INFO_BYTES:
                rank = json.loads(info.read_bytes()).get("rank_id")
                if isinstance(rank, int) and rank >= 0:
                    return rank
        except (OSError, ValueError, AttributeError, RecursionError):
            pass
        return int(m.group(1))
    return None


def _times(texts: pd.Series, base: int | None = None) -> tuple[np.ndarray, int]:
    """Epoch-µs strings -> µs after `base` (default: the earliest whole µs), exactly to the digits
    written; NaN for text that is no number."""
    parts = texts.astype(str).str.strip().str.split(".", n=1, expand=True).reindex(columns=[0, 1])
    whole = pd.to_numeric(parts[0], errors="coerce").to_numpy(dtype=np.float64)
    frac = pd.to_numeric("0." + parts[1].fillna("0"), errors="coerce").to_numpy(dtype=np.float64)
    ok = ~np.isnan(whole)
    if base is None:
        base = int(whole[ok].min()) if ok.any() else 0
    # Whole µs below 2**53 are exact in a float64; the difference to `base` is small, the fraction added after.
    return np.where(ok, whole - base, np.nan) + frac, base


def _host_events(path: Path, limits: Limits) -> tuple[list[_Event], str]:
    host = _Host(limits.max_events)
    decoder = msgspec.json.Decoder(list[_Event])
    cut = ""
    try:
        with path.open("rb") as stream:
            decode_pieces(
                stream,
                host,
                Decoders(decoder, decoder, msgspec.json.Decoder(_Tail), collectives=False),
                max_bytes=limits.max_bytes,
            )
    except TraceCut as e:
        cut = f"{TRACE_VIEW} was {e}: only its beginning is analysed"
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply") from None
    except msgspec.DecodeError as e:  # ValidationError included
        raise TraceError(f"{path}: invalid JSON or unexpected value ({e})") from None
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: {e}") from None
    return host.events, cut


def _kernel_rows(path: Path, limits: Limits) -> tuple[pd.DataFrame, str]:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            data = f.read(limits.max_bytes)
    except FileNotFoundError:
        raise TraceError(
            f"{path}: no such file (the capture was not parsed, or not at a level that lists kernels)"
        ) from None
    except OSError as e:
        raise TraceError(f"{path}: {e}") from None
    cut = (
        f"{KERNEL_DETAILS} was cut after {limits.max_bytes >> 20:,} MiB: only its beginning is analysed"
        if size > limits.max_bytes
        else ""
    )
    if cut:
        data = data[: data.rfind(b"\n") + 1]
    try:
        rows = pd.read_csv(
            io.BytesIO(data),
            dtype=str,
            keep_default_na=False,
            nrows=limits.max_events + 1,
            usecols=lambda c: c in _KERNEL_COLUMNS,
            encoding_errors="replace",
        )
    except (ValueError, pd.errors.ParserError) as e:
        raise TraceError(f"{path}: not a readable CSV ({e})") from None
    if len(rows) > limits.max_events:
        rows = rows.iloc[: limits.max_events]
        cut = f"{KERNEL_DETAILS} was cut after {limits.max_events:,} kernels: only its beginning is analysed"
    missing = {"Name", "Start Time(us)", "Duration(us)"} - set(rows.columns)
    if missing:
        raise TraceError(f"{path}: not a kernel_details.csv (no column {', '.join(sorted(missing))})")
    return rows.reindex(columns=_KERNEL_COLUMNS, fill_value=""), cut


def load_capture(folder: str | Path, limits: Limits | None = None) -> Trace:
    """The capture in `folder` (an `*_ascend_pt` folder) as a Trace. Raises TraceError naming the
    file when it cannot be read."""
    folder = Path(folder)
    limits = limits or Limits()
    out = folder / OUTPUT_DIR
    host, host_cut = _host_events(out / TRACE_VIEW, limits)
    kernels, kernel_cut = _kernel_rows(out / KERNEL_DETAILS, limits)
    n_k, n_h = len(kernels), len(host)
    k_start, k_base = _times(kernels["Start Time(us)"])
    h_start, h_base = _times(pd.Series(list(map(str, map(attrgetter("ts"), host))), dtype=object))
    base = min(k_base if n_k else h_base, h_base if n_h else k_base)
    k_start, h_start = k_start + (k_base - base), h_start + (h_base - base)
    k_dur = pd.to_numeric(kernels["Duration(us)"], errors="coerce").to_numpy(dtype=np.float64)
    h_dur = pd.to_numeric(pd.Series(list(map(attrgetter("dur"), host)), dtype=object), errors="coerce").to_numpy(
        dtype=np.float64
    )
    comm = (kernels["Accelerator Core"].str.strip() == _COMM_CORE).to_numpy()
    stream = pd.to_numeric(kernels["Stream ID"], errors="coerce").fillna(-1).to_numpy(dtype=np.int64)
    # Without a Stream ID (profiler level 0) the compute kernels share stream 0, the collectives stream 1.
    stream = np.where(stream < 0, comm.astype(np.int64), stream)
    device_ids = pd.to_numeric(kernels["Device_id"], errors="coerce").dropna()
    device = int(device_ids.iloc[0]) if len(device_ids) and 0 <= device_ids.iloc[0] < 64 else 0
    names: dict[str, int] = {}
    cats: dict[str, int] = {}
    cat = np.concatenate(
        [_codes(cats, repeat("kernel", n_k), n_k), _codes(cats, map(str, map(attrgetter("cat"), host)), n_h)]
    )
    name = np.concatenate([_codes(names, kernels["Name"], n_k), _codes(names, map(attrgetter("name"), host), n_h)])
    ts = np.concatenate([k_start, h_start])
    dur = np.concatenate([k_dur, h_dur])
    host_tid = pd.to_numeric(pd.Series(list(map(attrgetter("tid"), host)), dtype=object), errors="coerce")
    tid = np.concatenate([stream, host_tid.fillna(-1).to_numpy(dtype=np.int64)])
    columns = {
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "tid": tid,
        "pid": np.concatenate([np.full(n_k, device, np.int64), np.full(n_h, -1, np.int64)]),
        "stream": np.concatenate([stream, np.full(n_h, -1, np.int64)]),
        # Each kernel its own correlation: no launching call is linked (module docstring).
        "correlation": np.concatenate([np.arange(n_k, dtype=np.int64), np.full(n_h, -1, np.int64)]),
    }
    bad = np.zeros(len(ts), dtype=bool)
    for mask in impossible_times(ts, dur).values():
        bad |= mask
    bad |= np.isnan(ts) | np.isnan(dur)
    warnings = [w for w in (host_cut, kernel_cut) if w]
    if bad.any():
        warnings.append(f"{int(bad.sum()):,} events with impossible or unreadable times were dropped")
        columns = {k: v[~bad] for k, v in columns.items()}
    if not len(columns["ts"]):
        raise TraceError(f"{folder}: the capture has no kernels or host events with a duration")
    n = len(columns["ts"])
    none = np.full(n, -1, dtype=np.int64)
    rank = capture_rank(folder)
    if rank is None:
        warnings.append("no profiler_info_<rank>.json in the capture (rank unknown)")
    return Trace(
        path=str(out / TRACE_VIEW),
        rank=rank,
        world_size=0,
        backend="hccl",
        cats=list(cats),
        names=list(names),
        cat=columns["cat"],
        name=columns["name"],
        pid=columns["pid"],
        ts=columns["ts"],
        dur=columns["dur"],
        stream=columns["stream"],
        correlation=columns["correlation"],
        external_id=none,
        nbytes=none,
        python_id=none,
        python_parent=none,
        collectives=Collectives(
            np.empty(0, np.int64), [], np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), []
        ),
        tid=columns["tid"],
        shape=np.full(n, -1, dtype=np.int32),
        shape_texts=[],
        rounded=False,
        first_event_ts=float("nan"),
        warnings=warnings,
        base_ns=base * 1000,
        wait_record=none,
        wait_stream=none,
    )
