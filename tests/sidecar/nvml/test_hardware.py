"""Hardware findings on simulated runs recorded by the real sampler (tests/sidecar/nvml/conftest.py)."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import msgspec
import numpy as np
import pytest

from stepscope.analysis.diagnosis.diagnose import diagnose
from stepscope.analysis.diagnosis.hardware import findings
from stepscope.analysis.loading.gpu_samples import read_metrics
from stepscope.analysis.model import decode_summary, encode
from stepscope.analysis.reporting.gpu_counters import counter_events
from stepscope.analysis.statistics.gpu_steps import step_statistics

from .conftest import COMM_FRACTION, Run, summaries_for


def by_rank(found: list, rank: int, text: str) -> list:
    return [f for f in found if rank in f.ranks and text in f.message]


def throughput(text: str, link: str) -> tuple[float, float]:
    match = re.search(rf"{link} ([\d.]+) GB/s during collectives against ([\d.]+) GB/s on its peers", text)
    assert match, text
    return float(match[1]), float(match[2])


def test_healthy_run_has_no_hardware_finding(healthy_run: Run) -> None:
    found, explanations = findings(healthy_run.summaries, healthy_run.metrics)
    assert found == [] and explanations == {}


def test_throttled_gpus_are_found_with_their_cause(unhealthy_run: Run) -> None:
    found, explanations = findings(unhealthy_run.summaries, unhealthy_run.metrics)
    thermal = by_rank(found, 1, "thermal")
    power = by_rank(found, 2, "power")
    assert len(thermal) == 1 and thermal[0].ranks == [1] and thermal[0].severity == "critical"
    assert len(power) == 1 and power[0].ranks == [2]
    assert "SM clock 1.10 GHz against 1.98 GHz on its peers" in thermal[0].message
    assert explanations[1] == "SM clock 1.10 GHz against 1.98 GHz on its peers, thermal throttling (91 °C)"
    assert explanations[2].endswith("power throttling (400 W)")
    assert not any(0 in f.ranks for f in found)


def test_clock_locked_below_its_peers(unhealthy_run: Run) -> None:
    found, explanations = findings(unhealthy_run.summaries, unhealthy_run.metrics)
    low = [f for f in found if f.message.startswith("GPU clock below")]
    assert len(low) == 1 and low[0].ranks == [6] and low[0].severity == "warning"
    assert explanations[6] == "SM clock 1.41 GHz against 1.98 GHz on its peers with no throttle reason"


def test_slow_links_during_collectives(unhealthy_run: Run) -> None:
    found, explanations = findings(unhealthy_run.summaries, unhealthy_run.metrics)
    nvlink = [f for f in found if f.message.startswith("slow NVLink")]
    pcie = [f for f in found if f.message.startswith("slow PCIe")]
    assert [f.ranks for f in nvlink] == [[3]] and [f.ranks for f in pcie] == [[5]]
    # 4 links x (TX + RX) x 20 GB/s while communicating, one fifth of that on the slow GPU (the
    # figures move a little with the sampler's scheduling on a busy machine).
    assert throughput(explanations[3], "NVLink") == pytest.approx((32.0, 160.0), rel=0.1)
    assert throughput(explanations[5], "PCIe") == pytest.approx((3.2, 16.0), rel=0.1)


def test_utilization_outlier(unhealthy_run: Run) -> None:
    found, explanations = findings(unhealthy_run.summaries, unhealthy_run.metrics)
    util = [f for f in found if f.message.startswith("GPU utilization")]
    assert len(util) == 1 and util[0].ranks == [4]
    assert "min 40 % / median 97 % / max 97 % across 7 workers" in util[0].message
    assert explanations[4].startswith("GPU utilization 40 % against a median of 97 %")


def test_xid_and_ecc_events(unhealthy_run: Run) -> None:
    found, _ = findings(unhealthy_run.summaries, unhealthy_run.metrics)
    xid = by_rank(found, 4, "XID 79")
    assert len(xid) == 1 and xid[0].severity == "critical" and "fallen off the bus" in xid[0].message
    dbe = by_rank(found, 4, "uncorrectable")
    sbe = by_rank(found, 4, "corrected (single-bit)")
    assert dbe[0].severity == "critical" and "2 new during the capture" in dbe[0].message
    assert sbe[0].severity == "warning" and "5 new" in sbe[0].message
    assert all(f.category == "hardware" for f in found)


def test_findings_are_scored_by_what_they_measure(unhealthy_run: Run) -> None:
    """A hardware finding's score is the share it measures (the clock, link or utilization missing
    against the peers'), 0 for events with no such measure, and the diagnosis orders by it as given."""
    found, _ = findings(unhealthy_run.summaries, unhealthy_run.metrics)
    scores = {f.message.split(":")[0] if "XID" not in f.message else "XID": f.score for f in found}
    assert scores["GPU clock throttling (thermal)"] == pytest.approx(1 - 1.10 / 1.98, abs=0.01)
    assert scores["GPU clock below its peers' (locked or lowered clocks, e.g. nvidia-smi -lgc)"] == pytest.approx(1 - 1.41 / 1.98, abs=0.01)
    assert scores["slow NVLink"] == pytest.approx(0.8, abs=0.05) and scores["slow PCIe"] == pytest.approx(0.8, abs=0.05)
    assert scores["XID"] == 0.0
    _, detailed = diagnose(unhealthy_run.summaries, hardware=unhealthy_run.metrics)
    assert {f.message: f.score for f in detailed if f.category == "hardware"} == {f.message: f.score for f in found}


