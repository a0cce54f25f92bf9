"""NvmlBackend over NVIDIA's Python bindings (nvidia-ml-py, imported as `pynvml`).

Only a real GPU exercises this module (tests/nvml marks those tests `gpu`). pynvml is imported
when a backend is made, so the rest of the sidecar imports without it.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Iterator, Mapping, Sequence

from stepscope.sidecar.nvml_api import BackendError, DeviceInfo, UtilizationKind

FI_NVLINK_LINK_COUNT = 91
_HIDDEN = {"", "none", "void", "nodevfiles", "-1"}


def visible_device_ids(env: Mapping[str, str]) -> list[str] | None:
    """The pod's GPUs as CUDA would number them: ids from CUDA_VISIBLE_DEVICES (indices or
    UUIDs), else the UUIDs in NVIDIA_VISIBLE_DEVICES; None means every device NVML sees.

    NVIDIA_VISIBLE_DEVICES indices are the host's and the container runtime has already applied
    them (NVML inside the container sees only those GPUs), so only its UUIDs narrow the set, for a
    sidecar that sees the whole node and is told the training container's GPUs.
    """
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        if cuda.strip().lower() in _HIDDEN:
            return []
        return [part.strip() for part in cuda.split(",") if part.strip()]
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvidia is None or nvidia.strip().lower() == "all":
        return None
    if nvidia.strip().lower() in _HIDDEN:
        return []
    uuids = [part.strip() for part in nvidia.split(",") if part.strip().upper().startswith("GPU-")]
    return uuids or None


class PynvmlBackend:
    """NVML through pynvml, for the GPUs visible to this pod (see visible_device_ids)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        import pynvml

        self._nvml = pynvml
        self._read_reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        with self._errors():
            pynvml.nvmlInit()
        try:
            self._handles, self._devices = self._resolve(visible_device_ids(os.environ if env is None else env))
            self._index_of_uuid = {d.uuid: d.index for d in self._devices}
            self._events = self._register_xid_events()
        except BaseException:
            pynvml.nvmlShutdown()
            raise

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except self._nvml.NVMLError as error:
            not_supported = error.value in (self._nvml.NVML_ERROR_NOT_SUPPORTED, self._nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            raise BackendError(str(error), not_supported=not_supported) from error

    def _resolve(self, wanted: list[str] | None) -> tuple[list[Any], list[DeviceInfo]]:
        nv = self._nvml
        with self._errors():
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        if wanted is None:
            chosen = list(range(len(handles)))
        else:
            chosen = []
            for ident in wanted:
                if ident.isdigit() and int(ident) < len(handles):
                    chosen.append(int(ident))
                    continue
                matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(ident)]
                if len(matches) != 1:
                    break  # CUDA ignores the rest of the list after an entry it cannot resolve
                chosen.append(matches[0])
        picked = [handles[i] for i in chosen]
        devices = []
        for index, (i, handle) in enumerate(zip(chosen, picked)):
            with self._errors():
                name = _text(nv.nvmlDeviceGetName(handle))
            devices.append(DeviceInfo(index, uuids[i], name, self._nvlink_count(handle)))
        return picked, devices

    def _nvlink_count(self, handle: Any) -> int:
        try:
            value = self._nvml.nvmlDeviceGetFieldValues(handle, [FI_NVLINK_LINK_COUNT])[0]
        except self._nvml.NVMLError:
            return 0
        return int(value.value.uiVal) if value.nvmlReturn == self._nvml.NVML_SUCCESS else 0

    def _register_xid_events(self) -> Any:
        nv = self._nvml
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return None
        for handle in self._handles:
            try:
                if nv.nvmlDeviceGetSupportedEventTypes(handle) & nv.nvmlEventTypeXidCriticalError:
                    nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
            except nv.NVMLError:
                continue  # no XID events from this GPU (e.g. not supported in a VM)
        return events

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def clocks_mhz(self, gpu: int) -> tuple[float, float]:
        nv, handle = self._nvml, self._handles[gpu]
        with self._errors():
            return float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)), float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM))

    def clock_event_reasons(self, gpu: int) -> int:
        nv = self._nvml
        try:
            return int(self._read_reasons(self._handles[gpu]))
        except nv.NVMLError as error:
            # Renamed from ThrottleReasons in R535: an older driver lacks the new symbol.
            if error.value != nv.NVML_ERROR_FUNCTION_NOT_FOUND or self._read_reasons == nv.nvmlDeviceGetCurrentClocksThrottleReasons:
                with self._errors():
                    raise
            self._read_reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons
        with self._errors():
            return int(self._read_reasons(self._handles[gpu]))

    def power_w(self, gpu: int) -> float:
        with self._errors():
            return self._nvml.nvmlDeviceGetPowerUsage(self._handles[gpu]) / 1000.0

    def temperature_c(self, gpu: int) -> float:
        with self._errors():
            return float(self._nvml.nvmlDeviceGetTemperature(self._handles[gpu], self._nvml.NVML_TEMPERATURE_GPU))

    def memory_used_bytes(self, gpu: int) -> int:
        with self._errors():
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handles[gpu]).used)

    def utilization(self, gpu: int) -> tuple[float, float]:
        with self._errors():
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handles[gpu])
        return float(rates.gpu), float(rates.memory)

    def utilization_samples(self, gpu: int, kind: UtilizationKind, since_us: int) -> list[tuple[int, float]]:
        nv = self._nvml
        sampling = nv.NVML_GPU_UTILIZATION_SAMPLES if kind == "gpu" else nv.NVML_MEMORY_UTILIZATION_SAMPLES
        try:
            value_type, samples = nv.nvmlDeviceGetSamples(self._handles[gpu], sampling, since_us)
        except nv.NVMLError as error:
            if error.value == nv.NVML_ERROR_NOT_FOUND:  # no sample newer than since_us yet
                return []
            with self._errors():
                raise
        return [(int(s.timeStamp), float(_value(nv, value_type, s.sampleValue))) for s in samples]

    def field_values(self, gpu: int, fields: Sequence[tuple[int, int]]) -> list[float]:
        nv = self._nvml
        with self._errors():
            values = nv.nvmlDeviceGetFieldValues(self._handles[gpu], list(fields))
        return [float(_value(nv, v.valueType, v.value)) if v.nvmlReturn == nv.NVML_SUCCESS else math.nan for v in values]

    def xid_events(self) -> list[tuple[int, int]]:
        nv = self._nvml
        if self._events is None:
            return []
        found = []
        while True:
            try:
                data = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError as error:
                if error.value == nv.NVML_ERROR_TIMEOUT:
                    return found
                with self._errors():
                    raise
            index = self._index_of_uuid.get(_text(nv.nvmlDeviceGetUUID(data.device)))
            if index is not None and data.eventType == nv.nvmlEventTypeXidCriticalError:
                found.append((index, int(data.eventData)))

    def close(self) -> None:
        if self._events is not None:
            self._nvml.nvmlEventSetFree(self._events)
            self._events = None
        self._nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _value(nv: Any, value_type: int, value: Any) -> float:
    attribute = {
        nv.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    }.get(value_type, "uiVal")
    return getattr(value, attribute)
