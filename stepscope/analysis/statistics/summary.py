"""One rank's trace -> its RankSummary (analysis/model.py), the compact form the edge uploads."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from stepscope.analysis.loading.ascend import TRACE_VIEW, capture_dir, load_capture
from stepscope.analysis.loading.trace import Trace, TraceError, load_trace

from ..model import SUMMARY_VERSION, RankSummary, StepRow
from . import breakdown, intervals
from .collectives import collectives, cpu_time_in
from .critical_path import critical_path, path_summary
from .efficiency import device_of, efficiency
from .gpu_scope import DEFAULT_COMM_KERNELS, CommKernels, gpu_scope
from .gpu_steps import step_statistics
from .kernels import comm_comp_overlap, compute_union, kernel_stats
from .launch import launch_stats, runtime_stats
from .memory_ops import memory_ops
from .operators import operator_stats
from .python_functions import python_functions
from .steps import step_rows, step_spans

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
NO_GPU_EVENTS = "no GPU events"


def rank_from_name(path: str | Path) -> int | None:
    """The rank a raw trace's file name gives (HTA's layout: rank-3.json, trace_rank_3.json.gz)."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def _main_gpu(trace: Trace, gpu_rows: np.ndarray) -> int:
    """Kineto puts GPU events under pid = device index."""
    pids = trace.pid[gpu_rows]
    pids = pids[(pids >= 0) & (pids < 64)]
    return int(np.bincount(pids).argmax()) if len(pids) else -1


def _with_collective_time(trace: Trace, steps: list[StepRow]) -> list[StepRow]:
    """Steps of a trace without GPU events, with the time each spends in collectives."""
    starts = np.array([s.startUs for s in steps])
    covered = cpu_time_in(trace, starts, starts + np.array([s.durationUs for s in steps]))
    for step, us in zip(steps, covered.tolist()):
        step.collectiveUs = us
    return steps


def _step_deltas(table: np.ndarray, step: int, at: dict[int, int]) -> list[int] | None:
    """A counters table's growth over `step` (from its boundary to the next one's), None where a
    boundary is missing or a counter went back."""
    i, j = at.get(step), at.get(step + 1)
    if i is None or j is None:
        return None
    grown = (table[j, 1:] - table[i, 1:]).tolist()
    return grown if min(grown) >= 0 else None


def _with_sched_time(trace: Trace, steps: list[StepRow]) -> list[StepRow]:
    """Steps with their training thread's CPU and run-queue time, the time its cgroup's CPU limit
    throttled it and the time its process was stopped, where the agent recorded the counters as the
    step began and as the next one did."""
    sched, throttled, stopped = trace.schedstat, trace.throttled, trace.stopped
    if len(sched) < 2:
        return steps
    at = {int(step): i for i, step in enumerate(sched[:, 0].tolist())}
    throttled_at = {int(step): i for i, step in enumerate(throttled[:, 0].tolist())}
    stopped_at = {int(step): i for i, step in enumerate(stopped[:, 0].tolist())}
    for row in steps:
        grown = _step_deltas(sched, row.step, at)
        if grown is None:
            continue
        row.cpuUs, row.runDelayUs = grown[0] / 1000.0, grown[1] / 1000.0
        held = _step_deltas(throttled, row.step, throttled_at)
        if held is not None:
            row.throttledUs = min(held[0], grown[1]) / 1000.0
        # The stop watch's lateness less its own wait for a CPU; at most the step.
        late = _step_deltas(stopped, row.step, stopped_at)
        if late is not None:
            row.stoppedUs = min(max(late[0] - late[1], 0), row.durationUs * 1000.0) / 1000.0
    return steps


