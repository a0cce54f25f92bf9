"""The training thread's scheduler times at each captured step boundary (Linux's schedstat: time on
a CPU and time waiting in the run queue), the time its cgroup's CPU limit throttled it, and the
time its process was stopped, written into the trace for the diagnosis. Elsewhere (no /proc, a
kernel without schedstats, no cgroup CPU controller, no stop_watch library) nothing of that is
recorded."""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path

from .vocabulary import wire

log = logging.getLogger(__name__)

# stop_watch.c, built by `make` (or the Dockerfile) beside this module and copied with it into the
# pod's bootstrap folder.
STOP_WATCH_LIBRARY = Path(__file__).with_name("_stop_watch.so")
# Its thread's sleep: it costs about 0.5 % of a CPU while a capture runs (a wake-up every 2 ms), and
# a stop shorter than it is seen in part only (a host's stops last milliseconds or longer).
STOP_WATCH_SLICE_NS = 2_000_000

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


def _read_schedstat(path: str) -> tuple[int, int] | None:
    """A thread's time on a CPU and waiting in the run queue so far, in ns."""
    try:
        with open(path, "rb") as f:
            cpu, delay = f.read(128).split()[:2]
        return int(cpu), int(delay)
    except (OSError, ValueError):
        return None


class StopWatch:
    """The process's stop_watch thread (stop_watch.c), from a capture's start to its end."""

    def __init__(self, library: ctypes.CDLL, native_tid: int) -> None:
        self.library = library
        self.path = f"/proc/{os.getpid()}/task/{native_tid}/schedstat"

    @classmethod
    def start(cls) -> StopWatch | None:
        """None where the library is not built, cannot be loaded here or its thread cannot start."""
        if not STOP_WATCH_LIBRARY.exists():
            return None
        try:
            library = ctypes.CDLL(str(STOP_WATCH_LIBRARY))
            library.stop_watch_start.restype = ctypes.c_int64
            library.stop_watch_start.argtypes = [ctypes.c_int64]
            library.stop_watch_late_ns.restype = ctypes.c_int64
            library.stop_watch_stop.restype = None
        except (OSError, AttributeError) as e:
            # An image whose C library is older than the one it was built against, for one.
            log.info("stepscope agent: no stop watch (%s); the process's stops are not recorded", e)
            return None
        native_tid = library.stop_watch_start(STOP_WATCH_SLICE_NS)
        return cls(library, native_tid) if native_tid > 0 else None

    def read(self) -> tuple[int, int] | None:
        """How late its thread woke so far, and how long it waited in the run queue, in ns."""
        late = int(self.library.stop_watch_late_ns())
        sched = _read_schedstat(self.path)
        return None if sched is None else (late, sched[1])

    def stop(self) -> None:
        self.library.stop_watch_stop()


class SchedClock:
    """Reads one thread's counters; any thread may call `mark`, the step boundaries' caller."""

    def __init__(self, native_tid: int, throttle: tuple[str, str, int] | None = None) -> None:
        self.path = f"/proc/{os.getpid()}/task/{native_tid}/schedstat"
        self.throttle = throttle
        self.stops: StopWatch | None = None
        self.marks: list[list[int]] = []
        self.throttled: list[list[int]] = []
        self.stopped: list[list[int]] = []

    @classmethod
    def of_this_thread(cls) -> SchedClock | None:
        try:
            with open(f"/proc/{os.getpid()}/cgroup", "rb") as f:
                throttle = throttle_stat(f.read(65536).decode("utf-8", "replace"))
        except OSError:
            throttle = None
        clock = cls(threading.get_native_id(), throttle)
        if clock.read() is None:
            return None
        clock.stops = StopWatch.start()
        return clock

    def read(self) -> tuple[int, int] | None:
        return _read_schedstat(self.path)

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
        if self.stops is not None:
            stopped = self.stops.read()
            if stopped is not None:
                self.stopped.append([step, *stopped])

    def close(self) -> None:
        """Stops the stop watch's thread; the counters read so far stay."""
        if self.stops is not None:
            self.stops.stop()
            self.stops = None

    def metadata(self) -> dict[str, dict]:
        """The trace's top-level entries these counters make, where they span a step at least."""
        counters = {wire.SCHEDSTAT_KEY: self.marks, wire.THROTTLED_KEY: self.throttled, wire.STOPPED_KEY: self.stopped}
        return {key: {"steps": marks} for key, marks in counters.items() if len(marks) >= 2}
