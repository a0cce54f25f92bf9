"""NvmlBackend over NVIDIA's Python bindings (nvidia-ml-py, imported as `pynvml`).

Only a real GPU exercises this module (tests/sidecar/nvml marks those tests `gpu`). pynvml is imported
when a backend is made, so the rest of the sidecar imports without it.
"""

from __future__ import annotations

import ctypes
import math
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import stepscope.sidecar.nvml.native as nvml_native
from stepscope.sidecar.nvml.api import BackendError, DeviceInfo, UtilizationKind
from stepscope.sidecar.nvml.native import NativeReads
from stepscope.sidecar.settings import device_visibility

FI_NVLINK_LINK_COUNT = 91
_HIDDEN = {"", "none", "void", "nodevfiles", "-1"}
# nvmlFieldValue_t is 40 bytes: fieldId, scopeId, timestamp and latencyUsec (24 bytes), then
# valueType and nvmlReturn, then the 8-byte value union, read as its nvmlValueType_t says.
_FIELD_HEAD = "24xII"
_VALUE_FORMATS = {0: "d", 1: "I4x", 2: "Q", 3: "Q", 4: "q", 5: "i4x", 6: "H6x"}
# The member of nvmlValue_t each nvmlValueType_t (0..6, NVML's ABI numbers) is read from.
UNION_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def visible_device_ids(env: Mapping[str, str]) -> list[str] | None:
    """The pod's GPUs as CUDA would number them: ids from CUDA_VISIBLE_DEVICES (indices or
    UUIDs), else the UUIDs in NVIDIA_VISIBLE_DEVICES; None means every device NVML sees.

    NVIDIA_VISIBLE_DEVICES indices are the host's and the container runtime has already applied
    them (NVML inside the container sees only those GPUs), so only its UUIDs narrow the set, for a
    sidecar that sees the whole node and is told the training container's GPUs. MIG instance
    UUIDs are kept, so that the backend can say it does not sample them.
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
    uuids = [part.strip() for part in nvidia.split(",") if part.strip().upper().startswith(("GPU-", "MIG-"))]
    return uuids or None


class PynvmlBackend:
    """NVML through pynvml, for the GPUs visible to this pod (see visible_device_ids)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        import pynvml

        self._nvml = pynvml
        self._errors = _Errors(pynvml)
        # The per-round reads fill ctypes values built once per GPU (see _FieldReader); one lock
        # keeps two samplers of one backend from reading each other's half-filled values.
        self._lock = threading.Lock()
        self._field_readers: dict[int, _FieldReader] = {}
        with self._errors:
            pynvml.nvmlInit()
        try:
            self._handles, self._devices = self._resolve(
                visible_device_ids(device_visibility() if env is None else env)
            )
            self._index_of_uuid = {d.uuid: d.index for d in self._devices}
            self._events = self._register_xid_events()
            with self._errors:
                self._clock_calls = [self._prepared_clock_calls(handle) for handle in self._handles]
        except BaseException:
            pynvml.nvmlShutdown()
            raise

    def _resolve(self, wanted: list[str] | None) -> tuple[list[Any], list[DeviceInfo]]:
        nv = self._nvml
        with self._errors:
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        if wanted is None:
            chosen = list(range(len(handles)))
        else:
            chosen = []
            for ident in wanted:
                if ident.upper().startswith("MIG-"):
                    raise BackendError(
                        f"{ident} is a MIG instance: NVML reads clocks, power and link counters per GPU, not per "
                        "instance, and the GPU is shared with other instances, so stepscope samples whole GPUs only"
                    )
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
            with self._errors:
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

    def _prepared_clock_calls(self, handle: Any) -> tuple[_Prepared, _Prepared, _Prepared]:
        nv = self._nvml
        clock = nv._nvmlGetFunctionPointer("nvmlDeviceGetClockInfo")
        try:
            reasons = nv._nvmlGetFunctionPointer("nvmlDeviceGetCurrentClocksEventReasons")
        except nv.NVMLError as error:
            # Renamed from ThrottleReasons in R535: an older driver lacks the new symbol.
            if error.value != nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            reasons = nv._nvmlGetFunctionPointer("nvmlDeviceGetCurrentClocksThrottleReasons")
        return (
            _Prepared(clock, ctypes.c_uint(), handle, ctypes.c_uint(nv.NVML_CLOCK_SM)),
            _Prepared(clock, ctypes.c_uint(), handle, ctypes.c_uint(nv.NVML_CLOCK_MEM)),
            _Prepared(reasons, ctypes.c_ulonglong(), handle),
        )

    def clocks_mhz(self, gpu: int) -> tuple[float, float]:
        sm, mem, _ = self._clock_calls[gpu]
        with self._lock:
            result = sm() or mem()
            if result:
                raise self._errors.convert(self._nvml.NVMLError(result))
            return float(sm.out.value), float(mem.out.value)

    def clock_event_reasons(self, gpu: int) -> int:
        reasons = self._clock_calls[gpu][2]
        with self._lock:
            result = reasons()
            if result:
                raise self._errors.convert(self._nvml.NVMLError(result))
            return int(reasons.out.value)

    def power_w(self, gpu: int) -> float:
        with self._errors:
            return self._nvml.nvmlDeviceGetPowerUsage(self._handles[gpu]) / 1000.0

    def temperature_c(self, gpu: int) -> float:
        with self._errors:
            return float(self._nvml.nvmlDeviceGetTemperature(self._handles[gpu], self._nvml.NVML_TEMPERATURE_GPU))

    def memory_used_bytes(self, gpu: int) -> int:
        with self._errors:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handles[gpu]).used)

    def utilization(self, gpu: int) -> tuple[float, float]:
        with self._errors:
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
            with self._errors:
                raise
        return [(int(s.timeStamp), float(_value(value_type, s.sampleValue))) for s in samples]

    def field_values(self, gpu: int, fields: Sequence[tuple[int, int]]) -> Sequence[float]:
        nv = self._nvml
        with self._errors, self._lock:
            reader = self._field_readers.get(gpu)
            if reader is None or reader.fields is not fields:
                reader = self._field_readers[gpu] = _FieldReader(nv, self._handles[gpu], fields)
            result = reader.call()
            if result != nv.NVML_SUCCESS:
                raise nv.NVMLError(result)
            return reader.values()

    def native_reads(self) -> NativeReads | None:
        """The driver's own C functions and device handles for the native fast tier; None where it is
        switched off (STEPSCOPE_NATIVE_SAMPLER=0) or not built, or the library under pynvml is not a
        C one."""
        if nvml_native.library() is None:
            return None
        if not self._clock_calls:
            return None
        _, _, reasons = self._clock_calls[0]
        lookup = self._nvml._nvmlGetFunctionPointer
        try:
            pointers: tuple[Any, ...] = (
                lookup("nvmlDeviceGetClockInfo"),
                reasons._function,
                lookup("nvmlDeviceGetFieldValues"),
                lookup("nvmlDeviceGetPowerUsage"),
                lookup("nvmlDeviceGetTemperature"),
                lookup("nvmlDeviceGetMemoryInfo"),
            )
            functions = [ctypes.cast(f, ctypes.c_void_p).value or 0 for f in pointers]
            devices = [ctypes.cast(handle, ctypes.c_void_p).value or 0 for handle in self._handles]
        except (AttributeError, TypeError, ctypes.ArgumentError, self._nvml.NVMLError):
            return None  # e.g. the tests' stand-in library, whose functions are Python's
        if not all(functions) or not all(devices):
            return None
        clock_info, clock_reasons, field_values, power, temperature, memory_info = functions
        return NativeReads(
            clock_info,
            clock_reasons,
            field_values,
            power,
            temperature,
            memory_info,
            devices=devices,
            keep_alive=self._handles,
        )

    def xid_events(self) -> list[tuple[int, int]]:
        nv = self._nvml
        if self._events is None:
            return []
        found: list[tuple[int, int]] = []
        while True:
            try:
                data = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError as error:
                if error.value == nv.NVML_ERROR_TIMEOUT:
                    return found
                with self._errors:
                    raise
            index = self._index_of_uuid.get(_text(nv.nvmlDeviceGetUUID(data.device)))
            if index is not None and data.eventType == nv.nvmlEventTypeXidCriticalError:
                found.append((index, int(data.eventData)))

    def close(self) -> None:
        if self._events is not None:
            self._nvml.nvmlEventSetFree(self._events)
            self._events = None
        self._nvml.nvmlShutdown()


