"""Per-kernel statistics (HTA's top kernels, PerfTracker's major kernels) and comm/comp overlap."""
from __future__ import annotations

import numpy as np

from stepscope.analysis.loading.trace import Trace

from ..model import KernelStat
from . import intervals
from .gpu_scope import COMM, COMP, TYPE_NAMES, GpuScope


def compute_union(trace: Trace, scope: GpuScope) -> tuple[np.ndarray, np.ndarray]:
    """Union of the compute kernels in scope (negative-length intervals from rounding count as empty)."""
    rows = scope.gpu[scope.types == COMP]
    ts = trace.ts[rows]
    return intervals.merge(ts, np.maximum(ts + trace.dur[rows], ts))


def kernel_stats(trace: Trace, scope: GpuScope, captured_us: float, top: int = 50) -> list[KernelStat]:
    """The `top` kernels by total time of each type (COMP, COMM, MEM), with PerfTracker's columns.

    notOverlappedUs is a kernel's time outside GPU compute: for a compute kernel all of it, for a
    communication or memory kernel the part no compute kernel hides.
    """
    rows = scope.gpu
    if len(rows) == 0:
        return []
    dur = trace.dur[rows]
    clipped, outside = intervals.outside(compute_union(trace, scope), trace.ts[rows], dur)
    exposed = np.where(scope.types == COMP, clipped, outside)
    names = trace.name[rows]
    stats = intervals.group_stats(names, dur)
    exposed_sum = np.bincount(np.searchsorted(stats["key"], names), weights=exposed, minlength=len(stats["key"]))
    code_type = dict(zip(names.tolist(), scope.types.tolist()))
    types = np.array([code_type[int(k)] for k in stats["key"]], dtype=np.int8)
    chosen = []
    for t in np.unique(types):
        idx = np.flatnonzero(types == t)
        chosen.extend(idx[np.argsort(-stats["sum"][idx], kind="stable")[:top]].tolist())
    chosen.sort(key=lambda i: -stats["sum"][i])
    return [KernelStat(name=trace.names[int(stats["key"][i])], type=TYPE_NAMES[int(types[i])],
                       count=int(stats["count"][i]), sumUs=float(stats["sum"][i]), meanUs=float(stats["mean"][i]),
                       medianUs=float(stats["median"][i]), minUs=float(stats["min"][i]), maxUs=float(stats["max"][i]),
                       stdUs=float(stats["std"][i]), notOverlappedUs=float(exposed_sum[i]),
                       bottleneckRatio=float(exposed_sum[i] / captured_us) if captured_us > 0 else 0.0)
            for i in chosen]


def comm_comp_overlap(trace: Trace, scope: GpuScope) -> float | None:
    """HTA's overlap: % of communication time during which a compute kernel also runs; None without communication."""
    ts = trace.ts[scope.gpu]
    end = ts + trace.dur[scope.gpu]
    comm = scope.types == COMM
    if not comm.any():
        return None
    comm_set = intervals.merge(ts[comm], end[comm])
    comp = scope.types == COMP
    total = intervals.length(*comm_set)
    if total == 0:
        return None  # HTA: 0 / 0
    if total < 0:
        return 0.0  # only sub-µs kernels rounded to negative length: no communication time to overlap
    return round(100 * intervals.intersection(comm_set, intervals.merge(ts[comp], end[comp])) / total, 2)
