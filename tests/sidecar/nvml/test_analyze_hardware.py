"""`stepscope analyze` on a session folder with NVML samples: findings and Perfetto counter tracks."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from stepscope.analysis.model import encode
from stepscope.analysis.pipeline import analyze_uri
from stepscope.analysis.statistics.summary import summarize_file
from stepscope.contracts import layout

from .conftest import Profiled, Run


def _session_of(run: Run, tmp_path: Path) -> Path:
    """A session folder holding the run's rank summaries (no metrics yet)."""
    session = tmp_path / "session"
    for summary in run.summaries:
        path = session / layout.rank_summary(summary.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode(summary))
    return session


def test_session_folder_with_gpu_metrics(unhealthy_run: Run, tmp_path: Path) -> None:
    session = _session_of(unhealthy_run, tmp_path)
    for pod, file in unhealthy_run.files.items():
        target = session / layout.node_metrics(pod)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(file, target)

    diagnosis = analyze_uri(str(session), progress=False)

    hardware = [f for f in diagnosis.findings if f.category == "hardware"]
    assert {r for f in hardware for r in f.ranks} == {1, 2, 3, 4, 5, 6}
    assert any("XID 79" in f.message and f.severity == "critical" for f in hardware)
    with gzip.open(session / layout.REPORT_MERGED_TRACE) as f:
        merged = json.load(f)
    counters = [e for e in merged["traceEvents"] if e.get("ph") == "C"]
    names = {e["name"] for e in counters}
    assert {"GPU 1 SM clock (MHz)", "GPU 0 NVLink (GB/s)", "GPU 2 PCIe (GB/s)"} <= names
    assert {e["pid"] for e in counters} and len({e["pid"] for e in counters}) == 2  # one track group per pod
    throttled = [e["args"]["value"] for e in counters if e["name"] == "GPU 1 SM clock (MHz)"]
    assert 1100.0 in throttled


def test_counter_tracks_line_up_with_the_rank_in_the_merged_trace(profiled: Profiled, tmp_path: Path) -> None:
    session = tmp_path / "session"
    trace = session / layout.rank_trace(0)
    trace.parent.mkdir(parents=True)
    trace.write_bytes(gzip.compress(profiled.trace.read_bytes()))
    summary = summarize_file(trace, rank=0, pod="train-0")
    (session / layout.rank_summary(0)).write_bytes(encode(summary))
    metrics = session / layout.node_metrics("train-0")
    metrics.parent.mkdir(parents=True)
    shutil.copy(profiled.metrics, metrics)

    analyze_uri(str(session), progress=False)

    with gzip.open(session / layout.REPORT_MERGED_TRACE) as f:
        events = json.load(f)["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep") and e.get("ph") == "X"]
    clock = [e for e in events if e.get("ph") == "C" and e["name"] == "GPU 0 SM clock (MHz)"]
    throttled = [e for e in events if e.get("ph") == "C" and e["name"] == "GPU 0 throttled"]
    assert len(steps) == 3 and clock and throttled
    # The sampler ran from before the first step to after the last, on the same time base.
    first, last = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    assert clock[0]["ts"] < first and clock[-1]["ts"] > last
    assert last - first < 1e6  # three ~40 ms steps, not an epoch-sized offset


def test_bad_gpu_metrics_files_are_problems_of_their_pods_ranks(unhealthy_run: Run, tmp_path: Path) -> None:
    session = _session_of(unhealthy_run, tmp_path)
    pods = {s.pod: [] for s in unhealthy_run.summaries}
    for s in unhealthy_run.summaries:
        pods[s.pod].append(s.rank)
    truncated, wrong = sorted(unhealthy_run.files)
    for pod in (truncated, wrong):
        (session / layout.node_metrics(pod)).parent.mkdir(parents=True, exist_ok=True)
    whole = unhealthy_run.files[truncated].read_bytes()
    (session / layout.node_metrics(truncated)).write_bytes(whole[: len(whole) // 2])
    (session / layout.node_metrics(wrong)).write_bytes(gzip.compress(b"ts_us,sm_clock_mhz\n1,1400\n"))

    analyze_uri(str(session), progress=False)

    problems = json.loads((session / layout.REPORT_DIAGNOSIS).read_text())["problems"]
    for rank in pods[truncated]:
        assert any(f"GPU metrics of pod {truncated}" in p and "truncated" in p for p in problems[str(rank)])
    for rank in pods[wrong]:
        assert any(f"GPU metrics of pod {wrong} unreadable" in p and "lacks column(s) ['gpu']" in p for p in problems[str(rank)])


def test_gpu_metrics_with_only_the_required_columns(unhealthy_run: Run, tmp_path: Path) -> None:
    session = _session_of(unhealthy_run, tmp_path)
    for pod in unhealthy_run.files:
        target = session / layout.node_metrics(pod)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.compress(b"ts_us,gpu\n" + b"".join(b"%d,%d\n" % (t, g) for t in range(0, 10**7, 10**5) for g in range(4))))

    diagnosis = analyze_uri(str(session), progress=False)

    assert not [f for f in diagnosis.findings if f.category == "hardware"]
