"""One GPU's samples (loading.gpu_samples) over a rank's captured steps: per-step hardware
statistics for RankSummary.hardware, and the column helpers the hardware findings and the merged
trace's counter tracks share. Pure functions over columnar data; no torch, no pynvml.

A StepRow's window (`startUs` + RankSummary.traceBaseUs, `durationUs`) selects the samples of that
step (both in Unix epoch microseconds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.analysis.model import StepRow
from stepscope.gpu_sample_file import PCIE_COUNTER_WRAP, POWER_REASONS, THERMAL_REASONS, THROTTLE_REASONS

ASOF_US = 1_000_000  # a slow metric's last sample up to this long before a step stands for it


def series(gpu_rows: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(ts, value) of one column where it was measured."""
    if column not in gpu_rows.columns:
        return np.empty(0), np.empty(0)
    values = gpu_rows[column].to_numpy()
    keep = ~np.isnan(values)
    return gpu_rows["ts_us"].to_numpy()[keep], values[keep]


def counter(gpu_rows: pd.DataFrame, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(ts, cumulative bytes) of all TX+RX counters of `kind` ("pcie" or "nvlink")."""
    if kind == "pcie":
        columns, scale = [c for c in ("pcie_tx_bytes", "pcie_rx_bytes") if c in gpu_rows.columns], 1.0
    else:
        columns, scale = [c for c in gpu_rows.columns if c.startswith("nvlink") and c.endswith("_kib")], 1024.0
    if not columns:
        return np.empty(0), np.empty(0)
    values = np.column_stack([unwrapped(gpu_rows[c].to_numpy(), wraps=kind == "pcie") for c in columns])
    keep = ~np.isnan(values).all(axis=1)
    # A counter missing from a row holds its last value there, so that the total never drops.
    held = pd.DataFrame(values[keep]).ffill().to_numpy()
    return gpu_rows["ts_us"].to_numpy()[keep], np.nan_to_num(held).sum(axis=1) * scale


def unwrapped(values: np.ndarray, wraps: bool) -> np.ndarray:
    """A cumulative counter (NaN where not read) as it would read without going back: with `wraps`
    a drop from a value below PCIE_COUNTER_WRAP is a 32-bit wrap and adds it; any other drop (a
    reset) adds nothing."""
    seen = ~np.isnan(values)
    read = values[seen]
    if len(read) < 2:
        return values
    step = np.diff(read)
    if wraps:
        step[(step < 0) & (read[:-1] < PCIE_COUNTER_WRAP)] += PCIE_COUNTER_WRAP
    step[step < 0] = 0.0
    out = values.copy()
    out[seen] = read[0] + np.concatenate(([0.0], np.cumsum(step)))
    return out


@dataclass
class _Reduced:
    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray
    count: np.ndarray


def reduce(ts: np.ndarray, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> _Reduced:
    """Mean/min/max of the samples inside each [start, end]; a window without samples takes the
    last sample up to ASOF_US before its end (slow metrics are read every few ms only)."""
    n = len(starts)
    if len(ts) == 0:
        nan = np.full(n, np.nan)
        return _Reduced(nan, nan.copy(), nan.copy(), np.zeros(n, dtype=np.int64))
    lo = np.searchsorted(ts, starts, side="left")
    hi = np.searchsorted(ts, ends, side="right")
    count = hi - lo
    sums = np.concatenate(([0.0], np.cumsum(values)))
    padded = np.append(values, np.nan)
    bounds = np.stack([lo, hi], axis=1).ravel()
    mins = np.minimum.reduceat(padded, bounds)[::2]
    maxs = np.maximum.reduceat(padded, bounds)[::2]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (sums[hi] - sums[lo]) / count
    empty = count == 0
    last = np.clip(hi - 1, 0, len(ts) - 1)
    asof = empty & (hi > 0) & (ts[last] >= starts - ASOF_US)
    for array in (mean, mins, maxs):
        array[empty] = np.nan
        array[asof] = values[last[asof]]
    return _Reduced(mean, mins, maxs, count)


def throughput_gbs(ts: np.ndarray, total: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Bytes moved within each window (counters interpolated at its edges) / window, in GB/s."""
    if len(ts) < 2:
        return np.full(len(starts), np.nan)
    inside = (starts >= ts[0]) & (ends <= ts[-1]) & (ends > starts)
    moved = np.interp(ends, ts, total) - np.interp(starts, ts, total)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = moved / (ends - starts) / 1e3
    return np.where(inside, rate, np.nan)


def reason_fraction(gpu_rows: pd.DataFrame, starts: np.ndarray, ends: np.ndarray, mask: int) -> np.ndarray:
    ts, reasons = series(gpu_rows, "clock_reasons")
    flagged = ((reasons.astype(np.int64) & mask) != 0).astype(np.float64)
    reduced = reduce(ts, flagged, starts, ends)
    return np.where(reduced.count > 0, reduced.mean, np.nan)


def step_windows(steps: list[StepRow], base_us: float) -> tuple[np.ndarray, np.ndarray]:
    starts = np.array([s.startUs for s in steps], dtype=np.float64) + base_us
    return starts, starts + np.array([s.durationUs for s in steps], dtype=np.float64)


def step_statistics(
    metrics: pd.DataFrame, steps: list[StepRow], gpu: int, *, base_us: float = 0.0
) -> dict[str, list[float]]:
    """Per-step hardware statistics of one GPU for RankSummary.hardware, one value per step.

    `base_us` (RankSummary.traceBaseUs) turns the steps' trace times into Unix epoch µs.

    Keys (a key is left out when some step has no value for it):
    smClockMHzMean, smClockMHzMin, gpuUtilPctMean, gpuUtilPctMin, powerWMean, powerWMin,
    temperatureCMean, temperatureCMin (samples inside the step; slow metrics fall back to their
    last sample before the step), pcieGBs, nvlinkGBs (TX+RX bytes moved during the step / step
    time, all NVLink links together), throttleFraction, powerThrottleFraction,
    thermalThrottleFraction (share of samples in the step with such clock-event reasons).
    """
    if not steps or metrics.empty:
        return {}
    gpu_rows = metrics[metrics["gpu"] == gpu]
    starts, ends = step_windows(steps, base_us)
    out: dict[str, np.ndarray] = {}
    for column, key in (
        ("sm_clock_mhz", "smClockMHz"),
        ("gpu_util_pct", "gpuUtilPct"),
        ("power_w", "powerW"),
        ("temperature_c", "temperatureC"),
    ):
        reduced = reduce(*series(gpu_rows, column), starts, ends)
        out[f"{key}Mean"], out[f"{key}Min"] = reduced.mean, reduced.min
    for kind in ("pcie", "nvlink"):
        out[f"{kind}GBs"] = throughput_gbs(*counter(gpu_rows, kind), starts, ends)
    for key, mask in (
        ("throttleFraction", THROTTLE_REASONS),
        ("powerThrottleFraction", POWER_REASONS),
        ("thermalThrottleFraction", THERMAL_REASONS),
    ):
        out[key] = reason_fraction(gpu_rows, starts, ends, mask)
    return {key: [round(float(v), 4) for v in values] for key, values in out.items() if not np.isnan(values).any()}
