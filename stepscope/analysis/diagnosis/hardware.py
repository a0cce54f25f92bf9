"""GPU hardware metrics (the sidecar's gpu-metrics.csv.gz) joined to the captured steps.

Pure functions over columnar data; no torch, no pynvml. The file's `ts_us` is Unix epoch
microseconds, the clock of a Kineto trace's `ts` + `baseTimeNanoseconds` / 1000: a StepRow's
window (`startUs` + RankSummary.traceBaseUs, `durationUs`) selects the samples of that step.

Ranks map to a metrics file by RankSummary.pod (the `metrics` dict is keyed by pod; a single
file serves every rank when there is only one) and to a GPU by RankSummary.gpu, or localRank
when gpu is -1.
"""
from __future__ import annotations

import gzip
import io
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from stepscope.analysis.model import Finding, RankSummary, StepRow
from stepscope.gpu_metrics import POWER_REASONS, THERMAL_REASONS, THROTTLE_REASONS

REQUIRED_COLUMNS = ("ts_us", "gpu")
ASOF_US = 1_000_000  # a slow metric's last sample up to this long before a step stands for it
THROTTLED_FRACTION = 0.2  # share of samples with a throttle reason that makes a throttled GPU
LOW_CLOCK_RATIO = 0.9  # an unthrottled SM clock under this share of the peers' median is low
SLOW_LINK_RATIO = 0.5  # throughput below this share of the peers' median is a slow link
MIN_PEER_LINK_GBS = 0.1  # below this the peers hardly used the link: nothing to compare
UTIL_OUTLIER_POINTS = 15.0  # utilization this many points under the median is an outlier
UTIL_OUTLIER_RATIO = 0.8
COUNTER_BIN_US = 1_000
MAX_COUNTER_EVENTS = 200_000

# Well-known XIDs (NVIDIA's XID catalogue); the others are reported by number.
XID_MEANING = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup after an error", 48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remapping", 64: "ECC page retirement or row remapper failure",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}
CRITICAL_XIDS = {48, 62, 64, 74, 79, 92, 94, 95, 119, 120}


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


# -- per-GPU columns ---------------------------------------------------------------------------------


