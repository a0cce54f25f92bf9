"""A deterministic simulated GPU node, for tests and benchmarks where no GPU is lent.

Every value is a function of the time the call is made (and of the configuration), so a run can
be checked against what the simulation was told to do: a training loop of `step_us` steps whose
last `comm_fraction` is communication (link counters grow only then), optionally with one GPU
throttled (power or thermal, SM clock lowered), a GPU whose clock is locked lower with no throttle
reason, one GPU on a slow NVLink or PCIe link, a GPU at low utilization, an XID event and ECC
errors that appear `event_after_us` into the run.
"""

from __future__ import annotations

import ctypes
import math
import operator
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Literal, TypeVar

import stepscope.sidecar.nvml.native as nvml_native
from stepscope.gpu_sample_file import (
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_VOL_TOTAL,
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    FI_PCIE_COUNT_RX_BYTES,
    FI_PCIE_COUNT_TX_BYTES,
    PCIE_COUNTER_WRAP,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
)
from stepscope.sidecar.nvml.api import BackendError, DeviceInfo, UtilizationKind
from stepscope.sidecar.nvml.native import NativeReads

SM_CLOCK_MHZ = 1980.0
THROTTLED_SM_CLOCK_MHZ = 1100.0
MEM_CLOCK_MHZ = 2619.0
PCIE_BYTES_PER_US = 8_000.0  # 8 GB/s while communicating
NVLINK_KIB_PER_US = 20e9 / 1024 / 1e6  # 20 GB/s per link while communicating
SLOW_LINK_FACTOR = 0.2
HEALTHY_UTIL_PCT = 97.0
MEMORY_UTIL_PCT = 45.0
MEMORY_USED_BYTES = 61 << 30
_NVLINK_FIELDS = (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX)
_REASON_BITS = {"power": REASON_SW_POWER_CAP, "thermal": REASON_SW_THERMAL, None: 0}
T = TypeVar("T")

Throttle = Literal["power", "thermal"]
SlowLink = Literal["nvlink", "pcie"]
# The fast reads in C (simulated_nvml.c), built by `make` beside this file.
SIMULATION_LIBRARY = Path(__file__).with_name("_simulated_nvml.so")


@cache
def simulation_library() -> ctypes.CDLL | None:
    """The built C simulation, or None where `make` has not built it."""
    try:
        return ctypes.CDLL(str(SIMULATION_LIBRARY)) if SIMULATION_LIBRARY.is_file() else None
    except OSError:
        return None


class SimGpu(ctypes.Structure):
    """simulated_nvml.c's sim_gpu_t: one simulated GPU as a "device" of the ss_sim_* functions."""

    _fields_ = [
        ("sm_mhz", ctypes.c_double),
        ("mem_mhz", ctypes.c_double),
        ("reasons", ctypes.c_ulonglong),
        ("nvlink_kib_per_us", ctypes.c_double),
        ("pcie_bytes_per_us", ctypes.c_double),
        ("ecc_sbe", ctypes.c_double),
        ("ecc_dbe", ctypes.c_double),
        ("nvlinks", ctypes.c_int),
        ("origin_us", ctypes.c_int64),
        ("step_us", ctypes.c_int64),
        ("event_us", ctypes.c_int64),
        ("comm_us", ctypes.c_double),
        ("power_w", ctypes.c_double),
        ("temperature_c", ctypes.c_double),
        ("memory_used_bytes", ctypes.c_ulonglong),
    ]


