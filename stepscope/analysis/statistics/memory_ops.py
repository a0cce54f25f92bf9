"""Memory copies and sets by kind (Memcpy HtoD / DtoH / DtoD, Memset) with bandwidth and PerfTracker's bottleneck ratio."""
from __future__ import annotations

import numpy as np

from stepscope.analysis.loading.trace import MEMCPY_CATS, MEMSET_CATS, Trace

from ..model import MemoryOpStat
from . import intervals

# ROCm names its copies differently.
_ROCM_KINDS = {"CopyHostToDevice": "Memcpy HtoD", "CopyDeviceToHost": "Memcpy DtoH",
               "CopyDeviceToDevice": "Memcpy DtoD", "CopyHostToHost": "Memcpy HtoH", "FillBuffer": "Memset"}


def memory_kind(name: str) -> str:
    """HTA's get_memory_kernel_type ("Memcpy DtoH", "Memset", "Memcpy Unknown")."""
    for prefix, kind in _ROCM_KINDS.items():
        if name.startswith(prefix):
            return kind
    if name[:6] == "Memset":
        return "Memset"
    if name[:6] != "Memcpy":
        return "Memcpy Unknown"
    return name[:11]


def memory_ops(trace: Trace, compute: tuple[np.ndarray, np.ndarray], captured_us: float) -> list[MemoryOpStat]:
    rows = trace.device_rows()
    rows = rows[trace.cat_mask(MEMCPY_CATS + MEMSET_CATS)[rows]]
    if len(rows) == 0:
        return []
    kind_of_code = np.array([memory_kind(n) for n in trace.names])
    labels, idx = np.unique(kind_of_code[trace.name[rows]], return_inverse=True)
    dur, exposed = intervals.outside(compute, trace.ts[rows], trace.dur[rows])
    nbytes = np.maximum(trace.nbytes[rows], 0).astype(np.float64)
    count = np.bincount(idx, minlength=len(labels))
    total = np.bincount(idx, weights=dur, minlength=len(labels))
    total_bytes = np.bincount(idx, weights=nbytes, minlength=len(labels))
    exposed_sum = np.bincount(idx, weights=exposed, minlength=len(labels))
    return sorted((MemoryOpStat(kind=str(labels[i]), count=int(count[i]), sumUs=float(total[i]),
                                bytes=int(total_bytes[i]),
                                bandwidthGBs=float(total_bytes[i] / total[i] / 1e3) if total[i] > 0 else 0.0,
                                bottleneckRatio=float(exposed_sum[i] / captured_us) if captured_us > 0 else 0.0)
                   for i in range(len(labels))), key=lambda m: -m.sumUs)
