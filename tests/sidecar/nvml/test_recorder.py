"""The NVML sampler on the simulated backend: schedule, window, file format, clock, failures."""

from __future__ import annotations

import gzip
import json
import logging
import sys
import threading
import time
from pathlib import Path

import pytest

from stepscope.analysis.loading.gpu_samples import read_metrics
from stepscope.analysis.reporting.gpu_counters import counter_events
from stepscope.gpu_sample_file import BASE_COLUMNS, nvlink_columns
from stepscope.sidecar import nvml
from stepscope.sidecar.nvml import BackendError, MetricsRecorder, default_backend
from stepscope.sidecar.nvml.pynvml_backend import visible_device_ids
from stepscope.testing.nvml.simulated import SimulatedBackend

from .conftest import Profiled


def record(
    backend: nvml.NvmlBackend,
    path: Path,
    seconds: float,
    interval_us: int = 1000,
    margin_s: float = 0.05,
    **stop: object,
) -> MetricsRecorder:
    recorder = MetricsRecorder(backend, interval_us, margin_s=margin_s)
    recorder.start()
    time.sleep(seconds)
    recorder.stop(path, **stop)
    return recorder


def test_rounds_and_dropped_account_for_the_whole_window(tmp_path: Path) -> None:
    recorder = record(SimulatedBackend(2), tmp_path / "m.csv.gz", 0.4)
    stats = recorder.stats
    asked = stats.wall_s * 1e6 / recorder.interval_us
    # Every deadline is either sampled or counted as dropped; the rate itself is a benchmark's job.
    assert abs(stats.rounds + stats.dropped - asked) <= 0.05 * asked + 2
    assert stats.rounds >= 0.3 * asked
    assert stats.gpus == 2 and stats.errors == {}
    assert "rounds over 2 GPU(s)" in stats.describe()


def test_file_columns_clock_and_margin(tmp_path: Path) -> None:
    before_us = time.time_ns() / 1000
    recorder = MetricsRecorder(SimulatedBackend(2, nvlinks=2), 1000, margin_s=0.2)
    recorder.start()
    time.sleep(0.2)
    stop_called_us = time.time_ns() / 1000
    path = recorder.stop(tmp_path / "gpu-metrics.csv.gz")
    after_us = time.time_ns() / 1000
    with gzip.open(path, "rt") as f:
        header = f.readline().strip().split(",")
    assert tuple(header) == BASE_COLUMNS + nvlink_columns(2)
    frame = read_metrics(path)
    fast = frame.dropna(subset=["sm_clock_mhz"])
    assert set(fast["gpu"]) == {0, 1}
    # ts_us is Unix epoch µs (time.time_ns's clock), so it lies between the reads around the run...
    assert before_us - 1000 <= fast["ts_us"].min() and fast["ts_us"].max() <= after_us + 1000
    # ...and sampling went on for the trailing margin after stop() was called.
    assert fast["ts_us"].max() >= stop_called_us + 0.1e6
    assert frame["ts_us"].is_monotonic_increasing
    assert (fast["sm_clock_mhz"] == 1980).all() and fast["nvlink1_rx_kib"].notna().all()
    slow = frame.dropna(subset=["power_w"])
    assert 0 < len(slow) < len(fast)  # slow metrics every SLOW_PERIOD_US only
    assert frame["gpu_util_pct"].notna().any()


def test_window_keeps_margin_on_both_sides(tmp_path: Path) -> None:
    recorder = MetricsRecorder(SimulatedBackend(1), 1000, margin_s=0.05)
    recorder.start()
    time.sleep(0.3)
    now = time.time_ns() / 1000
    window = (now - 0.2e6, now - 0.1e6)
    frame = read_metrics(recorder.stop(tmp_path / "m.csv.gz", window_us=window))
    fast = frame.dropna(subset=["sm_clock_mhz"])
    assert fast["ts_us"].min() >= window[0] - 0.05e6 and fast["ts_us"].max() <= window[1] + 0.05e6
    # ...and reaches well into it on both sides (a busy machine may leave gaps of some ms).
    assert fast["ts_us"].min() <= window[0] - 0.025e6 and fast["ts_us"].max() >= window[1] + 0.025e6


