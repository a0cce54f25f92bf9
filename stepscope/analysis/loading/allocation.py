"""How the analysis process allocates memory.

An analysis of thousands of ranks allocates and frees arrays of tens of MB over and over (a column
of millions of rows at a time). By default glibc hands each freed one back to the kernel (munmap,
trim), numpy asks for transparent huge pages and Arrow allocates from an allocator of its own, so
every new array is zeroed by the kernel once more: on a session of 10,240 ranks that took about a
third of the diagnosis' time (the kernel's clear_page). Here every array comes from one allocator
(glibc's, in few arenas, so threads reuse each other's frees) that keeps what is freed for the next
ones; what reading leaves free is given back once, before the diagnosis allocates its own."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import numpy as np
import pyarrow as pa

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8
_SETTINGS = (
    # Allocations below this come from the heap, freed ones reused (glibc's ceiling for the
    # threshold on 64-bit: a column of 4 million float64).
    (_M_MMAP_THRESHOLD, 32 << 20),
    # Freed memory at the heap's top kept for the next arrays rather than trimmed.
    (_M_TRIM_THRESHOLD, 128 << 20),
    (_M_TOP_PAD, 64 << 20),
    # An arena per reading thread would keep each one's frees to itself.
    (_M_ARENA_MAX, 2),
)


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@functools.cache
def reuse_freed_memory() -> bool:
    """Keep freed memory in this process for the next arrays, numpy's and Arrow's alike; True
    where glibc took the settings (elsewhere only numpy's huge pages are turned off)."""
    hugepages = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
    if hugepages is not None:
        hugepages(False)
    libc = _libc()
    if libc is None:
        return False
    pa.set_memory_pool(pa.system_memory_pool())
    return all(libc.mallopt(option, value) == 1 for option, value in _SETTINGS)


def give_back_free_memory() -> None:
    """Return the free memory of the heap to the system: after a phase whose arrays are gone."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
