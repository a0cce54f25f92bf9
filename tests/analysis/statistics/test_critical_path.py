"""The critical path (metrics/critical_path.py) against HTA 0.5.0's critical_path_analysis on the
shared real traces, computed here by HTA in its own virtual environment (benchmarks/analysis_vs_hta.py
creates it under ~/.cache/stepscope/hta-venv); skipped without it. The summary, the report's table
and its section need no HTA.

Tolerance: none. On every shared trace HTA computes a path for, the path's length, its edge count
and its time by bound equal HTA's to the µs, once one artefact of HTA's report is accounted for: a
sub-µs kernel rounded inwards ends a µs before it starts; HTA's longest-path search weighs its edge
0, but its breakdown reports the edge's original -1 µs (2 traces, 17 and 21 such kernels on the path).
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.diagnosis.rank_tables import build_tables
from stepscope.analysis.loading.trace import load_trace
from stepscope.analysis.pipeline import EXIT_OK
from stepscope.analysis.reporting.html import _critical_path
from stepscope.analysis.reporting.merged_trace import path_pid
from stepscope.analysis.reporting.tables import critical_path as critical_path_table
from stepscope.analysis.statistics.critical_path import OPERATOR, CriticalPath, critical_path
from stepscope.analysis.statistics.gpu_scope import HTA_COMM_KERNELS, gpu_scope
from stepscope.analysis.statistics.summary import summarize
from stepscope.cli import main
from tests.analysis.statistics.test_statistics import ev, gpu
from tests.conftest import SHARED

HTA_PYTHON = Path.home() / ".cache" / "stepscope" / "hta-venv" / "bin" / "python"
TRACES = SHARED / "data" / "traces"
HTA_TRACES = [
    "hta__critical_path_alexnet",
    "hta__amd_mi250",
    "hta__nccl_parser_config",
    "hta__ns_resolution",
    "hta__trace_filter_2rank",
    "hta__triton_example",
    "hta__with_gpu_user_annotation",
    "tracelens__b200_eager_trace",
    "hta__trace_diff_control",
    "hta__df_index_resolver",
    "hta__negative_queue_length",
    "hta__trace_diff_test",
    "tracelens__mi300_resnet_act_checkpoint",
    "tracelens__h100_Qwen_Qwen1.5-0.5B-Chat__1016005",
]
HTA_SCRIPT = """
import json, logging, sys, warnings
logging.disable(logging.WARNING); warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
out = {}
for folder in sys.argv[1:]:
    at = TraceAnalysis(trace_dir=folder)
    graph, ok = at.critical_path_analysis(rank=sorted(at.t.traces)[0], annotation="", instance_id=None)
    b = graph.get_critical_path_breakdown()
    by = b[b.bound_by != ""].groupby("bound_by").duration.sum()
    out[folder] = {
        "ok": bool(ok), "total": int(b.duration.sum()), "edges": len(b), "by": {k: int(v) for k, v in by.items()}
    }
print(json.dumps(out))
"""


def _ours(name: str) -> tuple[CriticalPath | None, np.ndarray]:
    """Our path of the trace, and which of its edges are kernels of a negative rounded duration."""
    trace = load_trace(sorted((TRACES / name).iterdir())[0])
    path = critical_path(trace, gpu_scope(trace, HTA_COMM_KERNELS).rows, hta=True)
    if path is None:
        return None, np.zeros(0, bool)
    row = np.maximum(path.row, 0)
    negative = (path.kind == OPERATOR) & (path.row >= 0) & (trace.stream[row] != -1) & (np.rint(trace.dur[row]) < 0)
    return path, negative


@pytest.fixture(scope="module")
def hta() -> dict:
    if not HTA_PYTHON.exists():
        pytest.skip(f"HTA's virtual environment ({HTA_PYTHON}) is missing: the reference is computed by HTA itself")
    if not TRACES.is_dir():
        pytest.skip(f"the shared real traces ({TRACES}) are missing")
    folders = [str(TRACES / n) for n in HTA_TRACES]
    done = subprocess.run(
        [str(HTA_PYTHON), "-c", HTA_SCRIPT, *folders], capture_output=True, text=True, timeout=900, check=True
    )
    return {Path(k).name: v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("name", HTA_TRACES)
def test_equal_to_hta(hta: dict, name: str):
    ref = hta[name]
    path, negative = _ours(name)
    assert ref["ok"] and path is not None
    assert path.total_us - int(negative.sum()) == ref["total"]
    assert len(path.weight) == ref["edges"]
    ours = {k: int(v) for k, v in path.breakdown().items()}
    ours["gpu_compute_bound"] = ours.get("gpu_compute_bound", 0) - int(negative.sum())
    assert {k: v for k, v in ours.items() if v} == {k: v for k, v in ref["by"].items() if v}


def test_cuda_graph_kernels_are_all_on_the_path_by_default():
    """HTA keeps one kernel of each cudaGraphLaunch (the one its call is linked to); stepscope's own
    path chains them all along their stream, and is the longer for it."""
    trace_dir = TRACES / "hta__trace_diff_test"
    if not trace_dir.is_dir():
        pytest.skip(f"the shared real traces ({TRACES}) are missing")
    trace = load_trace(sorted(trace_dir.iterdir())[0])
    rows = gpu_scope(trace, HTA_COMM_KERNELS).rows
    ours, theirs = critical_path(trace, rows), critical_path(trace, rows, hta=True)
    assert ours is not None and theirs is not None
    assert ours.total_us == 350_139 and theirs.total_us == 350_052
    assert ours.breakdown()["gpu_compute_bound"] > theirs.breakdown()["gpu_compute_bound"]


def test_alexnet_summary_and_report_table():
    """HTA's figures for this trace (43,355,655 µs, 99.83 % CPU-bound) reach the summary, the
    report's critical_path.csv and its section."""
    trace_dir = TRACES / "hta__critical_path_alexnet"
    if not trace_dir.is_dir():
        pytest.skip(f"the shared real traces ({TRACES}) are missing")
    summary = summarize(load_trace(sorted(trace_dir.iterdir())[0]))
    cp = summary.criticalPath
    assert cp is not None and cp.totalUs == 43_355_655
    assert round(100 * cp.byBound["cpu_bound"] / cp.totalUs, 2) == 99.83
    assert cp.top[0].name == "cudaDeviceGetStreamPriorityRange" and cp.top[0].boundBy == "cpu_bound"
    assert sum(p.us for p in cp.top) <= cp.totalUs
    assert len(cp.spans) == 200 and all(d > 0 for _, d, _, _ in cp.spans)
    table = critical_path_table(build_tables([summary]))
    assert table.loc[table["Name"] == "", "Time(us)"].sum() == cp.totalUs
    html = _critical_path(table, set()).table
    assert html is not None and html.rows[0][1].text == "43,355.65" and html.rows[0][2].text == "99.8"


