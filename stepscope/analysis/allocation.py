"""How the analysis process allocates memory.

An analysis of thousands of ranks allocates and frees arrays of tens of MB over and over (a column
of millions of rows at a time). By default glibc hands each freed one back to the kernel (munmap,
trim) and numpy asks for transparent huge pages, so every new array is zeroed by the kernel once
more: on a session of 10,240 ranks that took about a third of the diagnosis' time (the kernel's
clear_page). Kept in the process, freed memory is reused as it is, and the peak stays that of the
arrays alive at once."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
# Allocations below this come from the heap, freed ones reused (glibc's ceiling for the threshold
# on 64-bit: a column of 4 million float64).
_MMAP_THRESHOLD = 32 << 20
# Freed memory at the heap's top kept for the next arrays rather than trimmed.
_TRIM_THRESHOLD = 1 << 30
_TOP_PAD = 64 << 20


@functools.cache
def reuse_freed_memory() -> bool:
    """Keep freed memory in this process for the next arrays; True where glibc took the settings
    (elsewhere only numpy's huge pages are turned off)."""
    multiarray = getattr(getattr(np, "_core", None), "multiarray", None)
    hugepages = getattr(multiarray, "_set_madvise_hugepage", None)
    if hugepages is not None:
        hugepages(False)
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return all(
        mallopt(option, value) == 1
        for option, value in (
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD),
            (_M_TOP_PAD, _TOP_PAD),
        )
    )