class _Errors:
    """A context that raises pynvml's NVMLError as BackendError. A class rather than a
    contextlib generator, which costs more than the NVML call it would wrap."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv

    def convert(self, error: Any) -> BackendError:
        not_supported = error.value in (self._nv.NVML_ERROR_NOT_SUPPORTED, self._nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        return BackendError(str(error), not_supported=not_supported)

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if isinstance(error, self._nv.NVMLError):
            raise self.convert(error) from error


class _Prepared:
    """An NVML C function with its arguments built once, writing its result into `out`: pynvml's
    wrappers look the function up and allocate every argument on each call, which at the
    sampler's rates costs more than the driver call. Calling it returns NVML's return code."""

    def __init__(self, function: Callable[..., int], out: Any, *arguments: Any) -> None:
        self.out = out
        self._arguments = (*arguments, ctypes.byref(out))
        self._function = function

    def __call__(self) -> int:
        return self._function(*self._arguments)


class _FieldReader:
    """nvmlDeviceGetFieldValues for one GPU and one field list, the sampler's hottest call.

    pynvml's wrapper builds a new array and sets each field id through ctypes attributes on every
    call, and reading the union values back attribute by attribute costs as much again (44 µs of
    Python for 12 fields, against 3-5 µs here). The array is built once, the driver fills it in
    place, and one struct.unpack_from reads every (type, return, value).
    The unpack format follows the value types the driver reported; if they ever differ from the
    last call, the format is rebuilt before the values are read.
    """

    def __init__(self, nv: Any, handle: Any, fields: Sequence[tuple[int, int]]) -> None:
        self.fields = fields
        self._array = (nv.c_nvmlFieldValue_t * len(fields))()
        for slot, (field_id, scope_id) in zip(self._array, fields):
            slot.fieldId, slot.scopeId = field_id, scope_id
        self.call = _Prepared(
            nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues"), self._array, handle, ctypes.c_int32(len(fields))
        )
        self._heads = struct.Struct("=" + (_FIELD_HEAD + "8x") * len(fields))
        self._expect((-1,) * len(fields))  # no type yet: the first read builds the real format

    def _expect(self, types: tuple[int, ...]) -> None:
        self._types = types
        self._rows = struct.Struct("=" + "".join(_FIELD_HEAD + _VALUE_FORMATS.get(t, "I4x") for t in types))

    def values(self) -> Sequence[float]:
        row = self._rows.unpack_from(self._array)
        if row[0::3] != self._types:
            self._expect(self._heads.unpack_from(self._array)[0::2])
            row = self._rows.unpack_from(self._array)
        returns, values = row[1::3], row[2::3]
        if any(returns):
            return [value if result == 0 else math.nan for result, value in zip(returns, values)]
        return values


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _value(value_type: int, value: Any) -> float:
    return getattr(value, UNION_MEMBER.get(value_type, "uiVal"))