def _series(gpu_rows: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(ts, value) of one column where it was measured."""
    if column not in gpu_rows.columns:
        return np.empty(0), np.empty(0)
    values = gpu_rows[column].to_numpy()
    keep = ~np.isnan(values)
    return gpu_rows["ts_us"].to_numpy()[keep], values[keep]


def _counter(gpu_rows: pd.DataFrame, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(ts, cumulative bytes) of all TX+RX counters of `kind` ("pcie" or "nvlink")."""
    if kind == "pcie":
        columns, scale = [c for c in ("pcie_tx_bytes", "pcie_rx_bytes") if c in gpu_rows.columns], 1.0
    else:
        columns, scale = [c for c in gpu_rows.columns if c.startswith("nvlink") and c.endswith("_kib")], 1024.0
    if not columns:
        return np.empty(0), np.empty(0)
    values = gpu_rows[columns].to_numpy()
    keep = ~np.isnan(values).all(axis=1)
    return gpu_rows["ts_us"].to_numpy()[keep], np.nan_to_num(values[keep]).sum(axis=1) * scale


@dataclass
class _Reduced:
    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray
    count: np.ndarray


def _reduce(ts: np.ndarray, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> _Reduced:
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


def _throughput_gbs(ts: np.ndarray, total: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Bytes moved within each window (counters interpolated at its edges) / window, in GB/s."""
    if len(ts) < 2:
        return np.full(len(starts), np.nan)
    inside = (starts >= ts[0]) & (ends <= ts[-1]) & (ends > starts)
    moved = np.interp(ends, ts, total) - np.interp(starts, ts, total)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = moved / (ends - starts) / 1e3
    return np.where(inside, rate, np.nan)


def _reason_fraction(gpu_rows: pd.DataFrame, starts: np.ndarray, ends: np.ndarray, mask: int) -> np.ndarray:
    ts, reasons = _series(gpu_rows, "clock_reasons")
    flagged = ((reasons.astype(np.int64) & mask) != 0).astype(np.float64)
    reduced = _reduce(ts, flagged, starts, ends)
    return np.where(reduced.count > 0, reduced.mean, np.nan)


def _step_windows(steps: list[StepRow], base_us: float) -> tuple[np.ndarray, np.ndarray]:
    starts = np.array([s.startUs for s in steps], dtype=np.float64) + base_us
    return starts, starts + np.array([s.durationUs for s in steps], dtype=np.float64)


def step_statistics(metrics: pd.DataFrame, steps: list[StepRow], gpu: int, *, base_us: float = 0.0) -> dict[str, list[float]]:
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
    starts, ends = _step_windows(steps, base_us)
    out: dict[str, np.ndarray] = {}
    for column, key in (("sm_clock_mhz", "smClockMHz"), ("gpu_util_pct", "gpuUtilPct"), ("power_w", "powerW"), ("temperature_c", "temperatureC")):
        reduced = _reduce(*_series(gpu_rows, column), starts, ends)
        out[f"{key}Mean"], out[f"{key}Min"] = reduced.mean, reduced.min
    for kind in ("pcie", "nvlink"):
        out[f"{kind}GBs"] = _throughput_gbs(*_counter(gpu_rows, kind), starts, ends)
    for key, mask in (("throttleFraction", THROTTLE_REASONS), ("powerThrottleFraction", POWER_REASONS), ("thermalThrottleFraction", THERMAL_REASONS)):
        out[key] = _reason_fraction(gpu_rows, starts, ends, mask)
    return {key: [round(float(v), 4) for v in values] for key, values in out.items() if not np.isnan(values).any()}


# -- cross-rank findings -----------------------------------------------------------------------------


@dataclass
class _RankHardware:
    """One rank's GPU over its captured steps."""
    rank: int
    pod: str
    gpu: int
    smClockMHz: float = np.nan
    # Shares of the samples in its steps with any / a power / a thermal throttle reason.
    throttledShare: float = 0.0
    powerShare: float = 0.0
    thermalShare: float = 0.0
    temperatureMaxC: float = np.nan
    powerW: float = np.nan
    utilPct: float = np.nan
    linkGBs: dict[str, float] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"rank {self.rank} ({self.pod or 'this node'} GPU {self.gpu})"


def _windows(summary: RankSummary, gpu_rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The rank's step windows; the whole recording when the summary has no steps."""
    if summary.steps:
        return _step_windows(summary.steps, summary.traceBaseUs)
    ts = gpu_rows["ts_us"].to_numpy()
    return (ts[:1].astype(np.float64), ts[-1:].astype(np.float64)) if len(ts) else (np.empty(0), np.empty(0))


def _communication_us(summary: RankSummary, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Time the rank spent in collectives in each window: the steps' communication time, else its
    collectives' total spread over the windows, else the windows themselves."""
    per_step = np.array([s.communicationUs for s in summary.steps], dtype=np.float64)
    if len(per_step) == len(starts) and per_step.sum() > 0:
        return per_step
    total = sum(c.sumUs for c in summary.collectives)
    return np.full(len(starts), total / len(starts)) if total > 0 else ends - starts


def _rank_hardware(summary: RankSummary, gpu: int, gpu_rows: pd.DataFrame) -> _RankHardware:
    starts, ends = _windows(summary, gpu_rows)
    hw = _RankHardware(summary.rank, summary.pod, gpu)
    if len(starts) == 0:
        return hw
    span = (starts[:1], ends[-1:])
    weights = ends - starts

    def mean(column: str) -> float:
        reduced = _reduce(*_series(gpu_rows, column), starts, ends)
        ok = ~np.isnan(reduced.mean)
        return float(np.average(reduced.mean[ok], weights=weights[ok])) if ok.any() else np.nan

    hw.smClockMHz = mean("sm_clock_mhz")
    hw.powerW = mean("power_w")
    hw.temperatureMaxC = float(_reduce(*_series(gpu_rows, "temperature_c"), *span).max[0])
    # Utilization samples come at the driver's own period (up to 1/6 s): average over the span.
    hw.utilPct = float(_reduce(*_series(gpu_rows, "gpu_util_pct"), *span).mean[0])
    for attr, mask in (("throttledShare", THROTTLE_REASONS), ("powerShare", POWER_REASONS), ("thermalShare", THERMAL_REASONS)):
        fraction = _reason_fraction(gpu_rows, starts, ends, mask)
        ok = ~np.isnan(fraction)
        setattr(hw, attr, float(np.average(fraction[ok], weights=weights[ok])) if ok.any() else 0.0)
    comm_us = _communication_us(summary, starts, ends)
    for kind in ("pcie", "nvlink"):
        ts, total = _counter(gpu_rows, kind)
        if len(ts) < 2:
            continue
        moved = np.interp(ends, ts, total) - np.interp(starts, ts, total)
        inside = (starts >= ts[0]) & (ends <= ts[-1])
        if inside.any() and comm_us[inside].sum() > 0:
            hw.linkGBs[kind] = float(moved[inside].sum() / comm_us[inside].sum()) / 1e3
    return hw


def _placement(summary: RankSummary, metrics: dict[str, pd.DataFrame]) -> tuple[str, int] | None:
    """(metrics key, GPU) the rank ran on: its pod's file (the only file when there is one) and
    RankSummary.gpu, else localRank, else the file's only GPU."""
    pod = summary.pod if summary.pod in metrics else next(iter(metrics)) if len(metrics) == 1 else None
    if pod is None:
        return None
    gpu = summary.gpu if summary.gpu >= 0 else summary.localRank
    if gpu < 0:
        gpus = metrics[pod]["gpu"].unique()
        if len(gpus) != 1:
            return None
        gpu = int(gpus[0])
    return pod, gpu


def _ghz(mhz: float) -> str:
    return f"{mhz / 1000:.2f} GHz"


def _clock_cost(mhz: float, peers_mhz: float) -> float:
    """A compute-bound step's share lost to a slower SM clock (0 where the peers' clock is unknown)."""
    return max(0.0, 1.0 - mhz / peers_mhz) if peers_mhz > 0 else 0.0


def _cause(hw: _RankHardware) -> str:
    if hw.thermalShare >= THROTTLED_FRACTION and hw.thermalShare >= hw.powerShare:
        return "thermal"
    if hw.powerShare >= THROTTLED_FRACTION:
        return "power"
    return "hardware slowdown"


def _throttle_findings(ranks: list[_RankHardware], explain: dict[int, list[str]]) -> list[Finding]:
    throttled = [r for r in ranks if r.throttledShare >= THROTTLED_FRACTION]
    if not throttled:
        return []
    calm = [r.smClockMHz for r in ranks if r.throttledShare < THROTTLED_FRACTION and not np.isnan(r.smClockMHz)]
    peers = float(np.median(calm)) if calm else np.nan
    out = []
    for cause in ("thermal", "power", "hardware slowdown"):
        group = sorted((r for r in throttled if _cause(r) == cause), key=lambda r: r.smClockMHz)
        if not group:
            continue
        parts = []
        for r in group:
            clock = f"SM clock {_ghz(r.smClockMHz)}" + (f" against {_ghz(peers)} on its peers" if not np.isnan(peers) else "")
            measure = {"thermal": (r.temperatureMaxC, "°C"), "power": (r.powerW, "W")}.get(cause)
            reason = f"{cause} throttling" + (f" ({measure[0]:.0f} {measure[1]})" if measure and not np.isnan(measure[0]) else "")
            explain[r.rank].append(f"{clock}, {reason}")
            parts.append(f"{r.where}: {clock}, {reason} during {100 * r.throttledShare:.0f} % of the captured steps")
        slowed = not np.isnan(peers) and group[0].smClockMHz < 0.9 * peers
        message = f"GPU clock throttling ({cause}): " + "; ".join(parts[:5]) + (f"; and {len(parts) - 5} more" if len(parts) > 5 else "")
        out.append(Finding("critical" if slowed else "warning", "hardware", [r.rank for r in group], message, _clock_cost(group[0].smClockMHz, peers)))
    return out


def _low_clock_findings(ranks: list[_RankHardware], explain: dict[int, list[str]]) -> list[Finding]:
    """SM clock well below the peers' with no throttle reason: clocks locked or set lower
    (nvidia-smi -lgc / -ac), which NVML does not report as throttling."""
    calm = [r for r in ranks if r.throttledShare < THROTTLED_FRACTION and not np.isnan(r.smClockMHz)]
    low: list[tuple[_RankHardware, str, float]] = []
    for r in calm:
        others = [o.smClockMHz for o in calm if o is not r]
        peers = float(np.median(others)) if len(others) >= 2 else np.nan
        if not np.isnan(peers) and r.smClockMHz < LOW_CLOCK_RATIO * peers:
            text = f"SM clock {_ghz(r.smClockMHz)} against {_ghz(peers)} on its peers with no throttle reason"
            explain[r.rank].append(text)
            low.append((r, text, _clock_cost(r.smClockMHz, peers)))
    if not low:
        return []
    message = "GPU clock below its peers' (locked or lowered clocks, e.g. nvidia-smi -lgc): " + "; ".join(f"{r.where}: {t}" for r, t, _ in low[:5])
    return [Finding("warning", "hardware", [r.rank for r, _, _ in low], message, max(cost for _, _, cost in low))]


def _link_findings(ranks: list[_RankHardware], explain: dict[int, list[str]]) -> list[Finding]:
    out = []
    for kind, label in (("nvlink", "NVLink"), ("pcie", "PCIe")):
        measured = [r for r in ranks if kind in r.linkGBs]
        if len(measured) < 2:
            continue
        values = np.array([r.linkGBs[kind] for r in measured])
        slow = []
        for r, value in zip(measured, values):
            peers = float(np.median(values[[m is not r for m in measured]]))
            if peers >= MIN_PEER_LINK_GBS and value < SLOW_LINK_RATIO * peers:
                text = f"{label} {value:.1f} GB/s during collectives against {peers:.1f} GB/s on its peers"
                explain[r.rank].append(text)
                slow.append((r, text, 1.0 - value / peers))
        if slow:
            message = f"slow {label}: " + "; ".join(f"{r.where}: {text}" for r, text, _ in slow[:5])
            # Scored like the trace's bus-bandwidth finding: the share of the peers' throughput missing.
            out.append(Finding("warning", "hardware", [r.rank for r, _, _ in slow], message, max(cost for _, _, cost in slow)))
    return out


def _utilization_findings(ranks: list[_RankHardware], explain: dict[int, list[str]]) -> list[Finding]:
    measured = [r for r in ranks if not np.isnan(r.utilPct)]
    if len(measured) < 2:
        return []
    values = np.array([r.utilPct for r in measured])
    median = float(np.median(values))
    low = [r for r in measured if r.utilPct < median - UTIL_OUTLIER_POINTS and r.utilPct < UTIL_OUTLIER_RATIO * median]
    if not low:
        return []
    for r in low:
        explain[r.rank].append(f"GPU utilization {r.utilPct:.0f} % against a median of {median:.0f} %")
    spread = f"GPU utilization min {values.min():.0f} % / median {median:.0f} % / max {values.max():.0f} % across {len(measured)} workers"
    lows = ", ".join(f"{r.where} at {r.utilPct:.0f} %" for r in sorted(low, key=lambda r: r.utilPct)[:5])
    return [Finding("warning", "hardware", [r.rank for r in low], f"{spread}; {lows}", max(1.0 - r.utilPct / median for r in low))]


def _fault_findings(summaries: list[RankSummary], metrics: dict[str, pd.DataFrame], explain: dict[int, list[str]]) -> list[Finding]:
    """ECC and XID events per GPU, whichever rank (if any) ran on it."""
    owners: dict[tuple[str, int], list[int]] = {}
    for s in summaries:
        place = _placement(s, metrics)
        if place is not None:
            owners.setdefault(place, []).append(s.rank)
    out = []
    for pod, frame in metrics.items():
        for gpu, rows in frame.groupby("gpu", sort=True):
            gpu = int(gpu)
            ranks = owners.get((pod, gpu), [])
            where = f"{pod or 'this node'} GPU {gpu}" + (f" (rank {', '.join(map(str, ranks))})" if ranks else "")
            _, xids = _series(rows, "xid")
            for code in sorted(set(int(x) for x in xids)):
                meaning = XID_MEANING.get(code, "see NVIDIA's XID catalogue")
                text = f"XID {code} ({meaning})"
                out.append(Finding("critical" if code in CRITICAL_XIDS else "warning", "hardware", ranks, f"{where}: {text} during the capture"))
                for rank in ranks:
                    explain[rank].append(text)
            for column, label, severity in (("ecc_dbe", "uncorrectable (double-bit) ECC errors", "critical"),
                                            ("ecc_sbe", "corrected (single-bit) ECC errors", "warning")):
                _, counts = _series(rows, column)
                if len(counts) == 0:
                    continue
                new = float(counts.max() - counts[0])
                if new > 0 or (severity == "critical" and counts.max() > 0):
                    total = f"{new:.0f} new during the capture, {counts.max():.0f} since the driver loaded"
                    out.append(Finding(severity, "hardware", ranks, f"{where}: {label}: {total}"))
                    for rank in ranks:
                        explain[rank].append(label)
    return out


def findings(summaries: list[RankSummary], metrics: dict[str, pd.DataFrame]) -> tuple[list[Finding], dict[int, str]]:
    """Hardware findings across ranks, and per-rank explanations for the slow-worker finding.

    `metrics` maps pod name -> read_metrics() frame. Made: clock throttling (power, thermal, HW
    slowdown) during the captured steps; an SM clock under 0.9x the peers' with no throttle
    reason (locked clocks); NVLink/PCIe throughput during collectives (bytes moved
    in the step windows / the rank's communication time) under half the peers' median; GPU
    utilization outliers (PerfTracker's min/median/max across workers); XID events and ECC
    errors. The explanations read like "SM clock 1.10 GHz against 1.98 GHz on its peers, thermal
    throttling (91 °C)".
    """
    explain: dict[int, list[str]] = {s.rank: [] for s in summaries}
    ranks: list[_RankHardware] = []
    for summary in summaries:
        place = None if summary.error else _placement(summary, metrics)
        if place is None:
            continue
        frame = metrics[place[0]]
        gpu_rows = frame[frame["gpu"] == place[1]]
        if not gpu_rows.empty:
            ranks.append(_rank_hardware(summary, place[1], gpu_rows))
    found = _throttle_findings(ranks, explain) + _low_clock_findings(ranks, explain) + _link_findings(ranks, explain)
    found += _utilization_findings(ranks, explain)
    found += _fault_findings(summaries, metrics, explain)
    return found, {rank: "; ".join(parts) for rank, parts in explain.items() if parts}


# -- Perfetto counter tracks -------------------------------------------------------------------------

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
            tracks.append((f"{label} {name}", *_changes(*_series(rows, column))))
        ts, reasons = _series(rows, "clock_reasons")
        tracks.append((f"{label} throttled", *_changes(ts, ((reasons.astype(np.int64) & THROTTLE_REASONS) != 0).astype(np.float64))))
        for kind, name in (("pcie", "PCIe"), ("nvlink", "NVLink")):
            ts, total = _counter(rows, kind)
            if len(ts) and total.any():
                tracks.append((f"{label} {name} (GB/s)", *_binned_rate_gbs(ts, total, COUNTER_BIN_US)))
    budget = max(2, MAX_COUNTER_EVENTS // max(1, len(tracks)))
    for name, ts, values in tracks:
        ts, values = _thin(ts, values, budget)
        events.extend({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": round(float(t) - base_us, 3),
                       "args": {"value": round(float(v), 3)}} for t, v in zip(ts, values))
    return events
