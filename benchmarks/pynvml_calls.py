"""Python-side cost of the sampler's per-round NVML reads: PynvmlBackend against pynvml's wrappers.

    .venv/bin/python benchmarks/pynvml_calls.py [--links 4] [--repeat 5]

Both sides run over the stand-in NVML library of the tests (stepscope/testing/nvml/fake_libnvml.py) with every
C function the round calls replaced by one that returns NVML_SUCCESS at once, so what is timed is
the Python around the driver call: argument building, the call through ctypes, reading results.
On a real GPU the driver's own time comes on top of both. The reference is the plain pynvml way
(`nvmlDeviceGetFieldValues` and reading each value's union member, `nvmlDeviceGetClockInfo` twice,
`nvmlDeviceGetCurrentClocksEventReasons`), which is what the sampler did before its reads were
prepared once per GPU.

    python benchmarks/pynvml_calls.py --real      # on a GPU: the driver's time too, and each call alone

With --real both ways read the machine's first GPU through the real driver: the script checks that
they read the same (NVML refuses the same fields; the counters agree), then times them and each
NVML call the sampler makes, one at a time.
"""

from __future__ import annotations

import argparse
import math
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pynvml as nv

from stepscope.gpu_sample_file import round_fields
from stepscope.sidecar.nvml.pynvml_backend import UNION_MEMBER, PynvmlBackend
from stepscope.testing.nvml.fake_libnvml import FakeGpu, FakeNvmlLib

ROUND_CALLS = ("nvmlDeviceGetFieldValues", "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons")


def succeed(*_: Any) -> int:
    return nv.NVML_SUCCESS


def wrapper_round(handle: Any, fields: list[tuple[int, int]]) -> tuple[float, ...]:
    values = nv.nvmlDeviceGetFieldValues(handle, fields)
    read = [
        float(getattr(v.value, UNION_MEMBER.get(v.valueType, "uiVal"))) if v.nvmlReturn == nv.NVML_SUCCESS else math.nan
        for v in values
    ]
    sm = nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)
    mem = nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM)
    return (float(sm), float(mem), float(nv.nvmlDeviceGetCurrentClocksEventReasons(handle)), *read)


def backend_round(backend: PynvmlBackend, fields: tuple[tuple[int, int], ...]) -> tuple[float, ...]:
    return (*backend.clocks_mhz(0), float(backend.clock_event_reasons(0)), *backend.field_values(0, fields))


def per_call_us(fn: Callable[[], object], repeat: int, number: int = 20_000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Two rounds read moments apart agree: the same fields refused, and every value within 10 %
    (clocks and cumulative counters move between the two reads)."""
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 0.1 * max(abs(x), abs(y), 1.0) for x, y in zip(a, b)
    )


def real(repeat: int) -> int:
    """The round both ways and each call alone on this machine's first GPU, the driver's time included."""
    backend = PynvmlBackend()
    device = backend.devices()[0]
    fields = tuple((field, scope) for _, field, scope in round_fields(device.nvlinks))
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    prepared_read, wrapper_read = backend_round(backend, fields), wrapper_round(handle, list(fields))
    names = ["sm_clock", "mem_clock", "reasons", *(name for name, _, _ in round_fields(device.nvlinks))]
    print(f"{device.name}, {device.nvlinks} NVLink links, {len(fields)} fields a round")
    print(f"  prepared: {dict(zip(names, prepared_read))}")
    print(f"  wrappers: {dict(zip(names, wrapper_read))}")
    print(f"  both ways read the same: {_same(prepared_read, wrapper_read)}")
    calls: dict[str, Callable[[], object]] = {
        "round, pynvml wrappers": lambda: wrapper_round(handle, list(fields)),
        "round, PynvmlBackend (prepared)": lambda: backend_round(backend, fields),
        f"nvmlDeviceGetFieldValues ({len(fields)} fields)": lambda: backend.field_values(0, fields),
        "nvmlDeviceGetFieldValues (4 fields: PCIe, ECC)": lambda: backend.field_values(0, fields[:4]),
        "nvmlDeviceGetClockInfo x2": lambda: backend.clocks_mhz(0),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: backend.clock_event_reasons(0),
        "nvmlDeviceGetPowerUsage": lambda: backend.power_w(0),
        "nvmlDeviceGetTemperature": lambda: backend.temperature_c(0),
        "nvmlDeviceGetMemoryInfo": lambda: backend.memory_used_bytes(0),
        "nvmlDeviceGetUtilizationRates": lambda: backend.utilization(0),
    }
    for name, call in calls.items():
        try:
            print(f"  {name:48s} {per_call_us(call, repeat, number=500):9.2f} us")
        except Exception as error:  # noqa: BLE001 - a refused call is a result here
            print(f"  {name:48s} refused: {error}")
    backend.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", type=int, default=4, help="NVLink links read per GPU (2 fields each)")
    parser.add_argument("--repeat", type=int, default=5, help="timing repeats (the best is kept)")
    parser.add_argument("--real", action="store_true", help="this machine's GPU through the real driver")
    args = parser.parse_args(argv)
    if args.real:
        return real(args.repeat)
    fields = tuple((field, scope) for _, field, scope in round_fields(args.links))
    nv.nvmlLib = FakeNvmlLib([FakeGpu("GPU-bench", nvlinks=args.links)])
    backend = PynvmlBackend({})
    # One real read through the stand-in first, so both sides read arrays the driver has filled.
    expected = backend_round(backend, fields)
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    assert wrapper_round(handle, list(fields)) == expected, "both ways must read the same values"
    for name in ROUND_CALLS:
        setattr(nv.nvmlLib, name, succeed)
    nv._nvmlGetFunctionPointer_cache.clear()
    for call in (*backend._clock_calls[0], backend._field_readers[0].call):
        call._function = succeed
    wrapper = per_call_us(lambda: wrapper_round(handle, list(fields)), args.repeat)
    prepared = per_call_us(lambda: backend_round(backend, fields), args.repeat)
    print(f"one GPU's per-round reads ({len(fields)} fields, 2 clocks, clock event reasons), Python side only:")
    print(f"  pynvml wrappers (reference) {wrapper:7.2f} us")
    print(f"  PynvmlBackend (prepared)    {prepared:7.2f} us   ratio {prepared / wrapper:.2f}")
    print(
        f"  at 1 ms on 8 GPUs: {8 * wrapper / 10:.1f} % of a core against {8 * prepared / 10:.1f} %, before the "
        "driver's own time"
    )
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
