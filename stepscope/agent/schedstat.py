"""The training thread's scheduler times at each captured step boundary (Linux's schedstat: time on
a CPU and time waiting in the run queue), and the time its cgroup's CPU limit throttled it, written
into the trace for the diagnosis. Elsewhere (no /proc, a kernel without schedstats, no cgroup CPU
controller) nothing of that is recorded."""

from __future__ import annotations

import os
import threading

from .vocabulary import wire

# Where a process's cgroup keeps its throttled time: cgroup v2's cpu.stat in µs, v1's in ns.
_V2 = ("/sys/fs/cgroup", "throttled_usec", 1000)
_V1 = (("/sys/fs/cgroup/cpu,cpuacct", "throttled_time", 1), ("/sys/fs/cgroup/cpu", "throttled_time", 1))


def throttle_stat(cgroups: str) -> tuple[str, str, int] | None:
    """The cpu.stat file of the cgroup that `cgroups` (/proc/<pid>/cgroup's text) names, its field
    of throttled time and that field's ns per unit; None where no such file can be read."""
    for line in cgroups.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        places = (_V2,) if controllers == "" else _V1 if "cpu" in controllers.split(",") else ()
        for root, field, scale in places:
            stat = f"{root}{path.rstrip('/')}/cpu.stat"
            if _read_field(stat, field) is not None:
                return stat, field, scale
    return None


def _read_field(path: str, field: str) -> int | None:
    try:
        with open(path, "rb") as f:
            for line in f.read(4096).decode("ascii", "replace").splitlines():
                name, _, value = line.partition(" ")
                if name == field:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


class SchedClock:
    """Reads one thread's counters; any thread may call `mark`, the step boundaries' caller."""

    def __init__(self, native_tid: int, throttle: tuple[str, str, int] | None = None) -> None:
        self.path = f"/proc/{os.getpid()}/task/{native_tid}/schedstat"
        self.throttle = throttle
        self.marks: list[list[int]] = []
        self.throttled: list[list[int]] = []

    @classmethod
    def of_this_thread(cls) -> SchedClock | None:
        try:
            with open(f"/proc/{os.getpid()}/cgroup", "rb") as f:
                throttle = throttle_stat(f.read(65536).decode("utf-8", "replace"))
        except OSError:
            throttle = None
        clock = cls(threading.get_native_id(), throttle)
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
        if self.throttle is not None:
            path, field, scale = self.throttle
            throttled = _read_field(path, field)
            if throttled is not None:
                self.throttled.append([step, throttled * scale])

    def metadata(self) -> dict[str, dict]:
        """The trace's top-level entries these counters make, where they span a step at least."""
        counters = {wire.SCHEDSTAT_KEY: self.marks, wire.THROTTLED_KEY: self.throttled}
        return {key: {"steps": marks} for key, marks in counters.items() if len(marks) >= 2}
