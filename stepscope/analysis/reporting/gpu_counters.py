"""Perfetto counter tracks of the GPU samples, for the merged trace (merged.trace.json.gz)."""
from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from stepscope.analysis.statistics.gpu_steps import counter, series
from stepscope.gpu_sample_file import THROTTLE_REASONS

COUNTER_BIN_US = 1_000
MAX_COUNTER_EVENTS = 200_000

_COUNTERS = (
    ("sm_clock_mhz", "SM clock (MHz)"),
    ("gpu_util_pct", "GPU utilization (%)"),
    ("power_w", "power (W)"),
    ("temperature_c", "temperature (°C)"),
    ("memory_used_mib", "memory used (MiB)"),
)


def _changes(ts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Only the samples where the value changes (a counter track holds its last value)."""
    if len(values) == 0:
        return ts, values
    keep = np.concatenate(([True], values[1:] != values[:-1]))
    keep[-1] = True
    return ts[keep], values[keep]


def _binned_rate_gbs(ts: np.ndarray, total: np.ndarray, bin_us: float) -> tuple[np.ndarray, np.ndarray]:
    if len(ts) < 2:
        return np.empty(0), np.empty(0)
    bins = np.floor(ts / bin_us)
    last = np.append(np.flatnonzero(np.diff(bins) != 0), len(ts) - 1)
    t, c = ts[last], total[last]
    return t[1:], np.diff(c) / np.diff(t) / 1e3


def _thin(ts: np.ndarray, values: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """At most about `budget` points: the last sample of each of `budget` equal time bins."""
    if len(ts) <= budget or ts[-1] <= ts[0]:
        return ts[:budget], values[:budget]
    bins = np.floor((ts - ts[0]) / ((ts[-1] - ts[0]) / (budget - 1)))
    keep = np.append(np.flatnonzero(np.diff(bins) != 0), len(ts) - 1)
    return ts[keep], values[keep]


def counter_events(metrics: pd.DataFrame, pod: str, *, base_us: float = 0.0, pid: int | None = None) -> list[dict]:
    """Perfetto/Chrome counter events ("ph": "C") of one pod's GPU metrics, for merged.trace.json.gz.

    One process per pod (named "GPU metrics <pod>", `pid` default: derived from the pod name),
    one counter track per GPU and metric: SM clock, utilization, power, temperature, memory used,
    throttled (0/1, any throttle reason), PCIe and NVLink throughput (GB/s, 1 ms bins). `ts` is
    `ts_us - base_us`: pass the merged trace's time base (µs, Unix epoch) when its events are
    relative to one. Values are kept only where they change, and binned coarser when a track
    would exceed MAX_COUNTER_EVENTS overall.
    """
    if metrics.empty:
        return []
    pid = pid if pid is not None else 1_000_000 + zlib.crc32(pod.encode()) % 1_000_000
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"GPU metrics {pod or 'this node'}"}},
                          {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}}]
    tracks: list[tuple[str, np.ndarray, np.ndarray]] = []
    for gpu, rows in metrics.groupby("gpu", sort=True):
        label = f"GPU {int(gpu)}"
        for column, name in _COUNTERS:
            tracks.append((f"{label} {name}", *_changes(*series(rows, column))))
        ts, reasons = series(rows, "clock_reasons")
        tracks.append((f"{label} throttled", *_changes(ts, ((reasons.astype(np.int64) & THROTTLE_REASONS) != 0).astype(np.float64))))
        for kind, name in (("pcie", "PCIe"), ("nvlink", "NVLink")):
            ts, total = counter(rows, kind)
            if len(ts) and total.any():
                tracks.append((f"{label} {name} (GB/s)", *_binned_rate_gbs(ts, total, COUNTER_BIN_US)))
    budget = max(2, MAX_COUNTER_EVENTS // max(1, len(tracks)))
    for name, ts, values in tracks:
        ts, values = _thin(ts, values, budget)
        events.extend({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": round(float(t) - base_us, 3),
                       "args": {"value": round(float(v), 3)}} for t, v in zip(ts, values))
    return events