def test_full_ring_gives_up_the_oldest_rows(tmp_path: Path) -> None:
    recorder = MetricsRecorder(SimulatedBackend(1), 1000, margin_s=0, buffer_mib=0.01)
    recorder.start()
    time.sleep(0.3)
    stop_us = time.time_ns() / 1000
    frame = read_metrics(recorder.stop(tmp_path / "m.csv.gz"))
    capacity = int(0.01 * (1 << 20)) // (8 * len(BASE_COLUMNS + nvlink_columns(4)))
    assert len(frame) == capacity and recorder.stats.overwritten_rows > 0
    assert frame["ts_us"].is_monotonic_increasing
    assert frame["ts_us"].max() >= stop_us - 5_000  # the newest rows are the ones kept


def test_buffered_metrics_are_read_to_the_end(tmp_path: Path) -> None:
    """The driver's utilization samples and XID events are read every BUFFER_PERIOD_US and once
    more when sampling ends: every sample queued until stop() is in the file, once."""
    backend = SimulatedBackend(1, util_sample_us=5_000, xid={0: 79}, event_after_us=150_000)
    recorder = MetricsRecorder(backend, 1000, margin_s=0)
    recorder.start()
    time.sleep(0.25)
    stop_called_us = time.time_ns() / 1000
    frame = read_metrics(recorder.stop(tmp_path / "m.csv.gz"))
    driver = list(frame.loc[frame["gpu_util_pct"].notna() & frame["sm_clock_mhz"].isna(), "ts_us"])
    assert driver == [backend.origin_us + 5_000 * k for k in range(len(driver))]
    # Up to BUFFER_PERIOD_US after the last periodic read, yet nothing is missing.
    assert driver[-1] >= stop_called_us - 5_000
    assert frame["xid"].dropna().tolist() == [79]


def test_only_the_ranks_gpus_are_written_under_the_index_their_ranks_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sidecar sees every GPU of the node; a pod that got GPUs 2 and 3 calls them cuda:0 and
    cuda:1, and its traces name those. Rows of other GPUs are left out; the ranks' UUIDs (torch
    writes them without NVML's 'GPU-' prefix) say which GPU is whose."""
    backend = SimulatedBackend(4, throttle={3: "thermal"}, xid={3: 79}, event_after_us=50_000)
    recorder = MetricsRecorder(backend, 1000, margin_s=0)
    recorder.start()
    time.sleep(0.15)
    with caplog.at_level(logging.WARNING, logger="stepscope.sidecar.nvml.recorder"):
        path = recorder.stop(tmp_path / "m.csv.gz", gpus={"sim-0002": 0, "GPU-SIM-0003": 1, "GPU-elsewhere": 2})
    frame = read_metrics(path)
    assert set(frame["gpu"]) == {0, 1}
    power = frame.dropna(subset=["power_w"]).groupby("gpu")["power_w"].first()
    assert power.to_dict() == {0: 620.0, 1: 625.0}  # the simulation's GPUs 2 and 3
    assert set(frame.loc[frame["sm_clock_mhz"] < 1980, "gpu"]) == {1}  # GPU 3 throttles
    assert frame["xid"].dropna().tolist() == [79] and frame.loc[frame["xid"].notna(), "gpu"].tolist() == [1]
    assert [r.message for r in caplog.records if "not among the GPUs" in r.message] == [
        "GPU(s) elsewhere of the pod's ranks are not among the GPUs NVML shows this sidecar; their hardware metrics "
        "are missing"
    ]


