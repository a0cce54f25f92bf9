"""A stand-in for libnvidia-ml.so under the real pynvml bindings.

pynvml looks every C function up on its module global `nvmlLib`; this object answers those calls
in Python with the C calling convention pynvml uses (out-parameters through byref, return codes),
so PynvmlBackend and pynvml's own wrappers, structs and error classes run unchanged without a GPU.
Only the functions the backend calls exist: any other lookup fails as a missing symbol would.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import pynvml as nv

from stepscope.sidecar.nvml.pynvml_backend import UNION_MEMBER


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    reasons: int = 0
    power_mw: int = 612_345
    temperature_c: int = 64
    memory_used: int = 61 << 30
    utilization: tuple[int, int] = (93, 41)
    # (µs, percent) in the driver's buffers; None: the device keeps no sample buffer.
    gpu_samples: list[tuple[int, int]] | None = field(default_factory=list)
    mem_samples: list[tuple[int, int]] | None = field(default_factory=list)
    nvlinks: int = 2
    pcie_bytes: int = 10_000_000
    nvlink_kib: int = 5_000
    ecc: tuple[int, int] = (0, 0)
    refused_fields: set[int] = field(default_factory=set)
    # nvmlValueType_t the driver reports per field id (unsigned long long where not given).
    value_types: dict[int, int] = field(default_factory=dict)


def _address(pointer: object) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def _point(pointer: ctypes._Pointer, address: int) -> None:  # type: ignore[name-defined]
    ctypes.memmove(ctypes.addressof(pointer), ctypes.byref(ctypes.c_size_t(address)), ctypes.sizeof(ctypes.c_void_p))


class FakeNvmlLib:
    def __init__(self, gpus: list[FakeGpu], *, init_error: int = nv.NVML_SUCCESS, event_reasons_symbol: bool = True) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.xids: list[tuple[int, int]] = []  # (physical index, XID) waiting in the event set
        self.registered: set[int] = set()
        self.shutdowns = 0
        self.field_calls = 0
        if not event_reasons_symbol:
            self.nvmlDeviceGetCurrentClocksEventReasons = None
        # A plain function, not a method: pynvml sets `restype` on it.
        self.nvmlErrorString = lambda result: f"fake NVML error {result}".encode()

    def __getattribute__(self, name: str) -> object:
        value = object.__getattribute__(self, name)
        if value is None and name.startswith("nvml"):
            raise AttributeError(name)  # a symbol this driver does not export
        return value

    def _gpu(self, handle: object) -> FakeGpu:
        return self.gpus[_address(handle) - 1]

    # -- library ------------------------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> int:
        return self.init_error

    def nvmlShutdown(self) -> int:
        self.shutdowns += 1
        return nv.NVML_SUCCESS

    # -- devices -----------------------------------------------------------------------------------

    def nvmlDeviceGetCount_v2(self, count: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        count._obj.value = len(self.gpus)
        return nv.NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: ctypes.c_uint, handle: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        if index.value >= len(self.gpus):
            return nv.NVML_ERROR_INVALID_ARGUMENT
        _point(handle._obj, index.value + 1)
        return nv.NVML_SUCCESS

    def nvmlDeviceGetUUID(self, handle: object, buffer: ctypes.Array, size: ctypes.c_uint) -> int:
        buffer.value = self._gpu(handle).uuid.encode()
        return nv.NVML_SUCCESS

    def nvmlDeviceGetName(self, handle: object, buffer: ctypes.Array, size: ctypes.c_uint) -> int:
        buffer.value = self._gpu(handle).name.encode()
        return nv.NVML_SUCCESS

    # -- metrics -----------------------------------------------------------------------------------

    def nvmlDeviceGetClockInfo(self, handle: object, kind: ctypes.c_uint, out: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        gpu = self._gpu(handle)
        out._obj.value = {nv.NVML_CLOCK_SM: gpu.sm_mhz, nv.NVML_CLOCK_MEM: gpu.mem_mhz}[kind.value]
        return nv.NVML_SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object, out: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        out._obj.value = self._gpu(handle).reasons
        return nv.NVML_SUCCESS

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetPowerUsage(self, handle: object, out: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        out._obj.value = self._gpu(handle).power_mw
        return nv.NVML_SUCCESS

    def nvmlDeviceGetTemperature(self, handle: object, sensor: ctypes.c_uint, out: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        out._obj.value = self._gpu(handle).temperature_c
        return nv.NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: object, out: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        out._obj.used = self._gpu(handle).memory_used
        return nv.NVML_SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle: object, out: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        out._obj.gpu, out._obj.memory = self._gpu(handle).utilization
        return nv.NVML_SUCCESS

    def nvmlDeviceGetSamples(self, handle: object, kind: ctypes.c_uint, since: ctypes.c_ulonglong, value_type: ctypes._CArgObject,  # type: ignore[name-defined]
                             count: ctypes._CArgObject, samples: ctypes.Array | None) -> int:  # type: ignore[name-defined]
        gpu = self._gpu(handle)
        buffer = gpu.gpu_samples if kind.value == nv.NVML_GPU_UTILIZATION_SAMPLES else gpu.mem_samples
        if buffer is None:
            return nv.NVML_ERROR_NOT_SUPPORTED
        newer = [s for s in buffer if s[0] > since.value]
        if not newer:
            return nv.NVML_ERROR_NOT_FOUND
        value_type._obj.value = nv.NVML_VALUE_TYPE_UNSIGNED_INT
        count._obj.value = len(newer)
        for slot, (ts, value) in zip(samples or [], newer):
            slot.timeStamp, slot.sampleValue.uiVal = ts, value
        return nv.NVML_SUCCESS

    def nvmlDeviceGetFieldValues(self, handle: object, count: ctypes.c_int32, values: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        gpu = self._gpu(handle)
        self.field_calls += 1
        for value in values._obj[: count.value]:
            known = {
                nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: gpu.pcie_bytes, nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: gpu.pcie_bytes // 2,
                nv.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: gpu.ecc[0], nv.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: gpu.ecc[1],
                nv.NVML_FI_DEV_NVLINK_LINK_COUNT: gpu.nvlinks,
            }
            if value.fieldId in (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) and value.scopeId < gpu.nvlinks:
                known[value.fieldId] = gpu.nvlink_kib * (value.scopeId + 1)
            if value.fieldId in known and value.fieldId not in gpu.refused_fields:
                kind = gpu.value_types.get(value.fieldId, nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
                value.nvmlReturn, value.valueType = nv.NVML_SUCCESS, kind
                number = known[value.fieldId]
                setattr(value.value, UNION_MEMBER[kind], float(number) if kind == nv.NVML_VALUE_TYPE_DOUBLE else number)
            else:
                value.nvmlReturn = nv.NVML_ERROR_NOT_SUPPORTED
        return nv.NVML_SUCCESS

    # -- events ------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self, event_set: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        _point(event_set._obj, 0xE5E7)
        return nv.NVML_SUCCESS

    def nvmlDeviceGetSupportedEventTypes(self, handle: object, out: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        out._obj.value = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        return nv.NVML_SUCCESS

    def nvmlDeviceRegisterEvents(self, handle: object, types: ctypes.c_ulonglong, event_set: object) -> int:
        self.registered.add(_address(handle) - 1)
        return nv.NVML_SUCCESS

    def nvmlEventSetWait_v2(self, event_set: object, data: ctypes._CArgObject, timeout_ms: ctypes.c_uint) -> int:  # type: ignore[name-defined]
        pending = [(i, x) for i, x in self.xids if i in self.registered]
        if not pending:
            return nv.NVML_ERROR_TIMEOUT
        self.xids.remove(pending[0])
        index, xid = pending[0]
        data._obj.device = ctypes.cast(ctypes.c_void_p(index + 1), nv.c_nvmlDevice_t)
        data._obj.eventType, data._obj.eventData = nv.nvmlEventTypeXidCriticalError, xid
        return nv.NVML_SUCCESS

    def nvmlEventSetFree(self, event_set: object) -> int:
        return nv.NVML_SUCCESS
