"""The training thread's scheduler times at each captured step boundary (Linux's schedstat: time on
a CPU and time waiting in the run queue), written into the trace for the diagnosis. Elsewhere (no
/proc, or a kernel without schedstats) nothing is recorded."""

from __future__ import annotations

import json
import os
import threading

from .vocabulary import wire


class SchedClock:
    """Reads one thread's counters; any thread may call `mark`, the step boundaries' caller."""

    def __init__(self, native_tid: int) -> None:
        self.path = f"/proc/{os.getpid()}/task/{native_tid}/schedstat"
        self.marks: list[list[int]] = []

    @classmethod
    def of_this_thread(cls) -> SchedClock | None:
        clock = cls(threading.get_native_id())
        return clock if clock.read() is not None else None

    def read(self) -> tuple[int, int] | None:
        try:
            with open(self.path, "rb") as f:
                cpu, delay = f.read(128).split()[:2]
            return int(cpu), int(delay)
        except (OSError, ValueError):
            return None

    def mark(self, step: int) -> None:
        if len(self.marks) >= wire.MAX_SCHEDSTAT_STEPS:
            return
        now = self.read()
        if now is not None:
            self.marks.append([step, *now])

    def write_into(self, prof) -> None:
        """Into the trace being recorded (before the profiler stops: torch keeps metadata of the
        running session only)."""
        if len(self.marks) >= 2:
            prof.add_metadata_json(wire.SCHEDSTAT_KEY, json.dumps({"steps": self.marks}))
