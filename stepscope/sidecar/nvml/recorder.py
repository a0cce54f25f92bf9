"""The NVML sampler: one thread that polls the pod's GPUs at a fixed interval during a capture.

Timing: deadlines are absolute (`time.perf_counter_ns`), so the schedule never drifts. Below 1 ms
the thread sleeps until shortly before each deadline (by an estimate of how late `time.sleep`
wakes up on this machine) and spins for the rest; from 1 ms on it only sleeps, so a 1 ms interval
costs little CPU. A round that overruns skips the deadlines it can no longer meet and counts them
as dropped; every row carries the time it was taken, so lateness never misplaces a sample. These
decisions are pure functions over a `Schedule` and the clock (tiers_due, after_round, wake_plan,
refine_late_wake; tests/sidecar/nvml/test_schedule.py); the thread applies them.

Timestamps: `ts_us` is Unix epoch microseconds, the clock PyTorch's Kineto trace uses: a trace's
event time is `ts` (µs) + `baseTimeNanoseconds` / 1000, both on CLOCK_REALTIME (checked with
torch 2.13's profiler: a record_function's ts + base lands within ~0.1 ms of time.time_ns() taken
next to it). Like Kineto, the sampler reads the wall clock once at start and advances it with the
monotonic counter, so a wall-clock step during the capture cannot reorder samples.

Native fast tier: where sidecar/nvml/fast_sampler.c is built and the backend offers its every-round
reads as C functions (nvml_native), a C thread takes the first tier below, on the same schedule,
into a ring of its own; this thread then runs every SLOW_PERIOD_US for the other two.

Three tiers, so that the work of a round stays what must be fresh at that rate:
- every round: SM and memory clock, clock-event reasons and one nvmlDeviceGetFieldValues call with
  the PCIe, NVLink and ECC counters (the counters are cumulative: the analysis needs them paired
  with exact times, and one batched call costs little more than one counter);
- every SLOW_PERIOD_US (10 ms): power, temperature, memory used, and utilization where the driver
  keeps no sample buffer (polled); these change over tens of ms, and steps last longer;
- every BUFFER_PERIOD_US (100 ms) and once when sampling ends: the driver's utilization sample
  buffers (nvmlDeviceGetSamples, rows at the driver's own timestamps) and XID events: both queue
  up in the driver, so reading them less often loses nothing but the XID row's time resolution.
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
import pandas as pd

import stepscope.sidecar.nvml.native as nvml_native
from stepscope.gpu_sample_file import BASE_COLUMNS, nvlink_columns, round_fields
from stepscope.sidecar.nvml.api import BackendError, DeviceInfo, NvmlBackend, UtilizationKind

log = logging.getLogger(__name__)

MIN_INTERVAL_US = 100
SLOW_PERIOD_US = 10_000
BUFFER_PERIOD_US = 100_000
MAX_LATE_WAKE_NS = 150_000
# The share of a core the counters' nvmlDeviceGetFieldValues may take: on an H100 (driver 580) one
# call costs about 260 µs of CPU whatever the number of fields, a quarter of a core at 1 ms, so
# where a call costs more than this share of the interval the rounds read the counters only every
# few rounds. The counters are cumulative: reading them less often costs resolution, not bytes.
FIELDS_CPU_SHARE = 0.02
SLEEP_ONLY_FROM_US = 1000
METRICS_FILE = "gpu-metrics.csv.gz"
FLOAT_COLUMNS = ("power_w", "temperature_c")
NAN = math.nan
_NO_PAIR = (NAN, NAN)  # clocks or utilization not measured
_NO_SLOW = (NAN,) * 5  # the slow columns of a row taken between slow rounds
T = TypeVar("T")
_UTILIZATION_COLUMNS: tuple[tuple[UtilizationKind, str], ...] = (("gpu", "gpu_util_pct"), ("memory", "mem_util_pct"))
# Slots of a GPU's backend methods in MetricsRecorder._calls.
_FIELDS, _CLOCKS, _REASONS, _POWER, _TEMPERATURE, _MEMORY, _UTILIZATION = range(7)


class Schedule(NamedTuple):
    """Where the sampler thread is in its schedule (perf_counter_ns): the next round's deadline,
    when the slow tier and the buffer reads are due next, the interval, and what it achieved."""

    deadline: int
    next_slow: int
    next_buffers: int
    interval_ns: int
    rounds: int = 0
    dropped: int = 0


def tiers_due(s: Schedule) -> tuple[bool, bool]:
    """(slow tier, buffer reads) for the round at s.deadline; the buffers ride on a slow round."""
    slow = s.deadline >= s.next_slow
    return slow, slow and s.deadline >= s.next_buffers


def after_round(s: Schedule, now_ns: int, slow: bool, buffers: bool, poll_every_slow: bool) -> Schedule:
    """The schedule once the round at s.deadline ran and the clock says `now_ns`. Deadlines stay
    absolute, so the schedule never drifts; an overrun skips the deadlines it can no longer meet
    and counts them dropped. `poll_every_slow`: the native tier runs the rounds and this thread
    polls a utilization the driver keeps no buffer of, so it wakes every SLOW_PERIOD_US."""
    deadline = s.deadline
    next_slow = max(s.next_slow + SLOW_PERIOD_US * 1000, deadline) if slow else s.next_slow
    next_buffers = max(s.next_buffers + BUFFER_PERIOD_US * 1000, deadline) if buffers else s.next_buffers
    interval_ns = SLOW_PERIOD_US * 1000 if poll_every_slow else s.interval_ns
    deadline += interval_ns
    dropped = s.dropped
    late = now_ns - deadline
    if late >= interval_ns:
        skipped = late // interval_ns
        dropped += skipped
        deadline += skipped * interval_ns
    return Schedule(deadline, next_slow, next_buffers, interval_ns, s.rounds + 1, dropped)


def wake_plan(remaining_ns: int, late_wake_ns: float, interval_ns: int, sleep_only: bool) -> float:
    """How long to sleep (ns) before a deadline `remaining_ns` away. Below SLEEP_ONLY_FROM_US the
    thread wakes early by its estimate of time.sleep's oversleep and spins the rest; from then on
    it only sleeps: waking some tens of µs late costs nothing there (every row has its exact
    time), while spinning would cost a share of a core."""
    lead = 0.0 if sleep_only else min(late_wake_ns, interval_ns)
    return remaining_ns - lead if remaining_ns > lead else 0.0


def refine_late_wake(late_wake_ns: float, asked_ns: float, slept_ns: int) -> float:
    """The oversleep estimate after a sleep of `asked_ns` took `slept_ns`; one sample's lateness
    is clipped, so that a preempted sleep on a busy node cannot turn into long spins."""
    late = min(max(0, slept_ns - asked_ns), MAX_LATE_WAKE_NS)
    return late_wake_ns + 0.1 * (late - late_wake_ns)


@dataclass
class RecorderStats:
    """What one capture window achieved; `dropped` counts deadlines skipped after an overrun."""

    interval_us: int
    gpus: int = 0
    rounds: int = 0
    dropped: int = 0
    rows: int = 0
    overwritten_rows: int = 0  # oldest rows given up when the ring buffer came round
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the sampler threads
    errors: dict[str, int] = field(default_factory=dict)
    native: bool = False  # the per-round reads ran in the native fast tier (nvml_native)
    fields_every: int = 1  # rounds between two reads of the counters (nvmlDeviceGetFieldValues)
    fields_call_us: float = 0.0  # what one such call cost when sampling started

    @property
    def asked_hz(self) -> float:
        return 1e6 / self.interval_us

    @property
    def achieved_hz(self) -> float:
        return self.rounds / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def achieved_ratio(self) -> float:
        return self.achieved_hz / self.asked_hz

    def describe(self) -> str:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(self.errors.items())) or "none"
        return (
            f"{self.rounds} rounds over {self.gpus} GPU(s) in {self.wall_s:.2f} s: {self.achieved_hz:.0f}/s of "
            f"{self.asked_hz:.0f}/s asked ({100 * self.achieved_ratio:.0f} %), {self.dropped} dropped, "
            f"sampler CPU {100 * self.cpu_s / self.wall_s if self.wall_s else 0:.1f} % of a core "
            f"({'native fast tier' if self.native else 'Python'}), counters every {self.fields_every} round(s) "
            f"({self.fields_call_us:.0f} us a call), errors: {errors}"
        )


class MetricsRecorder:
    """Samples every GPU of `backend` each `interval_us` between start() and stop().

    start() begins sampling at once (call it when the capture is requested: the rounds before the
    first captured step are the leading margin); stop(out_path) keeps sampling `margin_s` longer,
    then writes `out_path` (gzip CSV, columns stepscope.gpu_sample_file.BASE_COLUMNS + NVLink columns) and returns
    it. With `window_us=(first, last)` (Unix µs of the captured steps) stop() keeps only rows
    within `margin_s` of that window; with `gpus` (GPU UUID -> CUDA index in the training
    process) only those GPUs' rows, labelled with that index. Rows live in a ring of `buffer_mib`
    allocated at start(): when a long wait fills it, the oldest rows are given up (counted and
    logged), so a sidecar's memory stays fixed; 128 MiB hold about 90 s of 8 GPUs at 1 ms, 9 s at
    100 µs. Backend errors are counted and logged once per metric, never raised from the sampler
    thread; `stats` says what was achieved. With `native` (the default), a backend that offers its
    per-round reads as C functions (`native_reads()`, see nvml_native) and the library built, the
    every-round tier runs in a C thread into a ring of its own, and this one keeps the others.
    """

    def __init__(
        self,
        backend: NvmlBackend,
        interval_us: int,
        margin_s: float = 1.0,
        *,
        buffer_mib: float = 128.0,
        native: bool = True,
    ) -> None:
        if interval_us < MIN_INTERVAL_US:
            raise ValueError(f"interval_us must be >= {MIN_INTERVAL_US}, got {interval_us}")
        if margin_s < 0:
            raise ValueError(f"margin_s must be >= 0, got {margin_s}")
        self.backend = backend
        self.interval_us = int(interval_us)
        self.margin_s = float(margin_s)
        self.buffer_bytes = int(buffer_mib * (1 << 20))
        self.native = native
        self.stats = RecorderStats(self.interval_us)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("MetricsRecorder is already sampling; stop() it first")
        self._logged: set[str] = set()
        self.stats = RecorderStats(self.interval_us)
        self._devices: list[DeviceInfo] = list(self._call("devices", self.backend.devices) or [])
        self.stats.gpus = len(self._devices)
        links = max((d.nvlinks for d in self._devices), default=0)
        self._columns = BASE_COLUMNS + nvlink_columns(links)
        # The ring keeps xid last, so that a round packs the field values as they come (see
        # _sample_round); _frame puts the columns back in file order.
        self._ring_columns = tuple(c for c in self._columns if c != "xid") + ("xid",)
        self._slot = {name: i for i, name in enumerate(self._ring_columns)}
        # A tuple, so that a backend may resolve its layout once (the simulation does).
        self._fields = tuple(self._field_list(links))
        self.stats.fields_call_us, self.stats.fields_every = self._fields_cost()
        self._round = 0
        backend = self.backend
        # Per GPU, the backend methods each slot (_FIELDS...) is read with; _failed() replaces a
        # method the GPU does not support, so it is asked once and the hot loop checks nothing.
        self._calls: list[tuple[int, list[Callable[..., Any]]]] = [
            (
                device.index,
                [
                    backend.field_values,
                    backend.clocks_mhz,
                    backend.clock_event_reasons,
                    backend.power_w,
                    backend.temperature_c,
                    backend.memory_used_bytes,
                    backend.utilization,
                ],
            )
            for device in self._devices
        ]
        # A ring of rows packed as float64, allocated once: memory stays fixed however long the
        # ranks wait for their steps, and what it gives up when full is the oldest, pre-capture part.
        packer = struct.Struct(f"{len(self._columns)}d")
        self._pack_into, self._row_bytes = packer.pack_into, packer.size
        rows = max(2, self.buffer_bytes // packer.size)
        self._util_seen: dict[tuple[int, UtilizationKind], int] = {}
        self._util_polled: set[tuple[int, UtilizationKind]] = set()
        # Wall clock read once, advanced by the monotonic counter (see the module docstring).
        self._epoch_offset_ns = _epoch_offset_ns()
        # With the native fast tier, Python writes only the slow tiers' rows (a tenth as many at 1 ms).
        self._native = self._start_native(rows - rows // 8)
        self._capacity = max(1, rows // 8) if self._native is not None else rows
        # np.zeros takes fresh zero pages from the OS: memory is touched only as rows arrive.
        self._ring = np.zeros((self._capacity, len(self._columns)))
        self._view = self._ring.data.cast("B")
        self._rows = 0
        self.stats.native = self._native is not None
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="stepscope-nvml", daemon=True)
        self._thread.start()

    def stop(
        self, out_path: Path, *, window_us: tuple[float, float] | None = None, gpus: Mapping[str, int] | None = None
    ) -> Path:
        if self._thread is None:
            raise RuntimeError("MetricsRecorder.stop() without start()")
        self._stopping.wait(self.margin_s)
        self._stopping.set()
        self._thread.join()
        self._thread = None
        native_rows = self._stop_native()
        frame = self._frame(window_us, gpus, native_rows)
        self.stats.rows = len(frame)
        out_path = Path(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_path.with_name(out_path.name + ".tmp")
        frame.to_csv(tmp, index=False, compression={"method": "gzip", "compresslevel": 1})
        tmp.replace(out_path)
        # The session keeps its recorder for status; the rings' memory goes back now.
        self._view.release()
        self._ring = self._native_ring = np.empty((0, len(self._columns)))
        log.info("GPU metrics: %s -> %s", self.stats.describe(), out_path)
        return out_path

    def _start_native(self, rows: int) -> nvml_native.FastTier | None:
        """The native fast tier, sampling into a ring of `rows`, or None (sampling in Python): not
        built, switched off, a backend that offers no C functions (see nvml_native), or a failure."""
        self._native_ring = np.empty((0, len(self._columns)))
        offer = getattr(self.backend, "native_reads", None)
        lib = nvml_native.library() if self.native and offer is not None and self._devices else None
        if lib is None or offer is None:
            return None
        try:
            reads = offer()
            if reads is None:
                return None
            ring = np.zeros((rows, len(self._columns)))
            tier = nvml_native.FastTier(
                lib,
                reads,
                [d.index for d in self._devices],
                self._fields,
                self.interval_us,
                SLOW_PERIOD_US,
                self.stats.fields_every,
                self._epoch_offset_ns,
                ring,
                self._slot,
            )
            tier.start()
        except Exception as error:  # noqa: BLE001 - sampling goes on in Python
            self._log_once("native", "NVML sampler: the native fast tier did not start (%s); sampling in Python", error)
            return None
        self._native_ring = ring
        return tier

    def _stop_native(self) -> int:
        """Joins the native thread (after the Python one: both cover the margin) and takes its
        figures into the stats; the rows it wrote."""
        native = self._native
        if native is None:
            return 0
        rows = native.stop()
        stats = self.stats
        stats.rounds, stats.dropped, stats.wall_s, cpu_s = native.figures()
        stats.cpu_s += cpu_s
        for name, count in native.errors().items():
            stats.errors[name] = stats.errors.get(name, 0) + count
            self._log_once(f"error:{name}", "NVML %s failed %d time(s) in the native fast tier", name, count)
        for gpu, name in native.unsupported():
            self._log_once(f"{name}:{gpu:g}", "GPU %d does not support %s; not sampled", int(gpu), name)
        self._native = None
        return rows

    # -- sampling --------------------------------------------------------------------------------

    def _run(self) -> None:
        # With the native fast tier this thread keeps the buffers (and polled utilization, where a
        # driver keeps no buffer): it wakes up every BUFFER_PERIOD_US, or SLOW_PERIOD_US for that.
        interval_us = BUFFER_PERIOD_US if self._native is not None else self.interval_us
        sleep_only = interval_us >= SLEEP_ONLY_FROM_US
        sample_round = self._slow_round if self._native is not None else self._sample_round
        stopping, clock, sleep = self._stopping, time.perf_counter_ns, time.sleep
        cpu0, wall0 = time.thread_time(), clock()
        schedule = Schedule(wall0, wall0, wall0, interval_us * 1000)
        late_wake_ns = 60_000.0  # estimate of time.sleep's oversleep, refined as it runs
        while not stopping.is_set():
            deadline = schedule.deadline
            asked = wake_plan(deadline - clock(), late_wake_ns, schedule.interval_ns, sleep_only)
            if asked > 0:
                before = clock()
                sleep(asked / 1e9)
                if not sleep_only:
                    late_wake_ns = refine_late_wake(late_wake_ns, asked, clock() - before)
            if not sleep_only:
                while clock() < deadline:
                    pass
            slow, buffers = tiers_due(schedule)
            sample_round(slow)
            if buffers:
                self._read_buffers()
            schedule = after_round(
                schedule, clock(), slow, buffers, self._native is not None and bool(self._util_polled)
            )
        self._read_buffers()  # what queued up since the last read
        self.stats.rounds, self.stats.dropped = schedule.rounds, schedule.dropped
        self.stats.wall_s = (clock() - wall0) / 1e9
        self.stats.cpu_s = time.thread_time() - cpu0

    def _sample_round(self, slow: bool) -> None:
        # The hot path: per GPU one clock read, three backend calls and one packed row, with no
        # wrapper between the loop and the backend (try costs nothing until something raises).
        clock, offset, fields, no_fields = time.perf_counter_ns, self._epoch_offset_ns, self._fields, self._no_fields
        pack_into, view, row_bytes, capacity = self._pack_into, self._view, self._row_bytes, self._capacity
        rows = self._rows
        counters = self._round % self.stats.fields_every == 0
        self._round += 1
        for gpu, calls in self._calls:
            # Each GPU's own time, taken right before its counters are read: the throughput the
            # analysis derives from counter deltas is only as good as this pairing.
            ts_us = (clock() + offset) // 1000
            values = no_fields
            if counters:
                try:
                    values = calls[_FIELDS](gpu, fields)
                except Exception as error:  # noqa: BLE001 - a sampler thread must survive any backend bug
                    values = self._failed(calls, _FIELDS, "field_values", gpu, error, no_fields)
            try:
                sm, mem = calls[_CLOCKS](gpu)
            except Exception as error:  # noqa: BLE001 - as above
                sm, mem = self._failed(calls, _CLOCKS, "clocks", gpu, error, _NO_PAIR)
            try:
                reasons = calls[_REASONS](gpu)
            except Exception as error:  # noqa: BLE001 - as above
                reasons = self._failed(calls, _REASONS, "clock_reasons", gpu, error, NAN)
            slow_values = self._slow_values(gpu, calls) if slow else _NO_SLOW
            pack_into(view, (rows % capacity) * row_bytes, ts_us, gpu, sm, mem, reasons, *slow_values, *values, NAN)
            rows += 1
        self._rows = rows

    def _slow_round(self, slow: bool) -> None:
        """With the native fast tier: utilization where the driver keeps no buffer, in rows of its own."""
        for gpu, calls in self._calls:
            utilization = self._polled_utilization(gpu, calls)
            if utilization is not None:
                self._append(
                    {
                        "ts_us": self._now_us(),
                        "gpu": gpu,
                        "gpu_util_pct": utilization[0],
                        "mem_util_pct": utilization[1],
                    }
                )

    def _slow_values(self, gpu: int, calls: list[Callable[..., Any]]) -> tuple[float, ...]:
        """Power, temperature, memory used (MiB), GPU and memory utilization where polled."""
        power = self._read(calls, _POWER, "power", gpu, NAN)
        temperature = self._read(calls, _TEMPERATURE, "temperature", gpu, NAN)
        used_mib = self._read(calls, _MEMORY, "memory_used", gpu, NAN) // (1 << 20)
        return power, temperature, used_mib, *(self._polled_utilization(gpu, calls) or _NO_PAIR)

    def _polled_utilization(self, gpu: int, calls: list[Callable[..., Any]]) -> tuple[float, float] | None:
        """GPU and memory utilization where the driver keeps no sample buffer (NaN for a kind it
        buffers); None where it buffers both."""
        polled = (gpu, "gpu") in self._util_polled, (gpu, "memory") in self._util_polled
        if not any(polled):
            return None
        utilization = self._read(calls, _UTILIZATION, "utilization", gpu, _NO_PAIR)
        return tuple(value if is_polled else NAN for value, is_polled in zip(utilization, polled))  # type: ignore[return-value]  # two pairs zipped: a pair

    def _read_buffers(self) -> None:
        """The driver's utilization samples (where it keeps them) and XID events since the last read."""
        for gpu, _ in self._calls:
            for kind, column in _UTILIZATION_COLUMNS:
                if (gpu, kind) not in self._util_polled:
                    self._utilization_rows(gpu, kind, column)
        self._xid_rows(self._now_us())

    def _utilization_rows(self, gpu: int, kind: UtilizationKind, column: str) -> None:
        key = (gpu, kind)
        since = self._util_seen.get(key, self._now_us() - BUFFER_PERIOD_US)
        try:
            samples = self.backend.utilization_samples(gpu, kind, since)
        except BackendError as error:
            if error.not_supported:
                # The driver keeps no sample buffer here: poll nvmlDeviceGetUtilizationRates instead.
                self._util_polled.add(key)
                self._log_once(
                    f"utilization_samples:{gpu}:{kind}",
                    "GPU %d: no %s utilization sample buffer (%s); polling it",
                    gpu,
                    kind,
                    error,
                )
                return
            self._count_error("utilization_samples", error)
            return
        except Exception as error:  # noqa: BLE001 - a sampler thread must survive any backend bug
            self._count_error("utilization_samples", error)
            return
        for ts, value in samples:
            self._append({"ts_us": ts, "gpu": gpu, column: value})
            since = max(since, ts)
        self._util_seen[key] = since

    def _xid_rows(self, ts_us: int) -> None:
        events = self._call("xid_events", self.backend.xid_events) or []
        for gpu, code in events:
            self._append({"ts_us": ts_us, "gpu": gpu, "xid": code})
            log.warning("XID %d on GPU %d", code, gpu)

    def _now_us(self) -> int:
        return (time.perf_counter_ns() + self._epoch_offset_ns) // 1000

    def _append(self, values: dict[str, float]) -> None:
        """One row of the given columns, NaN in the others (utilization sample and XID rows)."""
        row = [NAN] * len(self._ring_columns)
        for name, value in values.items():
            row[self._slot[name]] = value
        self._pack_into(self._view, (self._rows % self._capacity) * self._row_bytes, *row)
        self._rows += 1

    # -- backend calls that never raise ---------------------------------------------------------

    def _read(self, calls: list[Callable[..., Any]], slot: int, name: str, gpu: int, default: T) -> T:
        try:
            return calls[slot](gpu)
        except Exception as error:  # noqa: BLE001 - a sampler thread must survive any backend bug
            return self._failed(calls, slot, name, gpu, error, default)

    def _failed(
        self, calls: list[Callable[..., Any]], slot: int, name: str, gpu: int, error: Exception, default: T
    ) -> T:
        """What a failed read records: `default` (not measured); counted and logged once, or, when
        the GPU does not support the metric, never asked again."""
        if isinstance(error, BackendError) and error.not_supported:
            calls[slot] = lambda *_: default
            self._log_once(f"{name}:{gpu}", "GPU %d does not support %s (%s); not sampled", gpu, name, error)
        else:
            self._count_error(name, error)
        return default

    def _call(self, name: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 - a sampler thread must survive any backend bug
            self._count_error(name, error)
            return None

    def _count_error(self, name: str, error: BaseException) -> None:
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
        self._log_once(f"error:{name}", "NVML %s failed: %s (further failures are only counted)", name, error)

    def _log_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    # -- output ----------------------------------------------------------------------------------

    def _fields_cost(self) -> tuple[float, int]:
        """(µs of the cheapest of three nvmlDeviceGetFieldValues calls on the first GPU, rounds
        between two counter reads so that they stay within FIELDS_CPU_SHARE of a core)."""
        if not self._devices or not self._fields:
            return 0.0, 1
        gpu, best = self._devices[0].index, math.inf
        for _ in range(3):
            started = time.perf_counter_ns()
            try:
                self.backend.field_values(gpu, self._fields)
            except Exception:  # noqa: BLE001 - the first round counts and logs what fails
                return 0.0, 1
            best = min(best, (time.perf_counter_ns() - started) / 1000)
        every = max(1, math.ceil(best / (FIELDS_CPU_SHARE * self.interval_us)))
        if every > 1:
            log.info(
                "NVML sampler: nvmlDeviceGetFieldValues costs %.0f us a call here; the PCIe, NVLink and ECC counters "
                "are read every %d rounds (%.1f ms), the clocks every round",
                best,
                every,
                every * self.interval_us / 1000,
            )
        return best, every

    def _field_list(self, links: int) -> list[tuple[int, int]]:
        spec = round_fields(links)
        # _sample_round packs the values as they come, right after the slow columns.
        assert [name for name, _, _ in spec] == list(self._ring_columns[10:-1])
        self._no_fields = [NAN] * len(spec)
        return [(fid, scope) for _, fid, scope in spec]

    def _frame(
        self, window_us: tuple[float, float] | None, gpus: Mapping[str, int] | None, native_rows: int
    ) -> pd.DataFrame:
        values = np.concatenate([self._kept(self._ring, self._rows), self._kept(self._native_ring, native_rows)])
        if self.stats.overwritten_rows:
            log.warning(
                "GPU metrics ring buffer (%d MiB) came round: the oldest %d rows were given up",
                self.buffer_bytes >> 20,
                self.stats.overwritten_rows,
            )
        frame = pd.DataFrame(values, columns=list(self._ring_columns))[list(self._columns)]
        if window_us is not None:
            margin = self.margin_s * 1e6
            frame = frame[(frame["ts_us"] >= window_us[0] - margin) & (frame["ts_us"] <= window_us[1] + margin)]
        if gpus is not None:
            frame = self._as_ranks_see_them(frame, gpus)
        frame = frame.sort_values(["ts_us", "gpu"], kind="stable")
        for column in frame.columns:
            if column not in FLOAT_COLUMNS:
                frame[column] = frame[column].round().astype("Int64")
        return frame.reset_index(drop=True)

    def _kept(self, ring: np.ndarray, rows: int) -> np.ndarray:
        """The rows a ring still holds, oldest first; what it gave up is counted in the stats."""
        capacity = len(ring)
        if rows <= capacity:
            return ring[:rows]
        self.stats.overwritten_rows += rows - capacity
        return np.roll(ring, -(rows % capacity), axis=0)

    def _as_ranks_see_them(self, frame: pd.DataFrame, gpus: Mapping[str, int]) -> pd.DataFrame:
        """Only the rows of the GPUs in `gpus` (UUID -> CUDA index in the training process), labelled
        with that index: a sidecar sees every GPU of the node, the pod's ranks only theirs, and the
        analysis matches rows to a rank by the index its trace names. UUIDs compare without NVML's
        'GPU-' prefix, which torch leaves out."""
        wanted = {_bare_uuid(uuid): index for uuid, index in gpus.items()}
        label = {d.index: wanted[_bare_uuid(d.uuid)] for d in self._devices if _bare_uuid(d.uuid) in wanted}
        missing = sorted(set(wanted) - {_bare_uuid(d.uuid) for d in self._devices})
        if missing:
            self._log_once(
                "gpus:missing",
                "GPU(s) %s of the pod's ranks are not among the GPUs NVML shows this sidecar; "
                "their hardware metrics are missing",
                ", ".join(missing),
            )
        frame = frame[frame["gpu"].isin(list(label))]
        return frame.assign(gpu=frame["gpu"].map(label).astype(float))


def _bare_uuid(uuid: str) -> str:
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def _epoch_offset_ns() -> int:
    """time_ns() - perf_counter_ns(), from the tightest of a few paired reads."""
    best = (1 << 62, 0)  # (width of the read, offset)
    for _ in range(5):
        a = time.perf_counter_ns()
        wall = time.time_ns()
        b = time.perf_counter_ns()
        if b - a < best[0]:
            best = (b - a, wall - (a + b) // 2)
    return best[1]
