"""The critical path (metrics/critical_path.py) against HTA 0.5.0's critical_path_analysis on the
shared real traces, computed here by HTA in its own virtual environment (benchmarks/analysis_vs_hta.py
creates it under ~/.cache/stepscope/hta-venv); skipped without it. The summary, the report's table
and its section need no HTA.

Tolerance: on the traces of EXACT the path's length, its edge count and its time by bound equal
HTA's to the µs. On TIED, the length is equal and HTA's choice between equally long paths (its
graph's insertion order) moves time between bounds. On CLOSE the length is within the stated
fraction (ROCm and a trace whose kernels tie on a stream, where the kernel order differs).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stepscope.analysis.metrics.critical_path import critical_path
from stepscope.analysis.metrics.gpu_scope import HTA_COMM_KERNELS, gpu_scope
from stepscope.analysis.metrics.summary import summarize
from stepscope.analysis.metrics.trace import load_trace
from stepscope.analysis.reporting.report_html import _critical_path
from stepscope.analysis.reporting.report_tables import critical_path as critical_path_table
from tests.conftest import SHARED

HTA_PYTHON = Path.home() / ".cache" / "stepscope" / "hta-venv" / "bin" / "python"
TRACES = SHARED / "data" / "traces"
EXACT = ["hta__critical_path_alexnet", "hta__amd_mi250", "hta__nccl_parser_config", "hta__ns_resolution",
         "hta__trace_filter_2rank", "hta__triton_example", "hta__with_gpu_user_annotation", "tracelens__b200_eager_trace",
         "hta__trace_diff_control", "hta__df_index_resolver"]
TIED = ["hta__negative_queue_length"]
CLOSE = {"hta__trace_diff_test": 0.001, "tracelens__mi300_resnet_act_checkpoint": 0.01}
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
    out[folder] = {"ok": bool(ok), "total": int(b.duration.sum()), "edges": len(b), "by": {k: int(v) for k, v in by.items()}}
print(json.dumps(out))
"""


def _ours(name: str):
    trace = load_trace(sorted((TRACES / name).iterdir())[0])
    return critical_path(trace, gpu_scope(trace, HTA_COMM_KERNELS).rows)


@pytest.fixture(scope="module")
def hta() -> dict:
    if not HTA_PYTHON.exists():
        pytest.skip(f"HTA's virtual environment ({HTA_PYTHON}) is missing: the reference is computed by HTA itself")
    if not TRACES.is_dir():
        pytest.skip(f"the shared real traces ({TRACES}) are missing")
    folders = [str(TRACES / n) for n in EXACT + TIED + list(CLOSE)]
    done = subprocess.run([str(HTA_PYTHON), "-c", HTA_SCRIPT, *folders], capture_output=True, text=True, timeout=900, check=True)
    return {Path(k).name: v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("name", EXACT)
def test_equal_to_hta(hta: dict, name: str):
    ref = hta[name]
    path = _ours(name)
    assert ref["ok"] and path is not None
    assert path.total_us == ref["total"]
    assert len(path.weight) == ref["edges"]
    assert {k: int(v) for k, v in path.breakdown().items() if v} == {k: v for k, v in ref["by"].items() if v}


@pytest.mark.parametrize("name", TIED)
def test_length_equal_to_hta_where_paths_tie(hta: dict, name: str):
    path = _ours(name)
    assert path is not None and path.total_us == hta[name]["total"]
    assert set(path.breakdown()) <= set(hta[name]["by"]) | {""}


@pytest.mark.parametrize("name", list(CLOSE))
def test_length_close_to_hta(hta: dict, name: str):
    path = _ours(name)
    assert path is not None
    assert abs(path.total_us - hta[name]["total"]) <= CLOSE[name] * hta[name]["total"]


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
    assert len(cp.spans) == 200 and all(d > 0 for _, d, _ in cp.spans)
    table = critical_path_table([summary])
    assert table.loc[table["Name"] == "", "Time(us)"].sum() == cp.totalUs
    html = _critical_path(table).table
    assert html is not None and html.rows[0][1].text == "43,355.65" and html.rows[0][2].text == "99.8"


def test_cpu_only_trace_has_a_cpu_path():
    """Where HTA fails (no kernel events), the path is the CPU's own."""
    trace_dir = TRACES / "hta__rank_non_gpu"
    if not trace_dir.is_dir():
        pytest.skip(f"the shared real traces ({TRACES}) are missing")
    path = _ours("hta__rank_non_gpu")
    assert path is not None and path.total_us > 0 and set(path.breakdown()) == {"cpu_bound"}
