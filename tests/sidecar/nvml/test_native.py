"""The native fast tier (sidecar/nvml/fast_sampler.c) against the Python one, on the same simulated node."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import pandas as pd
import pytest

import stepscope.sidecar.nvml.native as nvml_native
from stepscope.analysis.loading.gpu_samples import read_metrics
from stepscope.sidecar.nvml import BackendError, MetricsRecorder
from stepscope.testing.nvml.simulated import SIMULATION_LIBRARY, SimulatedBackend, simulation_library

pytestmark = pytest.mark.skipif(nvml_native.library() is None or simulation_library() is None,
                                reason=f"{nvml_native.LIBRARY.name} or {SIMULATION_LIBRARY.name} is not built (make builds them with the machine's C compiler)")


def node() -> SimulatedBackend:
    # Throttling, a slow link and ECC errors that appear 80 ms in: every value the fast tier reads.
    return SimulatedBackend(3, throttle={1: "thermal"}, slow_link={2: "nvlink"}, ecc={0: (5, 2)}, event_after_us=80_000,
                            step_us=20_000)


def record(tmp_path: Path, native: bool, seconds: float = 0.3, **options: float) -> tuple[MetricsRecorder, pd.DataFrame]:
    recorder = MetricsRecorder(node(), 1000, margin_s=0, native=native, **options)
    recorder.start()
    time.sleep(seconds)
    frame = read_metrics(recorder.stop(tmp_path / f"{'native' if native else 'python'}.csv.gz"))
    return recorder, frame


def per_gpu(frame: pd.DataFrame) -> pd.DataFrame:
    fast = frame.dropna(subset=["sm_clock_mhz"])
    last = fast.groupby("gpu").last()
    rate = fast.groupby("gpu").apply(lambda g: (g["nvlink0_tx_kib"].iloc[-1] - g["nvlink0_tx_kib"].iloc[0]) /
                                     (g["ts_us"].iloc[-1] - g["ts_us"].iloc[0]), include_groups=False)
    return pd.DataFrame({"sm": fast.groupby("gpu")["sm_clock_mhz"].max(), "reasons": fast.groupby("gpu")["clock_reasons"].max(),
                         "ecc_sbe": last["ecc_sbe"], "ecc_dbe": last["ecc_dbe"], "nvlink_rate": rate,
                         "power": frame.dropna(subset=["power_w"]).groupby("gpu")["power_w"].first()})


def test_the_native_tier_reads_what_the_python_one_reads(tmp_path: Path) -> None:
    python, python_frame = record(tmp_path, native=False)
    native, native_frame = record(tmp_path, native=True)
    assert not python.stats.native and native.stats.native and "native fast tier" in native.stats.describe()
    assert list(native_frame.columns) == list(python_frame.columns)
    expected, got = per_gpu(python_frame), per_gpu(native_frame)
    assert got[["sm", "reasons", "ecc_sbe", "ecc_dbe", "power"]].equals(expected[["sm", "reasons", "ecc_sbe", "ecc_dbe", "power"]])
    assert got.loc[1, "sm"] == 1100 and got.loc[0, ["ecc_sbe", "ecc_dbe"]].tolist() == [5, 2]
    # The link counters grow at the same rate (KiB per µs, averaged over the recording), the slow link a fifth of it.
    assert got["nvlink_rate"].tolist() == pytest.approx(expected["nvlink_rate"].tolist(), rel=0.25)
    assert got.loc[2, "nvlink_rate"] == pytest.approx(0.2 * got.loc[0, "nvlink_rate"], rel=0.05)
    # Every round and GPU is a row with its own time; power, temperature and memory used ride in
    # the round of every SLOW_PERIOD_US, as in the Python tier.
    fast = native_frame.dropna(subset=["sm_clock_mhz"])
    assert len(fast) == 3 * native.stats.rounds and native.stats.rounds >= 0.3 * 300
    assert native_frame["ts_us"].is_monotonic_increasing and fast.groupby("gpu")["ts_us"].diff().dropna().gt(0).all()
    for frame, recorder in ((native_frame, native), (python_frame, python)):
        slow = frame.dropna(subset=["power_w"])
        assert slow["sm_clock_mhz"].notna().all() and slow[["temperature_c", "memory_used_mib"]].notna().all().all()
        assert 3 * recorder.stats.rounds / 12 <= len(slow) <= 3 * recorder.stats.rounds / 8
    assert got.join(native_frame.groupby("gpu")[["temperature_c", "memory_used_mib"]].first()).loc[2, "temperature_c"] == 64
    assert native.stats.errors == {} and native.stats.cpu_s > 0


class NoUtilizationBuffers(SimulatedBackend):
    """A driver that keeps no utilization sample buffer: the recorder polls utilization instead."""

    def utilization_samples(self, gpu: int, kind: str, since_us: int) -> list[tuple[int, float]]:
        raise BackendError("no sample buffer", not_supported=True)


def test_utilization_is_polled_beside_the_native_tier_where_the_driver_keeps_no_buffer(tmp_path: Path) -> None:
    recorder = MetricsRecorder(NoUtilizationBuffers(2, low_util={1: 40.0}), 1000, margin_s=0)
    recorder.start()
    time.sleep(0.3)
    frame = read_metrics(recorder.stop(tmp_path / "m.csv.gz"))
    assert recorder.stats.native
    polled = frame.dropna(subset=["gpu_util_pct"])
    assert polled["sm_clock_mhz"].isna().all() and polled.groupby("gpu")["gpu_util_pct"].first().tolist() == [97, 40]
    assert polled.groupby("gpu")["ts_us"].diff().dropna().median() == pytest.approx(10_000, rel=0.2)  # SLOW_PERIOD_US


def test_the_native_ring_gives_up_its_oldest_rows(tmp_path: Path) -> None:
    recorder, frame = record(tmp_path, native=True, buffer_mib=0.05)
    fast = frame.dropna(subset=["sm_clock_mhz"])
    assert recorder.stats.overwritten_rows > 0
    assert len(fast) < 3 * recorder.stats.rounds and fast["ts_us"].max() >= time.time_ns() / 1000 - 200_000


def test_switched_off_failing_or_not_offered_it_samples_in_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("STEPSCOPE_NATIVE_SAMPLER", "0")
    nvml_native.library.cache_clear()
    try:
        recorder, frame = record(tmp_path, native=True, seconds=0.1)
    finally:
        monkeypatch.undo()
        nvml_native.library.cache_clear()
    assert not recorder.stats.native and frame["sm_clock_mhz"].notna().any()
    # A backend whose native reads fail leaves the sampling to Python, and says so once.
    class Failing(SimulatedBackend):
        def native_reads(self) -> None:
            raise RuntimeError("no such symbol")

    recorder = MetricsRecorder(Failing(1), 1000, margin_s=0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stepscope.sidecar.nvml.recorder"):
        recorder.start()
        time.sleep(0.05)
        frame = read_metrics(recorder.stop(tmp_path / "failing.csv.gz"))
    assert not recorder.stats.native and frame["sm_clock_mhz"].notna().any()
    assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == [
        "NVML sampler: the native fast tier did not start (no such symbol); sampling in Python"]
    # A simulation whose reads a test changed is not one the C simulation reproduces.
    assert SimulatedBackend(1, error_every=3).native_reads() is None
    assert SimulatedBackend(1, clock_ns=lambda: 0).native_reads() is None


def test_the_sampler_the_image_ships_carries_no_simulation() -> None:
    """The simulated GPU node's C functions live in their own test library, not in the sampler."""
    assert "ss_sim_" not in (Path(nvml_native.__file__).with_name("fast_sampler.c")).read_text()
    lib = nvml_native.library()
    assert lib is not None and not hasattr(lib, "ss_sim_power")
    assert hasattr(simulation_library(), "ss_sim_power")
