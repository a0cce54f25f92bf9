"""What the NVML sampler needs from a GPU backend.

The sampler (recorder.py) talks to NVML only through `NvmlBackend`, so the same code runs on a
real GPU (pynvml_backend.PynvmlBackend), on the deterministic simulation the tests and benchmarks use
(stepscope/testing/nvml/simulated.py), or on a recording. The field ids, clock-event bits and file columns are the
core's (stepscope.gpu_sample_file), shared with the analysis that reads the file.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

UtilizationKind = Literal["gpu", "memory"]


@dataclass(frozen=True)
class DeviceInfo:
    index: int  # CUDA device index inside the pod
    uuid: str
    name: str
    nvlinks: int = 0


class BackendError(RuntimeError):
    """A backend call failed; `not_supported` means it will never work on this device."""

    def __init__(self, message: str, *, not_supported: bool = False) -> None:
        super().__init__(message)
        self.not_supported = not_supported


class NvmlBackend(Protocol):
    """The NVML calls the sampler makes. `gpu` is DeviceInfo.index. Calls may raise BackendError."""

    def devices(self) -> list[DeviceInfo]:
        """The GPUs visible to this pod, in CUDA index order."""

    def clocks_mhz(self, gpu: int) -> tuple[float, float]:
        """Current SM and memory clock."""

    def clock_event_reasons(self, gpu: int) -> int:
        """nvmlDeviceGetCurrentClocksEventReasons bit mask."""

    def power_w(self, gpu: int) -> float: ...

    def temperature_c(self, gpu: int) -> float: ...

    def memory_used_bytes(self, gpu: int) -> int: ...

    def utilization(self, gpu: int) -> tuple[float, float]:
        """GPU and memory utilization in percent, as polled (nvmlDeviceGetUtilizationRates)."""

    def utilization_samples(self, gpu: int, kind: UtilizationKind, since_us: int) -> list[tuple[int, float]]:
        """The driver's buffered samples (nvmlDeviceGetSamples) newer than since_us: (Unix µs, percent)."""

    def field_values(self, gpu: int, fields: Sequence[tuple[int, int]]) -> Sequence[float]:
        """(field id, scope id) pairs read in one call; NaN where NVML refused that field."""

    def xid_events(self) -> list[tuple[int, int]]:
        """(gpu, XID) critical-error events since the last call; never blocks."""

    def close(self) -> None: ...