def test_samples_line_up_with_the_steps_of_a_real_profiler_trace(profiled: Profiled) -> None:
    """A torch.profiler capture during the recording: the summary's steps, on the trace's clock
    (ts + baseTimeNanoseconds), select the samples taken while they ran."""
    from stepscope.analysis.diagnosis.hardware import findings
    from stepscope.analysis.statistics.gpu_steps import step_statistics
    from stepscope.analysis.statistics.summary import summarize_file

    metrics = read_metrics(profiled.metrics)
    trace = json.loads(profiled.trace.read_text())
    marker = next(e for e in trace["traceEvents"] if e.get("name") == "stepscope-marker")
    start_us = marker["ts"] + trace["baseTimeNanoseconds"] / 1000
    fast = metrics.dropna(subset=["sm_clock_mhz"])
    during = fast[(fast["ts_us"] >= start_us) & (fast["ts_us"] <= start_us + marker["dur"])]
    assert len(during) >= 10  # a 40 ms marker covers ~40 samples of the 1 ms sampler on one clock

    summary = summarize_file(profiled.trace, rank=0)
    assert not summary.error and len(summary.steps) == 3
    assert summary.traceBaseUs == trace["baseTimeNanoseconds"] / 1000
    stats = step_statistics(metrics, summary.steps, 0, base_us=summary.traceBaseUs)
    assert stats["smClockMHzMean"] == [1100.0] * len(summary.steps)
    assert stats["thermalThrottleFraction"] == [1.0] * len(summary.steps)
    found, explanations = findings([summary], {"": metrics})
    assert [f.ranks for f in found] == [[0]] and "thermal throttling" in explanations[0]


def test_interval_below_100_us_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 100"):
        MetricsRecorder(SimulatedBackend(1), 50)


def test_start_twice_and_stop_without_start_are_errors(tmp_path: Path) -> None:
    recorder = MetricsRecorder(SimulatedBackend(1), 1000, margin_s=0)
    with pytest.raises(RuntimeError):
        recorder.stop(tmp_path / "m.csv.gz")
    recorder.start()
    with pytest.raises(RuntimeError):
        recorder.start()
    recorder.stop(tmp_path / "m.csv.gz")


class BrokenFields(SimulatedBackend):
    """Field values crash with an unexpected exception; memory is not supported at all."""

    def __init__(self) -> None:
        super().__init__(1, error_every=3)
        self.memory_calls = 0

    def field_values(self, gpu, fields):  # type: ignore[no-untyped-def]
        raise ZeroDivisionError("driver bug")

    def memory_used_bytes(self, gpu: int) -> int:
        self.memory_calls += 1
        raise BackendError("not supported", not_supported=True)


def test_backend_errors_do_not_stop_the_sampler(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    backend = BrokenFields()
    with caplog.at_level(logging.WARNING, logger="stepscope.sidecar.nvml.recorder"):
        recorder = record(backend, tmp_path / "m.csv.gz", 0.2)
    stats = recorder.stats
    assert stats.errors["clocks"] >= 10 and stats.errors["field_values"] == stats.rounds
    assert backend.memory_calls == 1  # a metric the GPU does not support is asked once
    frame = read_metrics(tmp_path / "m.csv.gz")
    fast = frame.dropna(subset=["clock_reasons"])
    assert len(fast) == stats.rounds
    assert fast["sm_clock_mhz"].isna().sum() == stats.errors["clocks"]
    assert fast["pcie_tx_bytes"].isna().all() and frame["memory_used_mib"].isna().all()
    # Logged once per kind of failure, then only counted.
    assert sum("clocks failed" in r.message for r in caplog.records) == 1


def test_no_gpu_says_so_once_and_returns_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(nvml, "_said_absent", threading.Event())
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    with caplog.at_level(logging.INFO, logger="stepscope.sidecar.nvml"):
        assert default_backend() is None
        assert default_backend() is None
    said = [r.message for r in caplog.records if r.name == "stepscope.sidecar.nvml"]
    assert len(said) == 1 and "no GPU hardware metrics" in said[0] and "pynvml" in said[0]


def test_no_nvml_library_returns_none(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML")
    monkeypatch.setattr(nvml, "_said_absent", threading.Event())
    with caplog.at_level(logging.INFO, logger="stepscope.sidecar.nvml"):
        assert default_backend() is None
    assert any("NVML is not usable here" in r.message for r in caplog.records)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"CUDA_VISIBLE_DEVICES": "1,0"}, ["1", "0"]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8f2e, GPU-11aa"}, ["GPU-8f2e", "GPU-11aa"]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, []),
        ({"CUDA_VISIBLE_DEVICES": "2", "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa"}, ["2"]),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, None),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}, ["GPU-aaaa", "GPU-bbbb"]),
        ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, None),  # host indices: the container runtime applied them
    ],
)
def test_visible_devices(env: dict[str, str], expected: list[str] | None) -> None:
    assert visible_device_ids(env) == expected


