"""Kernel launch statistics (HTA's get_cuda_kernel_launch_stats) and CPU-side runtime calls."""
from __future__ import annotations

import numpy as np

from stepscope.analysis.loading.trace import RUNTIME_CATS, Trace

from ..model import LaunchStats, RuntimeStat
from . import intervals
from .gpu_scope import GpuScope

# HTA's launch calls (kernel launches plus, by default, async memcpy/memset).
CUDA_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "runFunction - job_prep_and_submit_for_execution",
                 "cudaMemcpyAsync", "cudaMemsetAsync")
# HTA 0.5.0 knows no HIP names and gives nothing on ROCm traces; these are their counterparts.
HIP_LAUNCHES = ("hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
                "hipLaunchCooperativeKernel", "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpyWithStream",
                "hipMemsetD32Async", "hipMemsetD8Async")
RUNTIME_CUTOFF_US = 50  # HTA: runtime calls longer than this are outliers
LAUNCH_DELAY_CUTOFF_US = 100  # HTA: launch delays longer than this are outliers


def launch_pairs(trace: Trace, scope: GpuScope) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cpu_duration, gpu_duration, launch_delay) for every launch call joined with its GPU event."""
    rows = scope.rows[trace.correlation[scope.rows] != -1]
    launch = trace.name_mask(lambda n: n in CUDA_LAUNCHES or n in HIP_LAUNCHES, rows)
    wanted = np.sort(trace.correlation[rows[launch]])
    stream = trace.stream[rows]
    corr = trace.correlation[rows]
    in_set = np.zeros(len(rows), dtype=bool)
    if len(wanted):
        in_set = wanted[np.minimum(np.searchsorted(wanted, corr), len(wanted) - 1)] == corr
    cpu = rows[in_set & (stream == -1)]
    gpu = rows[in_set & (stream != -1)]
    # Inner join on correlation, every CPU row with every GPU row of the same correlation.
    cpu = cpu[np.argsort(trace.correlation[cpu], kind="stable")]
    cpu_corr = trace.correlation[cpu]
    gpu_corr = trace.correlation[gpu]
    lo = np.searchsorted(cpu_corr, gpu_corr, side="left")
    hi = np.searchsorted(cpu_corr, gpu_corr, side="right")
    count = hi - lo
    gpu_rep = np.repeat(gpu, count)
    offsets = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    cpu_rep = cpu[np.repeat(lo, count) + offsets]
    cpu_dur = trace.dur[cpu_rep]
    delay = np.maximum(trace.ts[gpu_rep] - trace.ts[cpu_rep] - cpu_dur, 0)
    return cpu_dur, trace.dur[gpu_rep], delay


def launch_stats(trace: Trace, scope: GpuScope) -> LaunchStats | None:
    cpu_dur, gpu_dur, delay = launch_pairs(trace, scope)
    if len(delay) == 0:
        return None
    return LaunchStats(
        launches=len(delay),
        launchDelayMedianUs=float(np.median(delay)),
        launchDelayP95Us=float(np.percentile(delay, 95)),
        shortKernels=int(((cpu_dur <= RUNTIME_CUTOFF_US) & (gpu_dur < cpu_dur)).sum()),
        shortKernelThresholdUs=RUNTIME_CUTOFF_US,
        runtimeOutliers=int((cpu_dur > RUNTIME_CUTOFF_US).sum()),
        launchDelayOutliers=int((delay > LAUNCH_DELAY_CUTOFF_US).sum()),
        launchDelayMeanUs=float(delay.mean()),
        cpuDurationMeanUs=float(cpu_dur.mean()),
    )


def runtime_stats(trace: Trace, compute: tuple[np.ndarray, np.ndarray], captured_us: float,
                  top: int = 30) -> list[RuntimeStat]:
    """CUDA/HIP runtime and driver calls by name, with PerfTracker's bottleneck ratio: the call's
    time while no GPU compute runs (a synchronising call waits on the host), over the captured time."""
    rows = np.flatnonzero(trace.cat_mask(RUNTIME_CATS))
    if len(rows) == 0:
        return []
    dur, exposed = intervals.outside(compute, trace.ts[rows], trace.dur[rows])
    names = trace.name[rows]
    count = np.bincount(names, minlength=len(trace.names))
    total = np.bincount(names, weights=dur, minlength=len(trace.names))
    exposed_sum = np.bincount(names, weights=exposed, minlength=len(trace.names))
    order = [i for i in np.argsort(-total, kind="stable")[:top] if count[i] > 0]
    return [RuntimeStat(name=trace.names[int(i)], count=int(count[i]), sumUs=float(total[i]),
                        notOverlappedUs=float(exposed_sum[i]),
                        bottleneckRatio=float(exposed_sum[i] / captured_us) if captured_us > 0 else 0.0)
            for i in order]
