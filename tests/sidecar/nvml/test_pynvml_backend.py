"""PynvmlBackend through the real pynvml bindings over a stand-in NVML library (fake_libnvml)."""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path

import pytest

pynvml = pytest.importorskip("pynvml")

from stepscope.analysis.loading.gpu_samples import read_metrics  # noqa: E402 (after the importorskip)
from stepscope.gpu_sample_file import (  # noqa: E402 (after the importorskip)
    FI_NVLINK_THROUGHPUT_DATA_TX,
    FI_PCIE_COUNT_RX_BYTES,
    FI_PCIE_COUNT_TX_BYTES,
    REASON_SW_THERMAL,
)
from stepscope.sidecar import nvml  # noqa: E402 (after the importorskip)
from stepscope.sidecar.nvml import MetricsRecorder, default_backend  # noqa: E402 (after the importorskip)
from stepscope.sidecar.nvml.pynvml_backend import PynvmlBackend  # noqa: E402 (after the importorskip)
from stepscope.testing.nvml.fake_libnvml import FakeGpu, FakeNvmlLib  # noqa: E402 (after the importorskip)

UUIDS = ["GPU-0a0a0a0a-1111", "GPU-1b1b1b1b-2222", "GPU-2c2c2c2c-3333"]


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def put(lib: FakeNvmlLib) -> FakeNvmlLib:
        monkeypatch.setattr(pynvml, "nvmlLib", lib)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        monkeypatch.setattr(nvml, "_said_absent", threading.Event())
        return lib

    return put


def gpus() -> list[FakeGpu]:
    return [FakeGpu(uuid) for uuid in UUIDS]


def test_visible_gpus_by_uuid_prefix_and_index(install) -> None:  # type: ignore[no-untyped-def]
    install(FakeNvmlLib(gpus()))
    backend = PynvmlBackend({"CUDA_VISIBLE_DEVICES": "GPU-2c2c,1"})
    devices = backend.devices()
    assert [(d.index, d.uuid, d.nvlinks) for d in devices] == [(0, UUIDS[2], 2), (1, UUIDS[1], 2)]
    assert devices[0].name == "NVIDIA H100 80GB HBM3"
    backend.close()
    # CUDA ignores everything after an entry it cannot resolve.
    backend = PynvmlBackend({"CUDA_VISIBLE_DEVICES": "0,GPU-ffff,2"})
    assert [d.uuid for d in backend.devices()] == [UUIDS[0]]
    backend.close()


def test_every_metric_through_pynvml(install) -> None:  # type: ignore[no-untyped-def]
    fake = gpus()
    fake[1].reasons = REASON_SW_THERMAL
    fake[1].refused_fields = {FI_PCIE_COUNT_RX_BYTES}
    lib = install(FakeNvmlLib(fake))
    backend = PynvmlBackend({"CUDA_VISIBLE_DEVICES": "1"})
    assert backend.clocks_mhz(0) == (1980.0, 2619.0)
    assert backend.clock_event_reasons(0) == REASON_SW_THERMAL
    assert backend.power_w(0) == pytest.approx(612.345)
    assert backend.temperature_c(0) == 64.0 and backend.memory_used_bytes(0) == 61 << 30
    assert backend.utilization(0) == (93.0, 41.0)
    values = backend.field_values(0, [(197, 0), (198, 0), (138, 1), (139, 7), (4, 0)])
    assert values[0] == 10_000_000 and values[2] == 10_000 and values[4] == 0
    assert values[1] != values[1] and values[3] != values[3]  # refused: NaN
    assert lib.field_calls == 2  # one for the link count at start, one batch now
    fake[1].gpu_samples = [(100, 50), (200, 60), (300, 70)]
    assert backend.utilization_samples(0, "gpu", 150) == [(200, 60.0), (300, 70.0)]
    assert backend.utilization_samples(0, "gpu", 300) == []  # NVML_ERROR_NOT_FOUND: nothing newer
    lib.xids += [(0, 31), (1, 79)]  # GPU 0 is not this pod's: its event is not registered
    assert backend.xid_events() == [(0, 79)]
    assert backend.xid_events() == []
    backend.close()
    assert lib.shutdowns == 1


