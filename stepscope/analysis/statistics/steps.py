"""Profiler steps and the per-step tables: HTA's temporal breakdown and the Ascend step table.

GPU events belong to the step in which their launching CPU call started (HTA's add_iteration
rule), so a kernel that runs after its step's CPU side ended still counts for its step. Per-step
unions are computed for all steps at once by shifting each step's intervals to its own stretch of
the time axis.
"""
from __future__ import annotations

import numpy as np

from stepscope.analysis.loading.trace import STEP_RE, Trace

from ..model import StepRow
from . import intervals
from .gpu_scope import COMM, COMP, DEFAULT_COMM_KERNELS, CommKernels, gpu_filter_mask, name_types


def step_spans(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step numbers, starts, ends) of the ProfilerStep#N spans on the CPU, sorted by start."""
    numbers = {i: int(m.group(1)) for i, n in enumerate(trace.names) if (m := STEP_RE.search(n))}
    if not numbers:
        return np.empty(0, np.int64), np.empty(0), np.empty(0)
    codes = np.fromiter(numbers, dtype=np.int64)
    rows = np.flatnonzero(trace.name_mask(lambda n: STEP_RE.search(n) is not None) & (trace.stream == -1)
                          & ~trace.cat_mask("gpu_user_annotation"))
    step_of_code = np.full(len(trace.names), -1, dtype=np.int64)
    step_of_code[codes] = list(numbers.values())
    step = step_of_code[trace.name[rows]]
    # One span per step number: the longest (a step annotation can be repeated on other threads).
    order = np.lexsort((-trace.dur[rows], step))
    step, rows = step[order], rows[order]
    first = np.concatenate([[True], step[1:] != step[:-1]])
    step, rows = step[first], rows[first]
    by_start = np.argsort(trace.ts[rows], kind="stable")
    step, rows = step[by_start], rows[by_start]
    return step, trace.ts[rows], np.maximum(trace.ts[rows] + trace.dur[rows], trace.ts[rows])


def launch_times(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """When each GPU row was launched: the start of the CPU event with its correlation, else its own start."""
    cpu = np.flatnonzero(~gpu_filter_mask(trace) & (trace.correlation >= 0))
    wanted = trace.correlation[rows]
    if len(cpu) == 0:
        return trace.ts[rows]
    j = intervals.lookup(trace.correlation[cpu], wanted)
    return np.where((j >= 0) & (wanted >= 0), trace.ts[cpu[j]], trace.ts[rows])


def _per_step_union(seg: np.ndarray, ts: np.ndarray, end: np.ndarray, offset: float,
                    n: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    ms, me = intervals.merge(ts + seg * offset, end + seg * offset)
    lengths = np.bincount((ms // offset).astype(np.int64), weights=me - ms, minlength=n) if len(ms) else np.zeros(n)
    return lengths, (ms, me)


def step_rows(trace: Trace, spans: tuple[np.ndarray, np.ndarray, np.ndarray],
              comm: CommKernels = DEFAULT_COMM_KERNELS) -> list[StepRow]:
    """The step tables for the spans step_spans() found; no spans make the whole trace step 0."""
    numbers, starts, ends = spans
    if len(numbers) == 0:
        t0 = float(trace.ts.min())
        numbers, starts, ends = np.array([0]), np.array([t0]), np.array([float(trace.end.max())])
    n = len(numbers)
    gpu = trace.device_rows()
    launched = launch_times(trace, gpu)
    seg = np.searchsorted(starts, launched, side="right") - 1
    inside = (seg >= 0) & (launched < ends[np.maximum(seg, 0)])
    gpu, seg = gpu[inside], seg[inside]
    types = name_types(trace, comm)[trace.name[gpu]]
    t0 = min(float(trace.ts.min()), float(starts.min()))
    ts = trace.ts[gpu] - t0
    end = np.maximum(ts + trace.dur[gpu], ts)
    offset = float(max(end.max() if len(end) else 0.0, (ends - t0).max())) + 1.0
    busy, _ = _per_step_union(seg, ts, end, offset, n)
    span_lo = np.full(n, np.inf)
    span_hi = np.full(n, -np.inf)
    np.minimum.at(span_lo, seg, ts)
    np.maximum.at(span_hi, seg, end)
    span = np.where(np.isfinite(span_lo), span_hi - span_lo, 0.0)
    comp = types == COMP
    communicating = types == COMM
    computing, comp_set = _per_step_union(seg[comp], ts[comp], end[comp], offset, n)
    communication, comm_set = _per_step_union(seg[communicating], ts[communicating], end[communicating], offset, n)
    times, running, seconds = intervals.sweep([comp_set, comm_set])
    both = running == 3
    overlapped = np.bincount((times[both] // offset).astype(np.int64), weights=seconds[both], minlength=n) \
        if both.any() else np.zeros(n)
    idle = np.maximum(span - busy, 0.0)  # float sums of fractional times may go a hair below 0
    duration = ends - starts
    comm_only = communication - overlapped
    has_gpu = len(gpu) > 0
    return [StepRow(step=int(numbers[i]), startUs=float(starts[i]), durationUs=float(duration[i]),
                    idleUs=float(idle[i]), computeUs=float(computing[i]),
                    nonComputeUs=float(max(span[i] - computing[i] - idle[i], 0.0)),
                    computingUs=float(computing[i]), commNotOverlappedUs=float(comm_only[i]),
                    overlappedUs=float(overlapped[i]), communicationUs=float(communication[i]),
                    freeUs=float(max(duration[i] - computing[i] - comm_only[i], 0.0)) if has_gpu else 0.0)
            for i in range(n)]
