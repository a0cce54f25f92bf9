"""On a machine with an NVIDIA GPU: the sampler's reads through the real driver. The prepared calls
read what pynvml's own wrappers read, the native fast tier reads what the Python tier reads, and
the GPU's MIG mode is what the backend's device selection assumes."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from stepscope.analysis.loading.gpu_samples import read_metrics
from stepscope.gpu_sample_file import round_fields
from stepscope.sidecar.nvml import BackendError, MetricsRecorder, default_backend
from stepscope.sidecar.nvml import native as nvml_native
from stepscope.sidecar.nvml.api import NvmlBackend
from stepscope.sidecar.nvml.pynvml_backend import UNION_MEMBER, PynvmlBackend

pytestmark = pytest.mark.gpu


@pytest.fixture
def backend() -> Iterator[NvmlBackend]:
    found = default_backend()
    if found is None:
        pytest.skip("no NVML GPU on this machine")
    yield found
    found.close()


def test_prepared_reads_match_pynvml_wrappers(backend: NvmlBackend) -> None:
    import pynvml

    fields = tuple((field, scope) for _, field, scope in round_fields(backend.devices()[0].nvlinks))
    prepared = list(backend.field_values(0, fields))
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    wrapped = pynvml.nvmlDeviceGetFieldValues(handle, list(fields))
    refused = [v.nvmlReturn != pynvml.NVML_SUCCESS for v in wrapped]
    print("fields refused by NVML:", [f for f, r in zip(round_fields(backend.devices()[0].nvlinks), refused) if r])
    assert [math.isnan(v) for v in prepared] == refused
    # ECC counts stand still; the PCIe counters only grow between the two reads.
    ecc = {3, 4}
    for (field, _), value, raw in zip(fields, prepared, wrapped):
        if raw.nvmlReturn != pynvml.NVML_SUCCESS:
            continue
        read = getattr(raw.value, UNION_MEMBER.get(raw.valueType, "uiVal"))
        assert (value == read) if field in ecc else (value <= read), (field, value, read)
    sm, mem = backend.clocks_mhz(0)
    assert sm > 0 and mem > 0
    assert abs(mem - pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)) <= 0.1 * mem
    assert backend.clock_event_reasons(0) >= 0


def test_native_tier_reads_what_the_python_tier_reads(
    backend: NvmlBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STEPSCOPE_NATIVE_SAMPLER", raising=False)  # the default reads real NVML natively
    if nvml_native.library() is None:
        pytest.skip("the native fast tier is not built here")
    frames: dict[bool, pd.DataFrame] = {}
    for native in (False, True):
        recorder = MetricsRecorder(backend, 1000, margin_s=0, native=native)
        recorder.start()
        time.sleep(0.5)
        frames[native] = read_metrics(recorder.stop(tmp_path / f"{native}.csv.gz"))
        print(recorder.stats.describe())
        assert recorder.stats.native == native and recorder.stats.errors == {}
        assert recorder.stats.achieved_ratio > 0.8
    measured = {native: {c for c in f.columns if f[c].notna().any()} for native, f in frames.items()}
    assert measured[True] == measured[False], measured
    for column in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c", "memory_used_mib"):
        python, fast = frames[False][column].dropna(), frames[True][column].dropna()
        assert len(fast) > 0 and (python.median() - fast.median()) <= 0.25 * max(python.median(), 1.0), column


def test_mig_mode_and_device_selection(backend: NvmlBackend) -> None:
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        print(f"MIG mode: current {current}, pending {pending}")
    except pynvml.NVMLError as error:
        print(f"MIG mode: {error}")
        current = pynvml.NVML_DEVICE_MIG_DISABLE
    uuid = backend.devices()[0].uuid
    chosen = PynvmlBackend({"CUDA_VISIBLE_DEVICES": uuid})
    try:
        assert [d.uuid for d in chosen.devices()] == [uuid]
    finally:
        chosen.close()
    with pytest.raises(BackendError, match="MIG instance"):
        PynvmlBackend({"CUDA_VISIBLE_DEVICES": "MIG-" + uuid.removeprefix("GPU-")})
    if current == pynvml.NVML_DEVICE_MIG_DISABLE:
        assert backend.devices()[0].name
