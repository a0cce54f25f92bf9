"""Hardware findings: the ranks' GPUs over their captured steps, from the sidecar's samples
(loading.gpu_samples), against their peers'.

Ranks map to a samples file by RankSummary.pod (the `metrics` dict is keyed by pod; a single
file serves every rank when there is only one) and to a GPU by RankSummary.gpu, or localRank
when gpu is -1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from stepscope.analysis.model import Finding, RankSummary
from stepscope.analysis.statistics.gpu_steps import counter, reason_fraction, reduce, series, step_windows
from stepscope.gpu_sample_file import POWER_REASONS, THERMAL_REASONS, THROTTLE_REASONS

THROTTLED_FRACTION = 0.2  # share of samples with a throttle reason that makes a throttled GPU
LOW_CLOCK_RATIO = 0.9  # an unthrottled SM clock under this share of the peers' median is low
SLOW_LINK_RATIO = 0.5  # throughput below this share of the peers' median is a slow link
MIN_PEER_LINK_GBS = 0.1  # below this the peers hardly used the link: nothing to compare
UTIL_OUTLIER_POINTS = 15.0  # utilization this many points under the median is an outlier
UTIL_OUTLIER_RATIO = 0.8

# Well-known XIDs (NVIDIA's XID catalogue); the others are reported by number.
XID_MEANING = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup after an error", 48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remapping", 64: "ECC page retirement or row remapper failure",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}
CRITICAL_XIDS = {48, 62, 64, 74, 79, 92, 94, 95, 119, 120}



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
        return step_windows(summary.steps, summary.traceBaseUs)
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
        reduced = reduce(*series(gpu_rows, column), starts, ends)
        ok = ~np.isnan(reduced.mean)
        return float(np.average(reduced.mean[ok], weights=weights[ok])) if ok.any() else np.nan

    hw.smClockMHz = mean("sm_clock_mhz")
    hw.powerW = mean("power_w")
    hw.temperatureMaxC = float(reduce(*series(gpu_rows, "temperature_c"), *span).max[0])
    # Utilization samples come at the driver's own period (up to 1/6 s): average over the span.
    hw.utilPct = float(reduce(*series(gpu_rows, "gpu_util_pct"), *span).mean[0])
    for attr, mask in (("throttledShare", THROTTLE_REASONS), ("powerShare", POWER_REASONS), ("thermalShare", THERMAL_REASONS)):
        fraction = reason_fraction(gpu_rows, starts, ends, mask)
        ok = ~np.isnan(fraction)
        setattr(hw, attr, float(np.average(fraction[ok], weights=weights[ok])) if ok.any() else 0.0)
    comm_us = _communication_us(summary, starts, ends)
    for kind in ("pcie", "nvlink"):
        ts, total = counter(gpu_rows, kind)
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
            _, xids = series(rows, "xid")
            for code in sorted(set(int(x) for x in xids)):
                meaning = XID_MEANING.get(code, "see NVIDIA's XID catalogue")
                text = f"XID {code} ({meaning})"
                out.append(Finding("critical" if code in CRITICAL_XIDS else "warning", "hardware", ranks, f"{where}: {text} during the capture"))
                for rank in ranks:
                    explain[rank].append(text)
            for column, label, severity in (("ecc_dbe", "uncorrectable (double-bit) ECC errors", "critical"),
                                            ("ecc_sbe", "corrected (single-bit) ECC errors", "warning")):
                _, counts = series(rows, column)
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