def test_cpu_only_trace_has_a_cpu_path():
    """Where HTA fails (no kernel events), the path is the CPU's own."""
    trace_dir = TRACES / "hta__rank_non_gpu"
    if not trace_dir.is_dir():
        pytest.skip(f"the shared real traces ({TRACES}) are missing")
    path, _ = _ours("hta__rank_non_gpu")
    assert path is not None and path.total_us > 0 and set(path.breakdown()) == {"cpu_bound"}


def test_merged_trace_has_the_path_as_a_track(tmp_path: Path):
    """`stepscope analyze` puts each rank's critical path in the merged trace: a process of its own
    with the path's longest parts as slices on the rank's time base, named after what they are."""
    trace_dir = TRACES / "hta__critical_path_alexnet"
    if not trace_dir.is_dir():
        pytest.skip(f"the shared real traces ({TRACES}) are missing")
    assert main(["analyze", str(trace_dir), "--output", str(tmp_path), "--no-progress"]) == EXIT_OK
    with gzip.open(tmp_path / "merged.trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    path = [e for e in events if e.get("cat") == "critical_path"]
    pid = path_pid(0)
    assert len(path) == 200 and {e["pid"] for e in path} == {pid}
    names = {e["args"].get("name", "") for e in events if e.get("ph") == "M" and e["pid"] == pid}
    assert "rank 0: critical path" in names and any(n.startswith("critical path: 43,355.65 ms") for n in names)
    longest = max(path, key=lambda e: e["dur"])
    assert longest["name"] == "cudaDeviceGetStreamPriorityRange" and longest["args"]["boundBy"] == "cpu_bound"
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert min(e["ts"] for e in path) >= min(
        e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") != "critical_path"
    )
    assert max(e["ts"] + e["dur"] for e in path) <= max(e["ts"] + e["dur"] for e in kernels + path)
    assert sum(e["dur"] for e in path) <= 43_355_655


def test_report_section_in_a_real_browser(tmp_path: Path):
    """The report's critical path section as headless Chromium renders it (its scripts run)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    trace_dir = TRACES / "hta__critical_path_alexnet"
    if chromium is None or not trace_dir.is_dir():
        pytest.skip("needs Chromium (Debian's chromium package) and the shared real traces")
    assert main(["analyze", str(trace_dir), "--output", str(tmp_path), "--no-progress"]) == EXIT_OK
    dom = subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--dump-dom", (tmp_path / "index.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    section = dom[dom.index("<h2>Critical path</h2>") :]
    section = section[: section.index("</section>")]
    assert "<th>GPU compute %</th>" in section and ">43,355.65<" in section and ">99.8<" in section
    assert "cudaDeviceGetStreamPriorityRange 69.0%" in section


def test_small_graph_by_hand(tmp_path: Path):
    """A launch, a kernel and a synchronisation: the CPU runs 0-100 (a launch at 10-15, a
    cudaStreamSynchronize 20-90), the kernel 40-80 on stream 7. The path is the CPU to the launch,
    its delay, the kernel, then the sync's end (the wait weighs 0) and the CPU after it; a trace of
    annotations alone has no path and its summary says nothing of one."""
    events = [
        ev("cpu_op", "aten::step", 0, 100),
        ev("cuda_runtime", "cudaLaunchKernel", 10, 5, correlation=1),
        ev("cuda_runtime", "cudaStreamSynchronize", 20, 70, correlation=2),
        gpu("gemm", 40, 40, 1),
        ev("cuda_sync", "Stream Sync", 79, 11, tid=7, pid=0, stream=7, correlation=2),
    ]
    path_file = tmp_path / "rank-0.json"
    path_file.write_text(json.dumps({"traceEvents": events}))
    path = critical_path(load_trace(path_file))
    assert path is not None
    assert path.breakdown() == {"cpu_bound": 10 + 10, "gpu_kernel_launch_overhead": 30, "gpu_compute_bound": 40}
    assert path.total_us == 90  # 0-10 on the CPU, launch 10->40, kernel 40-80, sync end 90 -> op end 100
    annotations = tmp_path / "rank-1.json"
    annotations.write_text(
        json.dumps(
            {
                "traceEvents": [
                    ev("user_annotation", "ProfilerStep#1", 0, 100),
                    ev("user_annotation", "gloo:all_reduce", 10, 80),
                ]
            }
        )
    )
    trace = load_trace(annotations)
    assert critical_path(trace) is None
    summary = summarize(trace)
    assert summary.criticalPath is None and not any("critical path" in w for w in summary.warnings)