def test_summaries_without_gpu_fall_back_to_local_rank(unhealthy_run: Run) -> None:
    summaries = [msgspec.structs.replace(s, gpu=-1) for s in unhealthy_run.summaries if s.pod == "train-a"]
    _, explanations = findings(summaries, unhealthy_run.metrics)
    assert "thermal" in explanations[1] and "power" in explanations[2]


def test_diagnosis_joins_the_explanation_into_the_slow_worker(unhealthy_run: Run) -> None:
    backend = unhealthy_run.backends["train-a"]
    steps = range(unhealthy_run.summaries[0].steps[0].step, unhealthy_run.summaries[0].steps[-1].step + 1)
    # Rank 1 (the thermal-throttled GPU) takes 1.5x as long per step as its peers.
    summaries = summaries_for("train-a", backend, 0, steps, slow={1: 1.5})
    diagnosis, detailed = diagnose(summaries, hardware=unhealthy_run.metrics)
    slow = [f for f in detailed if f.category == "slow-worker"]
    assert [f.ranks for f in slow] == [[1]]
    assert "SM clock 1.10 GHz against 1.98 GHz on its peers, thermal throttling" in slow[0].message
    assert any(f.category == "hardware" and 1 in f.ranks for f in diagnosis.findings)


def test_step_statistics_per_step(unhealthy_run: Run) -> None:
    summary = next(s for s in unhealthy_run.summaries if s.rank == 1)
    stats = step_statistics(unhealthy_run.metrics["train-a"], summary.steps, 1)
    n = len(summary.steps)
    assert all(len(v) == n for v in stats.values())
    assert stats["smClockMHzMean"] == [1100.0] * n and stats["smClockMHzMin"] == [1100.0] * n
    assert stats["throttleFraction"] == [1.0] * n and stats["thermalThrottleFraction"] == [1.0] * n
    assert stats["powerThrottleFraction"] == [0.0] * n
    assert stats["temperatureCMean"] == [91.0] * n and stats["gpuUtilPctMean"] == [97.0] * n
    # 8 NVLink counters x 20 GB/s during the communication share of each step.
    assert np.median(stats["nvlinkGBs"]) == pytest.approx(8 * 20 * COMM_FRACTION, rel=0.05)
    assert np.median(stats["pcieGBs"]) == pytest.approx(2 * 8 * COMM_FRACTION, rel=0.05)
    healthy = step_statistics(unhealthy_run.metrics["train-a"], summary.steps, 0)
    assert healthy["throttleFraction"] == [0.0] * n and healthy["smClockMHzMean"] == [1980.0] * n
    # It is what goes into RankSummary.hardware: it must survive the summary's JSON round trip.
    assert decode_summary(encode(msgspec.structs.replace(summary, hardware=stats))).hardware == stats


def test_step_statistics_without_samples_is_empty(unhealthy_run: Run) -> None:
    summary = next(s for s in unhealthy_run.summaries if s.rank == 1)
    assert step_statistics(unhealthy_run.metrics["train-a"], summary.steps, 7) == {}
    assert step_statistics(unhealthy_run.metrics["train-a"], [], 1) == {}


def test_counter_events_for_perfetto(unhealthy_run: Run) -> None:
    frame = unhealthy_run.metrics["train-a"]
    base_us = float(frame["ts_us"].min())
    events = counter_events(frame, "train-a", base_us=base_us)
    json.dumps(events)
    counters = [e for e in events if e["ph"] == "C"]
    names = {e["name"] for e in counters}
    for gpu in range(3):
        for track in ("SM clock (MHz)", "power (W)", "temperature (°C)", "GPU utilization (%)", "throttled", "NVLink (GB/s)", "PCIe (GB/s)"):
            assert f"GPU {gpu} {track}" in names
    assert {e["args"]["value"] for e in counters if e["name"] == "GPU 1 SM clock (MHz)"} == {1100.0}
    assert {e["args"]["value"] for e in counters if e["name"] == "GPU 1 throttled"} == {1.0}
    assert min(e["ts"] for e in counters) == 0.0
    nvlink = [e["args"]["value"] for e in counters if e["name"] == "GPU 0 NVLink (GB/s)"]
    assert max(nvlink) == pytest.approx(160.0, rel=0.05) and min(nvlink) == 0.0
    assert any(e["ph"] == "M" and e["args"].get("name") == "GPU metrics train-a" for e in events)


def test_read_metrics_bad_and_truncated_input(unhealthy_run: Run, tmp_path: Path) -> None:
    path = tmp_path / "m.csv.gz"
    unhealthy_run.metrics["train-b"].to_csv(path, index=False, compression="gzip")
    whole = read_metrics(path)
    assert len(whole) == len(unhealthy_run.metrics["train-b"]) and whole.attrs["warnings"] == []
    data = path.read_bytes()
    cut = read_metrics(data[: len(data) // 2])
    assert 0 < len(cut) < len(whole) and "truncated" in cut.attrs["warnings"][0]
    assert read_metrics(gzip.decompress(data)).shape == whole.shape  # plain CSV bytes work too
    with pytest.raises(ValueError, match="empty"):
        read_metrics(b"")
    with pytest.raises(ValueError, match="lacks column"):
        read_metrics(b"a,b\n1,2\n")
    with pytest.raises(ValueError):
        read_metrics(b"\x1f\x8bnot gzip at all")


def test_a_recording_without_rows_makes_no_finding(unhealthy_run: Run) -> None:
    empty = read_metrics(b"ts_us,gpu,sm_clock_mhz,clock_reasons\n")
    assert empty.empty
    assert findings(unhealthy_run.summaries, {"train-a": empty, "train-b": empty}) == ([], {})
    assert counter_events(empty, "train-a") == []
    assert step_statistics(empty, unhealthy_run.summaries[0].steps, 0) == {}