@pytest.mark.gpu
def test_real_gpu_samples_at_100_us(tmp_path: Path) -> None:
    backend = default_backend()
    if backend is None:
        pytest.skip("no NVML GPU on this machine")
    try:
        recorder = record(backend, tmp_path / "gpu-metrics.csv.gz", 0.5, interval_us=100)
    finally:
        backend.close()
    frame = read_metrics(tmp_path / "gpu-metrics.csv.gz")
    fast = frame.dropna(subset=["sm_clock_mhz"])
    assert len(fast) > 0 and fast["sm_clock_mhz"].gt(0).all()
    assert frame["power_w"].notna().any() and frame["temperature_c"].notna().any()
    tracks = {e["name"] for e in counter_events(frame, "this-node") if e["ph"] == "C"}
    assert "GPU 0 SM clock (MHz)" in tracks and "GPU 0 power (W)" in tracks
    print(recorder.stats.describe())
    print("fields NVML returned:", [c for c in frame.columns if frame[c].notna().any()])
    print("counter tracks:", sorted(tracks))


class CostlyCounters(SimulatedBackend):
    """A driver whose nvmlDeviceGetFieldValues costs what an H100's did (about 260 µs of CPU a call,
    driver 580), while its clock reads cost a microsecond or two."""

    def field_values(self, gpu, fields):  # type: ignore[no-untyped-def]
        deadline = time.perf_counter_ns() + 260_000
        while time.perf_counter_ns() < deadline:
            pass
        return super().field_values(gpu, fields)


def test_costly_counters_are_read_every_few_rounds_and_the_clocks_every_round(tmp_path: Path) -> None:
    recorder = MetricsRecorder(CostlyCounters(1, nvlinks=0), 1000, margin_s=0, native=False)
    recorder.start()
    time.sleep(0.6)
    frame = read_metrics(recorder.stop(tmp_path / "gpu-metrics.csv.gz"))
    stats = recorder.stats
    # 260 µs a call against 2 % of a 1 ms interval: one round in 13 or more reads the counters.
    assert stats.fields_call_us >= 250 and stats.fields_every >= 13, stats
    clocks, counters = frame["sm_clock_mhz"].notna().sum(), frame["pcie_tx_bytes"].notna().sum()
    assert clocks == stats.rounds and counters == pytest.approx(stats.rounds / stats.fields_every, abs=1)
    assert f"counters every {stats.fields_every} round(s)" in stats.describe()
    assert stats.cpu_s / stats.wall_s < 0.15  # every round's counters would cost a quarter of a core


def test_the_native_tier_reads_the_counters_as_seldom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.sidecar.nvml import native
    from stepscope.sidecar.nvml import recorder as recorder_module

    if native.library() is None:
        pytest.skip("the native fast tier is not built here")
    # The simulation's counters cost a few µs: a share this small makes them as costly as an H100's.
    monkeypatch.setattr(recorder_module, "FIELDS_CPU_SHARE", 1e-4)
    recorder = MetricsRecorder(SimulatedBackend(1, nvlinks=0), 1000, margin_s=0)
    recorder.start()
    time.sleep(0.4)
    frame = read_metrics(recorder.stop(tmp_path / "gpu-metrics.csv.gz"))
    stats = recorder.stats
    assert stats.native and stats.fields_every > 1, stats
    fast = frame.dropna(subset=["sm_clock_mhz"])
    assert len(fast) == stats.rounds
    assert fast["pcie_tx_bytes"].notna().sum() == pytest.approx(stats.rounds / stats.fields_every, abs=1)
