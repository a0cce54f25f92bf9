"""HTA's temporal breakdown, idle-time breakdown and kernel-type breakdown (HTA 0.5.0 semantics)."""
from __future__ import annotations

import numpy as np

from stepscope.analysis.loading.trace import KERNEL_CATS, MEMCPY_CATS, MEMSET_CATS, Trace

from ..model import IdleBreakdown, KernelTypeShare, StreamIdle, TemporalBreakdown
from . import intervals
from .gpu_scope import COMM, COMP, MEM, GpuScope, gpu_filter_mask

# HTA's get_idle_time_breakdown default: gaps shorter than this (µs) between kernels that were
# already queued are launch overhead ("kernel wait").
CONSECUTIVE_KERNEL_DELAY_US = 30
# HTA counts these categories (and MTIA's) as kernels in the idle-time breakdown.
IDLE_KERNEL_CATS = KERNEL_CATS + MEMCPY_CATS + MEMSET_CATS + ("mtia_ccp_events",)
# HTA's kernel-type breakdown analyses these types in this order; a segment where several run is
# labelled with all of them.
BREAKDOWN_TYPES = ((COMP, "COMP"), (COMM, "COMM"), (MEM, "MEM"))


def temporal(trace: Trace, scope: GpuScope) -> TemporalBreakdown | None:
    """Idle / compute / non-compute time over the span from the first kernel start to the last end."""
    if len(scope.gpu) == 0:
        return None
    ts = trace.ts[scope.gpu]
    end = ts + trace.dur[scope.gpu]
    comp = scope.types == COMP

    def split(end: np.ndarray) -> tuple[float, float, float, float]:
        ms, me = intervals.merge(ts, end)
        span = float(me[-1] - ms[0])
        idle = span - intervals.length(ms, me)
        compute = intervals.length(*intervals.merge(ts[comp], end[comp]))
        return span, idle, compute, span - compute - idle

    span, idle, compute, non_compute = split(end)
    if min(idle, compute, non_compute) < 0:
        # Inward rounding left sub-µs kernels ending before they start; HTA merges them as they
        # are and fails its own check (non-compute time < 0). Counted as empty, they give a
        # sane split; everywhere else the numbers are HTA's own.
        span, idle, compute, non_compute = split(np.maximum(end, ts))

    def pct(x: float) -> float:
        return round(100 * x / span, 2) if span > 0 else 0.0

    return TemporalBreakdown(idleUs=idle, computeUs=compute, nonComputeUs=non_compute, idlePct=pct(idle),
                             computePct=pct(compute), nonComputePct=pct(non_compute), spanUs=span)


def _runtime_ts(trace: Trace, scope: GpuScope, rows: np.ndarray) -> np.ndarray:
    """Start of the CPU event that launched each GPU row, as HTA's index_correlation finds it.

    HTA links a GPU event to the last CPU event with its correlation; without one the link points
    at the trace's first event (index 0), and a link to an event outside the scope gives NaN.
    """
    cpu = np.flatnonzero(~gpu_filter_mask(trace) & (trace.correlation != -1))
    corr = trace.correlation[cpu]
    order = np.lexsort((cpu, corr))
    corr, cpu = corr[order], cpu[order]
    last = np.concatenate([corr[1:] != corr[:-1], [True]]) if len(corr) else np.empty(0, bool)
    values, runtime_rows = corr[last], cpu[last]
    wanted = trace.correlation[rows]
    out = np.full(len(rows), np.nan)
    if len(values):
        pos = np.minimum(np.searchsorted(values, wanted), len(values) - 1)
        found = values[pos] == wanted
        r = runtime_rows[pos]
        in_scope = trace.ts[r] < scope.last_step_start if scope.filtered else np.ones(len(r), bool)
        out = np.where(found & in_scope, trace.ts[r], np.nan)
    else:
        found = np.zeros(len(rows), bool)
    first_in_scope = not scope.filtered or trace.first_event_ts < scope.last_step_start
    fallback = ~found & (wanted >= 0) & first_in_scope
    out[fallback] = trace.first_event_ts
    return out


def _first_seen(values: np.ndarray) -> np.ndarray:
    """Distinct values in order of first appearance (HTA walks streams as pandas' unique() lists them)."""
    uniq, first = np.unique(values, return_index=True)
    return uniq[np.argsort(first)]


def idle(trace: Trace, scope: GpuScope, delay_us: float = CONSECUTIVE_KERNEL_DELAY_US) -> IdleBreakdown | None:
    """Idle gaps between consecutive kernels of each stream: host wait when the next kernel was
    launched after the previous one ended, kernel wait when shorter than `delay_us`, else other."""
    rows = scope.gpu[trace.cat_mask(IDLE_KERNEL_CATS)[scope.gpu]]
    if len(rows) == 0:
        return None
    stream = trace.stream[rows]
    # HTA sorts each stream's kernels by start with pandas' default (numpy's quicksort) on its
    # int64 column; kernels starting at the same µs then come in that algorithm's order, which
    # decides the gap after each. The same call on the same array in the same order reproduces it.
    order = np.concatenate([np.flatnonzero(stream == s)[np.argsort(trace.ts[rows[stream == s]].astype(np.int64),
                                                                   kind="quicksort")]
                            for s in _first_seen(stream)])
    rows, stream = rows[order], stream[order]
    ts = trace.ts[rows]
    end = ts + trace.dur[rows]
    first = np.concatenate([[True], stream[1:] != stream[:-1]])
    prev_end = np.where(first, np.nan, np.roll(end, 1))
    gap = ts - prev_end
    with np.errstate(invalid="ignore"):
        host = _runtime_ts(trace, scope, rows) > prev_end
        kernel = ~host & (gap < delay_us)
    category = np.where(host, 0, np.where(kernel, 1, 2))
    streams, stream_idx = np.unique(stream, return_inverse=True)
    sums = np.zeros((len(streams), 3))
    np.add.at(sums, (stream_idx, category), np.nan_to_num(gap))
    per_stream = [StreamIdle(stream=int(s), hostWaitUs=float(h), kernelWaitUs=float(k), otherUs=float(o))
                  for s, (h, k, o) in zip(streams, sums)]
    host_us, kernel_us, other_us = sums.sum(axis=0)
    return IdleBreakdown(hostWaitUs=float(host_us), kernelWaitUs=float(kernel_us), otherUs=float(other_us),
                         streams=per_stream)


def kernel_types(trace: Trace, scope: GpuScope) -> list[KernelTypeShare]:
    """Time by kernel type; time where several types run at once gets a combined label (COMP+COMM)."""
    ts = trace.ts[scope.gpu]
    end = ts + trace.dur[scope.gpu]
    sets = [intervals.merge(ts[scope.types == t], end[scope.types == t]) for t, _ in BREAKDOWN_TYPES]
    _, running, seconds = intervals.sweep(sets)
    open_ = running > 0
    labels, idx = np.unique(running[open_], return_inverse=True)
    sums = np.bincount(idx, weights=seconds[open_], minlength=len(labels))
    total = sums.sum()
    shares = []
    for label, value in zip(labels, sums):
        if value == 0:
            continue
        name = "+".join(n for k, (_, n) in enumerate(BREAKDOWN_TYPES) if int(label) & (1 << k))
        shares.append(KernelTypeShare(type=name, sumUs=float(value), pct=round(100 * float(value) / float(total), 1)))
    return sorted(shares, key=lambda s: -s.sumUs)
