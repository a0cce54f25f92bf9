"""A deterministic simulated GPU node, for tests and benchmarks where no GPU is lent.

Every value is a function of the time the call is made (and of the configuration), so a run can
be checked against what the simulation was told to do: a training loop of `step_us` steps whose
last `comm_fraction` is communication (link counters grow only then), optionally with one GPU
throttled (power or thermal, SM clock lowered), a GPU whose clock is locked lower with no throttle
reason, one GPU on a slow NVLink or PCIe link, a GPU at low utilization, an XID event and ECC
errors that appear `event_after_us` into the run.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable, Literal, Mapping, Sequence

from stepscope.sidecar.nvml_api import (
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_VOL_TOTAL,
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    FI_PCIE_COUNT_RX_BYTES,
    FI_PCIE_COUNT_TX_BYTES,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    BackendError,
    DeviceInfo,
    UtilizationKind,
)

SM_CLOCK_MHZ = 1980.0
THROTTLED_SM_CLOCK_MHZ = 1100.0
MEM_CLOCK_MHZ = 2619.0
PCIE_BYTES_PER_US = 8_000.0  # 8 GB/s while communicating
NVLINK_KIB_PER_US = 20e9 / 1024 / 1e6  # 20 GB/s per link while communicating
SLOW_LINK_FACTOR = 0.2
HEALTHY_UTIL_PCT = 97.0
_NVLINK_FIELDS = (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX)

Throttle = Literal["power", "thermal"]
SlowLink = Literal["nvlink", "pcie"]


class SimulatedBackend:
    """N simulated GPUs of one pod, configured per GPU index."""

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
        self._gpus = gpus
        self._nvlinks = nvlinks
        self._throttle = dict(throttle or {})
        self._slow_link = dict(slow_link or {})
        self._low_util = dict(low_util or {})
        self._locked_clock = dict(locked_clock_mhz or {})
        self._xid = dict(xid or {})
        self._ecc = dict(ecc or {})
        self._event_after_us = event_after_us
        self.step_us = step_us
        self._comm_us = step_us * comm_fraction
        self._util_sample_us = util_sample_us
        self._clock_ns = clock_ns
        self.origin_us = origin_us if origin_us is not None else clock_ns() // 1000
        self._error_every = error_every
        self._clock_calls = 0
        self._xid_sent: set[int] = set()
        self._lock = threading.Lock()

    def _now_us(self) -> int:
        return self._clock_ns() // 1000

    def step_windows(self, first: int, count: int) -> list[tuple[int, float, float]]:
        """(step, start Unix µs, duration µs) of simulated steps, to build matching RankSummaries."""
        return [(s, float(self.origin_us + s * self.step_us), float(self.step_us)) for s in range(first, first + count)]

    def _comm_time_us(self, t_us: int) -> float:
        """Time spent communicating between the origin and t_us."""
        elapsed = max(0, t_us - self.origin_us)
        full, within = divmod(elapsed, self.step_us)
        return full * self._comm_us + max(0.0, within - (self.step_us - self._comm_us))

    def _check(self, gpu: int) -> None:
        if not 0 <= gpu < self._gpus:
            raise BackendError(f"no simulated GPU {gpu}")

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(i, f"GPU-sim-{i:04d}", "Simulated H100", self._nvlinks) for i in range(self._gpus)]

    def clocks_mhz(self, gpu: int) -> tuple[float, float]:
        self._check(gpu)
        with self._lock:
            self._clock_calls += 1
            failing = self._error_every and self._clock_calls % self._error_every == 0
        if failing:
            raise BackendError("simulated NVML failure")
        sm = THROTTLED_SM_CLOCK_MHZ if gpu in self._throttle else self._locked_clock.get(gpu, SM_CLOCK_MHZ)
        return sm, MEM_CLOCK_MHZ

    def clock_event_reasons(self, gpu: int) -> int:
        self._check(gpu)
        return {"power": REASON_SW_POWER_CAP, "thermal": REASON_SW_THERMAL, None: 0}[self._throttle.get(gpu)]

    def power_w(self, gpu: int) -> float:
        self._check(gpu)
        if self._throttle.get(gpu) == "power":
            return 400.0
        return 610.0 + 5 * gpu

    def temperature_c(self, gpu: int) -> float:
        self._check(gpu)
        return 91.0 if self._throttle.get(gpu) == "thermal" else 62.0 + gpu

    def memory_used_bytes(self, gpu: int) -> int:
        self._check(gpu)
        return 61 << 30

    def _util(self, gpu: int) -> float:
        return self._low_util.get(gpu, HEALTHY_UTIL_PCT)

    def utilization(self, gpu: int) -> tuple[float, float]:
        self._check(gpu)
        return self._util(gpu), 45.0

    def utilization_samples(self, gpu: int, kind: UtilizationKind, since_us: int) -> list[tuple[int, float]]:
        self._check(gpu)
        value = self._util(gpu) if kind == "gpu" else 45.0
        period = self._util_sample_us
        first = max(self.origin_us, since_us + 1)
        k0 = -(-(first - self.origin_us) // period)
        k1 = (self._now_us() - self.origin_us) // period
        return [(self.origin_us + k * period, value) for k in range(k0, k1 + 1)]

    def field_values(self, gpu: int, fields: Sequence[tuple[int, int]]) -> list[float]:
        self._check(gpu)
        now = self._now_us()
        comm = self._comm_time_us(now)
        slow = self._slow_link.get(gpu)
        nvlink = float(int(comm * NVLINK_KIB_PER_US * (SLOW_LINK_FACTOR if slow == "nvlink" else 1.0)))
        pcie = float(int(comm * PCIE_BYTES_PER_US * (SLOW_LINK_FACTOR if slow == "pcie" else 1.0)))
        sbe, dbe = self._ecc.get(gpu, (0, 0)) if now >= self.origin_us + self._event_after_us else (0, 0)
        device = {FI_PCIE_COUNT_TX_BYTES: pcie, FI_PCIE_COUNT_RX_BYTES: pcie, FI_ECC_SBE_VOL_TOTAL: float(sbe), FI_ECC_DBE_VOL_TOTAL: float(dbe)}
        links = self._nvlinks
        return [(nvlink if scope < links else math.nan) if field in _NVLINK_FIELDS else device.get(field, math.nan) for field, scope in fields]

    def xid_events(self) -> list[tuple[int, int]]:
        if self._now_us() < self.origin_us + self._event_after_us:
            return []
        with self._lock:
            due = [(gpu, code) for gpu, code in self._xid.items() if gpu not in self._xid_sent]
            self._xid_sent.update(gpu for gpu, _ in due)
        return due

    def close(self) -> None:
        pass