def summarize(
    trace: Trace,
    *,
    rank: int | None = None,
    pod: str = "",
    node: str = "",
    top: int = 50,
    comm: CommKernels = DEFAULT_COMM_KERNELS,
) -> RankSummary:
    """`top`: kernels of each type and Python functions kept (a diff of two runs wants them all).
    `comm`: the kernels counted as communication (HTA_COMM_KERNELS for HTA's own numbers)."""
    warnings = list(trace.warnings)
    if rank is None:
        rank = trace.rank if trace.rank is not None else rank_from_name(trace.path)
    if rank is None:
        warnings.append("rank unknown (no distributedInfo, none given, none in the file name): taken as 0")
        rank = 0
    spans = step_spans(trace)
    numbers, starts, ends = spans
    if len(numbers) == 0:
        warnings.append("no ProfilerStep in the trace: the whole trace is treated as one step")
        captured = float(trace.end.max() - trace.ts.min())
    else:
        captured = float(ends.max() - starts.min())
    gpu_rows = trace.device_rows()
    has_gpu = len(gpu_rows) > 0
    if not has_gpu:
        warnings.append(f"{NO_GPU_EVENTS}: CPU-only trace (steps, collectives and Python functions only)")
    scope = gpu_scope(trace, comm)
    compute = compute_union(trace, scope)
    gpu_ts = trace.ts[gpu_rows]
    gpu_union = intervals.merge(gpu_ts, np.maximum(gpu_ts + trace.dur[gpu_rows], gpu_ts))
    window_start = float(starts.min()) if len(starts) else float(trace.ts.min())
    busy = intervals.covered(gpu_union, np.array([window_start]), np.array([window_start + captured]))[0]
    gpu = _main_gpu(trace, gpu_rows)
    device = device_of(trace, gpu)
    op_efficiency, kernel_efficiency = efficiency(trace, device, top=top)
    # Over the profiled steps (HTA's annotation "ProfilerStep", all instances), of the rows HTA keeps.
    try:
        path = critical_path(
            trace,
            scope.rows,
            float(starts.min()) if len(numbers) else None,
            float(ends.max()) if len(numbers) else None,
            comm=comm,
        )
    except Exception as exc:  # noqa: BLE001 - a path the trace's graph cannot give must not cost the rank's summary
        path = None
        warnings.append(f"no critical path: {type(exc).__name__}: {exc}")
    return RankSummary(
        version=SUMMARY_VERSION,
        rank=int(rank),
        worldSize=trace.world_size,
        gpu=gpu,
        gpuUuid=trace.gpu_uuid,
        backend=trace.backend,
        pod=pod,
        node=node,
        source=Path(trace.path).name,
        traceBaseUs=trace.base_ns / 1000.0,
        hasGpu=has_gpu,
        capturedUs=captured,
        gpuUtilizationPct=round(100 * float(busy) / captured, 2) if captured > 0 else 0.0,
        steps=_with_sched_time(
            trace, step_rows(trace, spans, comm) if has_gpu else _with_collective_time(trace, step_rows(trace, spans))
        ),
        temporal=breakdown.temporal(trace, scope),
        idle=breakdown.idle(trace, scope),
        kernelTypes=breakdown.kernel_types(trace, scope) if has_gpu else [],
        kernels=kernel_stats(trace, scope, captured, top=top),
        overlapPct=comm_comp_overlap(trace, scope),
        launch=launch_stats(trace, scope),
        memoryOps=memory_ops(trace, compute, captured),
        runtime=runtime_stats(trace, compute, captured),
        collectives=collectives(trace, compute, captured, comm=comm),
        functions=python_functions(trace, gpu_union, captured, top=top, steps=(starts, ends) if len(numbers) else None),
        device=device,
        opEfficiency=op_efficiency,
        kernelEfficiency=kernel_efficiency,
        operators=operator_stats(trace, (starts, ends) if len(numbers) else None, top=top),
        criticalPath=path_summary(trace, path) if path is not None and len(path.weight) else None,
        warnings=warnings,
    )


def summarize_file(
    path: str | Path,
    *,
    rank: int | None = None,
    pod: str = "",
    node: str = "",
    top: int = 50,
    samples: pd.DataFrame | None = None,
    comm: CommKernels = DEFAULT_COMM_KERNELS,
) -> RankSummary:
    """Summarise a trace file; never raises: an unreadable trace gives a summary with `error` set.
    With `samples` (its node's GPU samples, loading.gpu_samples.read_metrics) the summary gets the
    per-step hardware statistics of its GPU."""
    known_rank = rank if rank is not None else rank_from_name(path)
    failed = RankSummary(
        version=SUMMARY_VERSION,
        rank=-1 if known_rank is None else known_rank,
        pod=pod,
        node=node,
        source=Path(path).name,
    )
    try:
        ascend = capture_dir(Path(path)) if Path(path).name == TRACE_VIEW else None
        trace = load_capture(ascend) if ascend is not None else load_trace(path)
    except TraceError as e:
        failed.error = str(e)
        return failed
    try:
        summary = summarize(trace, rank=rank, pod=pod, node=node, top=top, comm=comm)
    except Exception as e:  # noqa: BLE001 - the edge must upload something for every rank, so analysis bugs become errors
        failed.error = f"{path}: analysis failed: {type(e).__name__}: {e}"
        return failed
    if samples is not None and summary.steps and not summary.error:
        try:
            summary.hardware = step_statistics(samples, summary.steps, gpu=summary.gpu, base_us=summary.traceBaseUs)
        except Exception as exc:  # noqa: BLE001 - metrics trouble must not cost the summary
            summary.warnings = [*summary.warnings, f"hardware statistics unavailable: {exc}"]
    return summary
