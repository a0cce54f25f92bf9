"""The NVML sampler's native fast tier (sidecar/nvml/fast_sampler.c), loaded with ctypes.

MetricsRecorder hands the per-round reads (SM and memory clock, clock-event reasons, the batched
field values) and the 10 ms ones (power, temperature, memory used) of every GPU to a C thread
when the backend offers them as C functions (`NvmlBackend.native_reads()`) and the library is
built; Python keeps what queues up in the driver (utilization buffers, XID events) and polled
utilization.
The library is built by `make` (or the Dockerfile) from sidecar/nvml/fast_sampler.c with the machine's
C compiler; without it, or with STEPSCOPE_NATIVE_SAMPLER=0, everything runs in Python.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.sidecar.settings import native_sampler

log = logging.getLogger(__name__)

LIBRARY = Path(__file__).with_name("_fast_sampler.so")
READS = (
    "clocks",
    "clock_reasons",
    "field_values",
    "power",
    "temperature",
    "memory_used",
)  # fast_sampler.c's READ_* order
SPIN_BELOW_US = 1000


class FieldValue(ctypes.Structure):
    """nvmlFieldValue_t; the value union as its 8 raw bytes (the C side reads it by valueType)."""

    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_ulonglong),
    ]


class _Gpu(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("label", ctypes.c_double),
        ("fields", ctypes.POINTER(FieldValue)),
        ("unsupported", ctypes.c_int),
    ]


class _Sampler(ctypes.Structure):
    _fields_ = [
        ("clock_info", ctypes.c_void_p),
        ("reasons", ctypes.c_void_p),
        ("field_values", ctypes.c_void_p),
        ("power", ctypes.c_void_p),
        ("temperature", ctypes.c_void_p),
        ("memory", ctypes.c_void_p),
        ("gpus", ctypes.POINTER(_Gpu)),
        ("n_gpus", ctypes.c_int),
        ("n_fields", ctypes.c_int),
        ("interval_ns", ctypes.c_int64),
        ("epoch_offset_ns", ctypes.c_int64),
        ("spin_below_ns", ctypes.c_int64),
        ("slow_period_ns", ctypes.c_int64),
        ("fields_every", ctypes.c_int64),
        ("ring", ctypes.POINTER(ctypes.c_double)),
        ("row_doubles", ctypes.c_int64),
        ("capacity", ctypes.c_int64),
        ("col_clocks", ctypes.c_int),
        ("col_fields", ctypes.c_int),
        ("col_slow", ctypes.c_int),
        ("stop", ctypes.c_int),
        ("rows", ctypes.c_int64),
        ("rounds", ctypes.c_int64),
        ("dropped", ctypes.c_int64),
        ("cpu_s", ctypes.c_double),
        ("wall_s", ctypes.c_double),
        ("errors", ctypes.c_int64 * len(READS)),
        ("thread", ctypes.c_ulong),
    ]


@dataclass
class NativeReads:
    """What a backend offers the C loop: the addresses of six NVML-shaped C functions
    (nvmlDeviceGetClockInfo, nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetFieldValues,
    nvmlDeviceGetPowerUsage, nvmlDeviceGetTemperature, nvmlDeviceGetMemoryInfo), one device handle
    per GPU (DeviceInfo.index order), and objects the handles point into, which must live as long
    as the sampling does."""

    clock_info: int
    reasons: int
    field_values: int
    power: int
    temperature: int
    memory_info: int
    devices: Sequence[int]
    keep_alive: Any = None


@cache
def library() -> ctypes.CDLL | None:
    """The built library, or None (said once): not built here, or switched off."""
    if native_sampler() == "0":
        log.info("NVML sampler: native fast tier switched off (STEPSCOPE_NATIVE_SAMPLER=0)")
        return None
    if not LIBRARY.is_file():
        log.info("NVML sampler: %s is not built (make builds it with the C compiler); sampling in Python", LIBRARY.name)
        return None
    try:
        lib = ctypes.CDLL(str(LIBRARY))
    except OSError as error:
        log.warning("NVML sampler: cannot load %s (%s); sampling in Python", LIBRARY, error)
        return None
    if lib.ss_sampler_size() != ctypes.sizeof(_Sampler):
        log.warning("NVML sampler: %s does not match this stepscope (rebuild it); sampling in Python", LIBRARY)
        return None
    return lib


def function_address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


class FastTier:
    """The C thread that reads every GPU at every deadline into `ring` (float64 rows, the
    recorder's ring layout). start() begins at once; stop() joins the thread and returns the
    number of rows written (the ring keeps the newest `len(ring)`)."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        reads: NativeReads,
        labels: Sequence[int],
        fields: Sequence[tuple[int, int]],
        interval_us: int,
        slow_period_us: int,
        fields_every: int,
        epoch_offset_ns: int,
        ring: np.ndarray,
        columns: dict[str, int],
    ) -> None:
        self._lib = lib
        self._reads = reads
        self._ring = ring
        self._arrays = []
        gpus = (_Gpu * len(labels))()
        for slot, device, label in zip(gpus, reads.devices, labels):
            array = (FieldValue * len(fields))()
            for value, (field_id, scope_id) in zip(array, fields):
                value.fieldId, value.scopeId = field_id, scope_id
            self._arrays.append(array)
            slot.device, slot.label, slot.fields = device, float(label), ctypes.cast(array, ctypes.POINTER(FieldValue))
        self._gpus = gpus
        s = self._state = _Sampler()
        s.clock_info, s.reasons, s.field_values = reads.clock_info, reads.reasons, reads.field_values
        s.power, s.temperature, s.memory = reads.power, reads.temperature, reads.memory_info
        s.gpus, s.n_gpus, s.n_fields = gpus, len(labels), len(fields)
        s.interval_ns, s.epoch_offset_ns, s.spin_below_ns = interval_us * 1000, epoch_offset_ns, SPIN_BELOW_US * 1000
        s.slow_period_ns, s.fields_every = slow_period_us * 1000, max(1, fields_every)
        s.ring = ring.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
        s.row_doubles, s.capacity = ring.shape[1], ring.shape[0]
        # The C loop writes runs of columns: clocks and reasons, the fields, power to memory used.
        runs = (("sm_clock_mhz", "mem_clock_mhz", "clock_reasons"), ("power_w", "temperature_c", "memory_used_mib"))
        if any([columns[c] - columns[run[0]] for c in run] != [0, 1, 2] for run in runs):
            raise ValueError(f"the ring's columns are not laid out as fast_sampler.c writes them: {columns}")
        s.col_clocks, s.col_fields, s.col_slow = columns["sm_clock_mhz"], columns["pcie_tx_bytes"], columns["power_w"]

    def start(self) -> None:
        if self._lib.ss_start(ctypes.byref(self._state)) != 0:
            raise OSError("cannot start the native sampler thread")

    def stop(self) -> int:
        self._lib.ss_stop(ctypes.byref(self._state))
        return int(self._state.rows)

    def figures(self) -> tuple[int, int, float, float]:
        """(rounds, deadlines dropped, wall s, thread CPU s) of the run stop() ended."""
        state = self._state
        return int(state.rounds), int(state.dropped), float(state.wall_s), float(state.cpu_s)

    def errors(self) -> dict[str, int]:
        return {name: int(count) for name, count in zip(READS, self._state.errors) if count}

    def unsupported(self) -> list[tuple[float, str]]:
        """(GPU label, read) the device refused for good, so the loop stopped asking."""
        return [(gpu.label, name) for gpu in self._gpus for bit, name in enumerate(READS) if gpu.unsupported & 1 << bit]