class SimulatedBackend:
    """N simulated GPUs of one pod, configured per GPU index.

    Everything that does not depend on time is worked out once here, so a call costs a lookup
    (plus a few operations on the clock for the link counters): the benchmark then measures the
    sampler, not the simulation.
    """

    def __init__(
        self,
        gpus: int = 2,
        *,
        nvlinks: int = 4,
        throttle: Mapping[int, Throttle] | None = None,
        slow_link: Mapping[int, SlowLink] | None = None,
        low_util: Mapping[int, float] | None = None,
        locked_clock_mhz: Mapping[int, float] | None = None,
        xid: Mapping[int, int] | None = None,
        ecc: Mapping[int, tuple[int, int]] | None = None,
        event_after_us: int = 200_000,
        step_us: int = 100_000,
        comm_fraction: float = 0.3,
        util_sample_us: int = 20_000,
        origin_us: int | None = None,
        error_every: int = 0,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        """`origin_us` (Unix µs) is when the simulated training loop's step 0 began (default:
        now); `error_every` > 0 makes every n-th clocks_mhz call fail, to exercise error paths."""
        throttle = dict(throttle or {})
        slow_link = dict(slow_link or {})
        low_util = dict(low_util or {})
        locked = dict(locked_clock_mhz or {})
        ecc = dict(ecc or {})
        self._gpus = gpus
        self._nvlinks = nvlinks
        self._xid = dict(xid or {})
        self.step_us = step_us
        self._comm_us = step_us * comm_fraction
        self._compute_us = step_us - self._comm_us
        self._util_sample_us = util_sample_us
        self._clock_ns = clock_ns
        self.origin_us = origin_us if origin_us is not None else clock_ns() // 1000
        self._event_us = self.origin_us + event_after_us
        self._error_every = error_every
        self._clock_calls = 0
        self._xid_sent: set[int] = set()
        self._lock = threading.Lock()
        indices = range(gpus)
        self._clocks = {
            g: (THROTTLED_SM_CLOCK_MHZ if g in throttle else locked.get(g, SM_CLOCK_MHZ), MEM_CLOCK_MHZ)
            for g in indices
        }
        self._reasons = {g: _REASON_BITS[throttle.get(g)] for g in indices}
        self._power = {g: 400.0 if throttle.get(g) == "power" else 610.0 + 5 * g for g in indices}
        self._temperature = {g: 91.0 if throttle.get(g) == "thermal" else 62.0 + g for g in indices}
        self._util = {g: (low_util.get(g, HEALTHY_UTIL_PCT), MEMORY_UTIL_PCT) for g in indices}
        # Per GPU: link counter rates (per µs of communication) and ECC counts once the event is due.
        self._rates = {
            g: (
                NVLINK_KIB_PER_US * (SLOW_LINK_FACTOR if slow_link.get(g) == "nvlink" else 1.0),
                PCIE_BYTES_PER_US * (SLOW_LINK_FACTOR if slow_link.get(g) == "pcie" else 1.0),
                *map(float, ecc.get(g, (0, 0))),
            )
            for g in indices
        }
        # The sampler asks for the same field tuple every round: its layout is resolved once.
        self._layout_for: Sequence[tuple[int, int]] = ()
        self._layout = self._field_layout(())

    def _now_us(self) -> int:
        return self._clock_ns() // 1000

    def step_windows(self, first: int, count: int) -> list[tuple[int, float, float]]:
        """(step, start Unix µs, duration µs) of simulated steps, to build matching RankSummaries."""
        return [(s, float(self.origin_us + s * self.step_us), float(self.step_us)) for s in range(first, first + count)]

    def _lookup(self, table: dict[int, T], gpu: int) -> T:
        try:
            return table[gpu]
        except KeyError:
            raise BackendError(f"no simulated GPU {gpu}") from None

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(i, f"GPU-sim-{i:04d}", "Simulated H100", self._nvlinks) for i in range(self._gpus)]

    def clocks_mhz(self, gpu: int) -> tuple[float, float]:
        clocks = self._lookup(self._clocks, gpu)
        if self._error_every:
            with self._lock:
                self._clock_calls += 1
                failing = self._clock_calls % self._error_every == 0
            if failing:
                raise BackendError("simulated NVML failure")
        return clocks

    def clock_event_reasons(self, gpu: int) -> int:
        return self._lookup(self._reasons, gpu)

    def power_w(self, gpu: int) -> float:
        return self._lookup(self._power, gpu)

    def temperature_c(self, gpu: int) -> float:
        return self._lookup(self._temperature, gpu)

    def memory_used_bytes(self, gpu: int) -> int:
        self._lookup(self._clocks, gpu)
        return MEMORY_USED_BYTES

    def utilization(self, gpu: int) -> tuple[float, float]:
        return self._lookup(self._util, gpu)

    def utilization_samples(self, gpu: int, kind: UtilizationKind, since_us: int) -> list[tuple[int, float]]:
        value = self._lookup(self._util, gpu)[0 if kind == "gpu" else 1]
        period = self._util_sample_us
        first = max(self.origin_us, since_us + 1)
        k0 = -(-(first - self.origin_us) // period)
        k1 = (self._now_us() - self.origin_us) // period
        return [(self.origin_us + k * period, value) for k in range(k0, k1 + 1)]

    def field_values(self, gpu: int, fields: Sequence[tuple[int, int]]) -> list[float]:
        try:
            nvlink_rate, pcie_rate, sbe, dbe = self._rates[gpu]
        except KeyError:
            raise BackendError(f"no simulated GPU {gpu}") from None
        if fields is not self._layout_for:
            self._layout = self._field_layout(fields)
            # Only a tuple can be trusted not to change under the cached layout.
            self._layout_for = fields if isinstance(fields, tuple) else ()
        now = self._clock_ns() // 1000
        # Time spent communicating since the origin: the last comm_fraction of every step.
        full, within = divmod(now - self.origin_us if now > self.origin_us else 0, self.step_us)
        comm = full * self._comm_us + (within - self._compute_us if within > self._compute_us else 0.0)
        if now < self._event_us:
            sbe = dbe = 0.0
        pcie = float(int(comm * pcie_rate) % PCIE_COUNTER_WRAP)  # 32-bit, as a real GPU's
        return list(self._layout((pcie, sbe, dbe, float(int(comm * nvlink_rate)), math.nan)))

    def _field_layout(self, fields: Sequence[tuple[int, int]]) -> Callable[[tuple[float, ...]], tuple[float, ...]]:
        """Picks each asked field from (PCIe bytes, ECC SBE, ECC DBE, NVLink KiB, NaN)."""
        device = {
            FI_PCIE_COUNT_TX_BYTES: 0,
            FI_PCIE_COUNT_RX_BYTES: 0,
            FI_ECC_SBE_VOL_TOTAL: 1,
            FI_ECC_DBE_VOL_TOTAL: 2,
        }
        picks = [
            (3 if scope < self._nvlinks else 4) if field in _NVLINK_FIELDS else device.get(field, 4)
            for field, scope in fields
        ]
        if len(picks) > 1:
            return operator.itemgetter(*picks)
        # itemgetter of one index returns a bare value, not a tuple.
        return lambda choices: tuple(choices[i] for i in picks)

    def native_reads(self) -> NativeReads | None:
        """The fast reads as the C simulation of nvml_native (the same values, from the same
        configuration), so that the native fast tier samples this node too; None where it is not
        built, or where a subclass, error_every or another clock than the system's changes the reads
        in ways the C simulation does not."""
        lib = simulation_library()
        reads = ("clocks_mhz", "clock_event_reasons", "field_values", "power_w", "temperature_c", "memory_used_bytes")
        own = all(getattr(type(self), name) is getattr(SimulatedBackend, name) for name in reads)
        if (
            lib is None
            or nvml_native.library() is None
            or not own
            or self._error_every
            or self._clock_ns is not time.time_ns
        ):
            return None
        gpus = [
            SimGpu(
                sm_mhz=self._clocks[g][0],
                mem_mhz=self._clocks[g][1],
                reasons=self._reasons[g],
                nvlink_kib_per_us=self._rates[g][0],
                pcie_bytes_per_us=self._rates[g][1],
                ecc_sbe=self._rates[g][2],
                ecc_dbe=self._rates[g][3],
                nvlinks=self._nvlinks,
                origin_us=self.origin_us,
                step_us=self.step_us,
                event_us=self._event_us,
                comm_us=self._comm_us,
                power_w=self._power[g],
                temperature_c=self._temperature[g],
                memory_used_bytes=MEMORY_USED_BYTES,
            )
            for g in range(self._gpus)
        ]
        functions = [
            nvml_native.function_address(lib, f"ss_sim_{name}")
            for name in ("clock_info", "reasons", "field_values", "power", "temperature", "memory_info")
        ]
        return NativeReads(*functions, devices=[ctypes.addressof(g) for g in gpus], keep_alive=gpus)

    def xid_events(self) -> list[tuple[int, int]]:
        if self._now_us() < self._event_us:
            return []
        with self._lock:
            due = [(gpu, code) for gpu, code in self._xid.items() if gpu not in self._xid_sent]
            self._xid_sent.update(gpu for gpu, _ in due)
        return due

    def close(self) -> None:
        pass
