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
from functools import cache, lru_cache

import numpy as np

from stepscope.analysis.loading.trace import Trace

COMM, MEM, COMP, OTHER = 0, 1, 2, 3
TYPE_NAMES = {COMM: "COMM", MEM: "MEM", COMP: "COMP", OTHER: "OTHER"}
# HTA's regular expressions (hta/utils/utils.py), applied in the same order.
_COMM_RE = re.compile(r"^nccl.*Kernel")
_MEM_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMP_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
SYNC_NAMES = ("Event Sync", "Context Sync")
# Communication kernels HTA's regular expression misses (it wants an nccl prefix), as (library,
# pattern searched anywhere in the kernel name). Expert-parallel all-to-alls (DeepEP's dispatch,
# combine and notify kernels, in its public deep_ep:: namespace or an in-house copy's ep::),
# one-sided NVSHMEM kernels, other collective libraries, and kernels their authors named after
# the collective they run. `stepscope analyze --comm-kernel REGEX` adds patterns.
COMM_KERNEL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("DeepEP", r"\b(?:deep_ep|ep)::(?:intranode|internode|internode_ll)::"),
    ("NVSHMEM", r"(?i)nvshmem"),
    ("NCCL", r"^(?:void )?nccl\w*Kernel"),
    ("RCCL", r"(?i)^(?:void )?rccl"),
    ("MSCCL", r"(?i)msccl"),
    ("Gloo", r"(?i)gloo"),
    # Ascend's HCCL operations as an NPU capture's kernel_details.csv names them (hcom_allReduce_...).
    ("HCCL", r"^(?:hcom_|Hcom[A-Z])"),
    ("all-to-all", r"(?i)all_?to_?all|(?<![a-z0-9])a2a(?![a-z0-9])"),
    ("collective", r"(?i)cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter"),
)


@dataclass(frozen=True)
class CommKernels:
    """Which kernels count as communication: HTA's nccl regex, then `patterns` (library, regex).
    CommKernels(()) is HTA's definition, whose numbers the HTA parity checks reproduce."""

    patterns: tuple[tuple[str, str], ...] = COMM_KERNEL_PATTERNS

    def library(self, name: str) -> str | None:
        """The library a communication kernel comes from ("NCCL" for HTA's), None for any other kernel."""
        return _library(self.patterns, name)

    def with_user(self, patterns: list[str]) -> CommKernels:
        """These kernels and the user's own regular expressions (re.error for a bad one)."""
        return CommKernels(self.patterns + tuple(("user", re.compile(p).pattern) for p in patterns))


HTA_COMM_KERNELS = CommKernels(())
DEFAULT_COMM_KERNELS = CommKernels()


@cache
def _compiled(patterns: tuple[tuple[str, str], ...]) -> list[tuple[str, re.Pattern[str]]]:
    return [(label, re.compile(p)) for label, p in patterns]


# A trace's names are classified by several metrics, and a session's ranks share most of them.
@lru_cache(maxsize=1 << 16)
def _library(patterns: tuple[tuple[str, str], ...], name: str) -> str | None:
    if _COMM_RE.match(name):
        return "NCCL"
    for label, pattern in _compiled(patterns):
        if pattern.search(name) and not _MEM_RE.match(name):
            return label
    return None


def kernel_type(name: str, comm: CommKernels = DEFAULT_COMM_KERNELS) -> int:
    if comm.library(name) is not None:
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


def name_types(trace: Trace, comm: CommKernels = DEFAULT_COMM_KERNELS) -> np.ndarray:
    """Kernel type of every name code."""
    return np.fromiter((kernel_type(n, comm) for n in trace.names), dtype=np.int8, count=len(trace.names))


def gpu_filter_mask(trace: Trace) -> np.ndarray:
    """HTA's GPUKernelFilter: on a stream with a correlation, or a device-wide synchronisation."""
    sync = trace.name_mask(lambda n: n in SYNC_NAMES)
    return ((trace.stream >= 0) & (trace.correlation >= 0)) | sync


def gpu_scope(trace: Trace, comm: CommKernels = DEFAULT_COMM_KERNELS) -> GpuScope:
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
    return GpuScope(
        rows=rows,
        gpu=gpu,
        types=name_types(trace, comm)[trace.name[gpu]],
        filtered=filtered,
        last_step_start=last_start,
    )
