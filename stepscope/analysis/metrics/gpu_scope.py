"""The GPU events HTA 0.5.0 analyses, and its kernel types.

HTA keeps, when the trace has more than one ProfilerStep, only the CPU events that start before
the last step and the GPU events launched by them (matched on correlation; a correlation shared by
several kept CPU events repeats the GPU event, as pandas' merge does). Every GPU metric here is
computed over that scope so that it can be checked against HTA; the last step is usually cut short
by the profiler stopping. (HTA counts the step names of all ranks loaded together; a rank
summarised alone counts its own, which differs only if ranks captured different steps.)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .trace import Trace

COMM, MEM, COMP, OTHER = 0, 1, 2, 3
TYPE_NAMES = {COMM: "COMM", MEM: "MEM", COMP: "COMP", OTHER: "OTHER"}
# HTA's regular expressions (hta/utils/utils.py), applied in the same order.
_COMM_RE = re.compile(r"^nccl.*Kernel")
_MEM_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMP_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
SYNC_NAMES = ("Event Sync", "Context Sync")


def kernel_type(name: str) -> int:
    if _COMM_RE.match(name):
        return COMM
    if _MEM_RE.match(name):
        return MEM
    if not _NOT_COMP_RE.match(name):
        return COMP
    return OTHER


@dataclass
class GpuScope:
    rows: np.ndarray  # trace rows in HTA's scope, GPU events first (repeated as HTA repeats them)
    gpu: np.ndarray  # rows of GPU events in scope (stream != -1), HTA's "gpu_kernels"
    types: np.ndarray  # kernel type of each entry of `gpu`
    filtered: bool  # HTA's step filter applied (more than one ProfilerStep)
    last_step_start: float  # start of the last ProfilerStep when filtered, else +inf


def name_types(trace: Trace) -> np.ndarray:
    """Kernel type of every name code."""
    return np.fromiter((kernel_type(n) for n in trace.names), dtype=np.int8, count=len(trace.names))


def gpu_filter_mask(trace: Trace) -> np.ndarray:
    """HTA's GPUKernelFilter: on a stream with a correlation, or a device-wide synchronisation."""
    sync = trace.name_mask(lambda n: n in SYNC_NAMES)
    return ((trace.stream >= 0) & (trace.correlation >= 0)) | sync


def gpu_scope(trace: Trace) -> GpuScope:
    on_gpu = gpu_filter_mask(trace)
    is_step = trace.name_mask(lambda n: "ProfilerStep" in n)
    if len(np.unique(trace.name[is_step])) <= 1:
        rows = np.arange(len(trace))
        filtered, last_start = False, float("inf")
    else:
        cpu = ~on_gpu
        step_rows = cpu & is_step
        last_start = float(trace.ts[step_rows].max()) if step_rows.any() else float("nan")
        cpu_kept = np.flatnonzero(cpu & (trace.ts < last_start))
        # GPU events have correlations >= 0, so only those CPU correlations can match.
        correlated = trace.correlation[cpu_kept]
        values, counts = np.unique(correlated[correlated >= 0], return_counts=True)
        gpu_rows = np.flatnonzero(on_gpu)
        mult = np.zeros(len(gpu_rows), dtype=np.int64)
        if len(values):
            corr = trace.correlation[gpu_rows]
            pos = np.minimum(np.searchsorted(values, corr), len(values) - 1)
            mult = np.where(values[pos] == corr, counts[pos], 0)
        rows = np.concatenate([np.repeat(gpu_rows, mult), cpu_kept])
        filtered = True
    gpu = rows[trace.stream[rows] != -1]
    return GpuScope(rows=rows, gpu=gpu, types=name_types(trace)[trace.name[gpu]], filtered=filtered,
                    last_step_start=last_start)
