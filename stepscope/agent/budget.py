"""The capture budget's measures: the Python calls of one step (the probe before a withStack
capture) and the process's resident memory, and the memory a capture took handed back."""
from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class CallCounter:
    """A sys.setprofile function that counts Python and built-in calls: the events torch's
    Python tracer would record with withStack."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = time.monotonic()
        self.active = True

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1
            if not self.active:  # the session ended on another thread; setprofile is per thread
                sys.setprofile(None)


def rss_mb() -> float:
    """This process's resident memory (Linux); 0 where /proc is missing, which disables the memory bound."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_MB
    except (OSError, ValueError, IndexError):
        return 0.0


PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 4096 / 2**20


def release_memory() -> None:
    """Hand the profiler's freed memory back to the system: glibc keeps freed heap pages, so the
    RSS a capture took would otherwise stay with the training process."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass

