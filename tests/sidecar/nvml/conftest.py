"""Simulated GPU nodes recorded by the real sampler, and rank summaries that line up with them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from stepscope.analysis.loading.gpu_samples import read_metrics
from stepscope.analysis.model import SUMMARY_VERSION, RankSummary, StepRow
from stepscope.sidecar.nvml import MetricsRecorder
from stepscope.testing.nvml.simulated import SimulatedBackend

STEP_US = 50_000
COMM_FRACTION = 0.3
RECORD_S = 0.9


@dataclass
class Run:
    """A simulated job: pods of GPUs, each pod's samples, and one summary per GPU (rank)."""

    metrics: dict[str, pd.DataFrame]
    summaries: list[RankSummary]
    backends: dict[str, SimulatedBackend]
    files: dict[str, Path]  # pod -> its gpu-metrics.csv.gz


def summaries_for(
    pod: str, backend: SimulatedBackend, first_rank: int, steps: range, slow: dict[int, float] | None = None
) -> list[RankSummary]:
    """Rank summaries of `backend`'s GPUs over the given simulated steps; `slow` stretches a GPU's
    step durations (a slow worker)."""
    out = []
    for device in backend.devices():
        factor = (slow or {}).get(device.index, 1.0)
        rows = [
            StepRow(
                step=s,
                startUs=start,
                durationUs=duration * factor,
                computingUs=duration * (1 - COMM_FRACTION),
                communicationUs=duration * COMM_FRACTION,
            )
            for s, start, duration in backend.step_windows(steps.start, len(steps))
        ]
        out.append(
            RankSummary(
                version=SUMMARY_VERSION,
                rank=first_rank + device.index,
                localRank=device.index,
                gpu=device.index,
                pod=pod,
                node=f"node-{pod}",
                hasGpu=True,
                steps=rows,
            )
        )
    return out


def record_pods(pods: dict[str, SimulatedBackend], tmp: Path, interval_us: int = 1000) -> dict[str, Path]:
    """Record every pod at once with the real sampler (each pod has its own sidecar)."""
    recorders = {pod: MetricsRecorder(backend, interval_us, margin_s=0.05) for pod, backend in pods.items()}
    for recorder in recorders.values():
        recorder.start()
    time.sleep(RECORD_S)
    paths: dict[str, Path] = {}
    threads = [
        threading.Thread(target=lambda p=pod, r=rec: paths.__setitem__(p, r.stop(tmp / p / "gpu-metrics.csv.gz")))
        for pod, rec in recorders.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return paths


def _run(tmp: Path, unhealthy: bool) -> Run:
    origin = time.time_ns() // 1000
    # XID and ECC errors appear halfway, so the recording sees them happen even on a busy machine.
    common = dict(step_us=STEP_US, comm_fraction=COMM_FRACTION, origin_us=origin, event_after_us=int(RECORD_S * 0.5e6))
    if unhealthy:
        pods = {
            "train-a": SimulatedBackend(3, throttle={1: "thermal", 2: "power"}, **common),
            "train-b": SimulatedBackend(
                4,
                slow_link={0: "nvlink", 2: "pcie"},
                low_util={1: 40.0},
                xid={1: 79},
                ecc={1: (5, 2)},
                locked_clock_mhz={3: 1410.0},
                **common,
            ),
        }
    else:
        pods = {"train-a": SimulatedBackend(3, **common), "train-b": SimulatedBackend(4, **common)}
    files = record_pods(pods, tmp)
    metrics = {pod: read_metrics(path) for pod, path in files.items()}
    # The steps that ran entirely while every pod was sampled (a busy machine may start late).
    first_us = max(float(m.dropna(subset=["sm_clock_mhz"])["ts_us"].min()) for m in metrics.values())
    last_us = min(float(m.dropna(subset=["sm_clock_mhz"])["ts_us"].max()) for m in metrics.values())
    steps = range(int((first_us - origin) // STEP_US) + 1, int((last_us - origin) // STEP_US))
    assert len(steps) >= 5, f"the sampler recorded too little: {first_us}..{last_us}"
    summaries = summaries_for("train-a", pods["train-a"], 0, steps) + summaries_for(
        "train-b", pods["train-b"], 3, steps
    )
    return Run(metrics, summaries, pods, files)


@pytest.fixture(scope="session")
def unhealthy_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Pod train-a: GPU 1 (rank 1) thermal-throttled, GPU 2 (rank 2) power-capped. Pod train-b:
    GPU 0 (rank 3) on a slow NVLink, GPU 1 (rank 4) at 40 % utilization with XID 79 and ECC errors,
    GPU 2 (rank 5) on a slow PCIe link, GPU 3 (rank 6) with its clock locked at 1.41 GHz."""
    return _run(tmp_path_factory.mktemp("unhealthy"), unhealthy=True)


@pytest.fixture(scope="session")
def healthy_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(tmp_path_factory.mktemp("healthy"), unhealthy=False)


@dataclass
class Profiled:
    """A real torch.profiler capture (CPU) of 3 steps while a throttled simulated GPU was sampled."""

    trace: Path  # Chrome trace JSON as torch exports it
    metrics: Path  # gpu-metrics.csv.gz


@pytest.fixture(scope="session")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Profiled:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    tmp = tmp_path_factory.mktemp("profiled")
    recorder = MetricsRecorder(SimulatedBackend(1, throttle={0: "thermal"}), 1000, margin_s=0.02)
    recorder.start()
    time.sleep(0.03)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)
    export = lambda p: p.export_chrome_trace(str(tmp / "trace.json"))  # noqa: E731 (read as the profiler's callback)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule, on_trace_ready=export) as prof:
        for _ in range(4):  # one warm-up step, three captured
            with torch.profiler.record_function("stepscope-marker"):
                torch.ones(64, 64) @ torch.ones(64, 64)
                time.sleep(0.04)
            prof.step()
    time.sleep(0.03)
    return Profiled(tmp / "trace.json", recorder.stop(tmp / "gpu-metrics.csv.gz"))