def test_field_values_follow_the_value_types_the_driver_reports(install) -> None:  # type: ignore[no-untyped-def]
    fake = gpus()
    fake[0].refused_fields = {FI_PCIE_COUNT_RX_BYTES}
    lib = install(FakeNvmlLib(fake))
    backend = PynvmlBackend({"CUDA_VISIBLE_DEVICES": "0"})
    fields = ((FI_PCIE_COUNT_TX_BYTES, 0), (FI_PCIE_COUNT_RX_BYTES, 0), (FI_NVLINK_THROUGHPUT_DATA_TX, 1))
    first = backend.field_values(0, fields)
    assert first[0] == 10_000_000 and math.isnan(first[1]) and first[2] == 10_000
    # The same array is read again with each value type NVML has; a refused field comes back.
    fake[0].refused_fields = set()
    for kind in range(pynvml.NVML_VALUE_TYPE_COUNT):
        fake[0].pcie_bytes = 40_000 + kind
        fake[0].value_types = {
            FI_PCIE_COUNT_TX_BYTES: kind,
            FI_PCIE_COUNT_RX_BYTES: (kind + 3) % pynvml.NVML_VALUE_TYPE_COUNT,
        }
        assert list(backend.field_values(0, fields)) == [40_000 + kind, (40_000 + kind) // 2, 10_000], kind
    assert lib.field_calls == 1 + 1 + pynvml.NVML_VALUE_TYPE_COUNT  # link count, then one call per read
    backend.close()


def test_recorder_over_pynvml(install, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake = gpus()
    fake[0].mem_samples = None  # no buffer for memory utilization: polled instead
    lib = install(FakeNvmlLib(fake))
    backend = default_backend({"CUDA_VISIBLE_DEVICES": "0,2"})
    assert isinstance(backend, PynvmlBackend)
    lib.xids.append((2, 48))
    now = time.time_ns() // 1000
    # The driver's buffer: one sample older than the recording (left out), five during it.
    fake[0].gpu_samples = [(now - 500_000, 10)] + [(now + 30_000 + 10_000 * k, 80 + k) for k in range(5)]
    recorder = MetricsRecorder(backend, 1000, margin_s=0.02)
    recorder.start()
    time.sleep(0.15)
    frame = read_metrics(recorder.stop(tmp_path / "gpu-metrics.csv.gz"))
    backend.close()
    assert recorder.stats.errors == {}
    fast = frame.dropna(subset=["sm_clock_mhz"])
    assert set(fast["gpu"]) == {0, 1}
    # The stand-in's counter call costs tens of µs of Python: the rounds may read it every few rounds.
    counters = fast.dropna(subset=["pcie_tx_bytes"])
    assert len(counters) >= len(fast) / recorder.stats.fields_every - 1
    assert (counters["nvlink1_tx_kib"] == 10_000).all() and (counters["pcie_tx_bytes"] == 10_000_000).all()
    assert frame["power_w"].dropna().eq(612.345).all()
    driver = frame[(frame["gpu"] == 0) & frame["gpu_util_pct"].notna()]
    assert list(driver["gpu_util_pct"]) == [80, 81, 82, 83, 84] and list(driver["ts_us"]) == [
        s[0] for s in fake[0].gpu_samples[1:]
    ]
    assert frame.loc[frame["gpu"] == 0, "mem_util_pct"].dropna().eq(41).all()
    assert frame.loc[frame["xid"].notna(), ["gpu", "xid"]].values.tolist() == [[1, 48]]


def test_old_driver_without_clocks_event_reasons(install) -> None:  # type: ignore[no-untyped-def]
    fake = gpus()
    fake[0].reasons = 0x4
    install(FakeNvmlLib(fake, event_reasons_symbol=False))
    backend = PynvmlBackend({})
    assert backend.clock_event_reasons(0) == 0x4  # through nvmlDeviceGetCurrentClocksThrottleReasons
    backend.close()


@pytest.mark.parametrize(
    ("lib", "env", "said"),
    [
        (lambda: FakeNvmlLib([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED), {}, "NVML is not usable here"),
        (lambda: FakeNvmlLib(gpus()), {"CUDA_VISIBLE_DEVICES": ""}, "sees no GPU visible to this pod"),
        (lambda: FakeNvmlLib([]), {}, "sees no GPU visible to this pod"),
        (
            lambda: FakeNvmlLib(gpus()),
            {"CUDA_VISIBLE_DEVICES": "MIG-4f2c9e1a-7b3d"},
            "MIG-4f2c9e1a-7b3d is a MIG instance",
        ),
        (lambda: FakeNvmlLib(gpus()), {"NVIDIA_VISIBLE_DEVICES": "MIG-4f2c9e1a-7b3d"}, "samples whole GPUs only"),
    ],
)
def test_no_usable_gpu(install, caplog: pytest.LogCaptureFixture, lib, env: dict[str, str], said: str) -> None:  # type: ignore[no-untyped-def]
    fake = install(lib())
    with caplog.at_level(logging.INFO, logger="stepscope.sidecar.nvml"):
        assert default_backend(env) is None
    assert any(said in r.message for r in caplog.records)
    assert fake.shutdowns == (0 if fake.init_error else 1)
