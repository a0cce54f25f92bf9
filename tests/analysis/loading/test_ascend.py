"""Ascend NPU captures (torch_npu's `*_ascend_pt` folders) read by `stepscope analyze`: the per-step
compute / communication / overlap / free table against the capture's own step_trace_time.csv, the
rank from profiler_info_<rank>.json, the diagnosis, and bad captures reported without a traceback.

The real captures are MindStudio Insight's test data (two ranks of an ImageNet AlexNet training
step on Ascend NPUs, profiler levels 0, 1 and 2; docs/architecture.md names the repository, path
and commit), read from $STEPSCOPE_EXTDATA/ascend/msinsight (default: ../extdata next to the checkout);
the tests on them skip without it. The small capture of the other tests is written here by the
documented schema.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from stepscope.analysis.loading.ascend import capture_rank, load_capture
from stepscope.analysis.loading.trace import Limits
from stepscope.analysis.pipeline import EXIT_OK
from stepscope.analysis.statistics.gpu_scope import COMM, kernel_type
from stepscope.analysis.statistics.summary import summarize, summarize_file
from stepscope.cli import main
from tests.conftest import REPO

EXTDATA = Path(os.environ.get("STEPSCOPE_EXTDATA", REPO.parent / "extdata"))
MSINSIGHT = EXTDATA / "ascend" / "msinsight" / "test" / "data" / "pytorch" / "text"
REAL = [f"level{level}/rank{rank}_ascend_pt" for level in (0, 1, 2) for rank in (0, 1)]
# step_trace_time.csv sums trace_view.json's overlap intervals, written to the ns: its figures and
# ours (from kernel_details.csv) may differ by the rounding of a few interval ends.
TOLERANCE_US = 0.5


def _real(folder: str) -> Path:
    path = MSINSIGHT / folder
    if not (path / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv").is_file():
        pytest.skip(
            f"real Ascend capture not found at {path} (MindStudio Insight's test/data/pytorch/text; set "
            "STEPSCOPE_EXTDATA)"
        )
    return path


def _reference(folder: Path) -> list[dict[str, float]]:
    with (folder / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv").open() as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


@pytest.mark.parametrize("folder", REAL)
def test_real_capture_matches_its_step_trace_time(folder: str):
    path = _real(folder)
    summary = summarize(load_capture(path))
    assert summary.rank == int(folder[-11]) and not summary.error
    ref = _reference(path)
    assert [s.step for s in summary.steps] == [int(r["Step"]) for r in ref]
    for step, r in zip(summary.steps, ref):
        assert step.computingUs == pytest.approx(r["Computing"], abs=TOLERANCE_US)
        assert step.communicationUs == pytest.approx(r["Communication"], abs=TOLERANCE_US)
        assert step.overlappedUs == pytest.approx(r["Overlapped"], abs=TOLERANCE_US)
        assert step.commNotOverlappedUs == pytest.approx(r["Communication(Not Overlapped)"], abs=TOLERANCE_US)
        # Ascend's Free and Stage are the device's: from the step's first device task to its last.
        assert step.idleUs == pytest.approx(r["Free"], abs=TOLERANCE_US)
        assert step.idleUs + step.computeUs + step.nonComputeUs == pytest.approx(r["Stage"], abs=TOLERANCE_US)
        # stepscope's free is the ProfilerStep's: the device's free time, its preparing and its tail.
        assert step.freeUs == pytest.approx(
            step.durationUs - r["Computing"] - r["Communication(Not Overlapped)"], abs=TOLERANCE_US
        )
        assert step.freeUs > r["Free"] + r["Preparing"] - TOLERANCE_US


def test_analyze_reads_a_folder_of_real_captures(tmp_path: Path, capsys: pytest.CaptureFixture):
    source = _real("level1/rank0_ascend_pt").parent
    assert main(["analyze", str(source), "--output", str(tmp_path), "--no-progress"]) == EXIT_OK
    with (tmp_path / "step_trace_time.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["Rank"]) for r in rows] == [0, 1]
    for row in rows:
        ref = _reference(source / f"rank{row['Rank']}_ascend_pt")[0]
        assert float(row["Computing"]) == pytest.approx(ref["Computing"], abs=TOLERANCE_US)
        assert float(row["Communication(Not Overlapped)"]) == pytest.approx(
            ref["Communication(Not Overlapped)"], abs=TOLERANCE_US
        )
    diagnosis = json.loads((tmp_path / "diagnosis.json").read_text())
    comm = [f for f in diagnosis["findings"] if f["category"] == "communication"]
    assert comm and "not overlapped" in comm[0]["message"] and comm[0]["ranks"] == [0, 1]
    with (tmp_path / "communication.csv").open() as f:
        assert {r["Rank"] for r in csv.DictReader(f)} == {"0", "1"}
    # Its times are strings of epoch µs, which the merged trace's rewriting does not move.
    assert (
        set(diagnosis["mergedTrace"]["leftOut"]) == {"0", "1"}
        and "Ascend capture" in diagnosis["mergedTrace"]["leftOut"]["0"]
    )
    assert "Traceback" not in capsys.readouterr().err


def _write_capture(root: Path, rank: int = 3, kernels: str | None = None) -> Path:
    """A capture by Ascend's documented layout: trace_view.json a bare array with string epoch-µs
    times, kernel_details.csv one row per device kernel (HCCL rows the collectives)."""
    folder = root / "node1_4242_20250101000000000_ascend_pt"
    out = folder / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (folder / f"profiler_info_{rank}.json").write_text(json.dumps({"config": {}, "rank_id": rank}))
    t0 = 1736408883000000
    host = [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "Python"}},
        {"ph": "X", "name": "ProfilerStep#4", "cat": "cpu_op", "pid": 7, "tid": 7, "ts": f"{t0}.000", "dur": 1000.0},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 7, "tid": 7, "ts": f"{t0 + 10}.125", "dur": 20.5},
        {"ph": "X", "name": "Computing", "pid": 9, "tid": 0, "ts": f"{t0 + 100}.000", "dur": 300.0},
        {"ph": "s", "name": "async_npu", "cat": "async_npu", "id": 1, "pid": 7, "tid": 7, "ts": f"{t0 + 10}.125"},
    ]
    (out / "trace_view.json").write_text(json.dumps(host))
    # Step 4 on the device: compute 100-400 and 750-850, a collective 300-700: 400 µs computing,
    # 400 communicating, 100 of it overlapped, device span 100-850 with 50 µs free in it.
    (out / "kernel_details.csv").write_text(
        kernels
        if kernels is not None
        else (
            "Step Id,Name,Type,Accelerator Core,Start Time(us),Duration(us),Wait Time(us),Block Dim\n"
            f"4,MatMul_1,MatMulV2,AI_CORE,{t0 + 100}.000\t,300.0,0,8\n"
            f"4,hcom_allReduce__1_0_1,hcom_allReduce_,HCCL,{t0 + 300}.000\t,400.0,0,0\n"
            f"4,Add_2,Add,AI_VECTOR_CORE,{t0 + 750}.000\t,100.0,0,8\n"
        )
    )
    return folder


def test_documented_schema_capture(tmp_path: Path):
    folder = _write_capture(tmp_path)
    assert capture_rank(folder) == 3
    trace = load_capture(folder)
    assert trace.base_ns == 1736408883000000 * 1000
    summary = summarize(trace)
    assert summary.rank == 3 and summary.hasGpu
    (step,) = summary.steps
    assert (step.step, step.durationUs) == (4, 1000.0)
    assert (step.computingUs, step.communicationUs, step.overlappedUs, step.commNotOverlappedUs) == (
        400.0,
        400.0,
        100.0,
        300.0,
    )
    assert step.idleUs == 50.0 and step.freeUs == 1000.0 - 400.0 - 300.0
    assert kernel_type("hcom_allReduce__1_0_1") == COMM and summary.collectives
    assert summary.criticalPath is None  # no kernel has a launching call linked
    # The time of a host event keeps its digits: 10.125 µs after the step's start.
    ops = [i for i, n in enumerate(trace.names) if n == "aten::mm"]
    assert trace.ts[trace.name == ops[0]][0] == 10.125


def test_analyze_a_single_capture_folder(tmp_path: Path):
    folder = _write_capture(tmp_path / "in")
    assert main(["analyze", str(folder), "--output", str(tmp_path / "out"), "--no-progress"]) == EXIT_OK
    with (tmp_path / "out" / "step_trace_time.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert (row["Rank"], row["Step"], float(row["Computing"]), float(row["Overlapped"])) == ("3", "4", 400.0, 100.0)


@pytest.mark.parametrize(
    "kernels, why",
    [
        (None, "no such file"),
        ("Name,Type\nMatMul,MatMulV2\n", "not a kernel_details.csv"),
    ],
)
def test_a_bad_capture_is_an_error_not_a_traceback(tmp_path: Path, kernels: str | None, why: str):
    folder = _write_capture(tmp_path, kernels=kernels or "")
    if kernels is None:
        (folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").unlink()
    summary = summarize_file(folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
    assert why in summary.error and summary.rank == -1


def test_corrupt_trace_view_and_caps(tmp_path: Path):
    folder = _write_capture(tmp_path)
    view = folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    good = view.read_text()
    view.write_text(good[: len(good) // 2])
    assert "invalid JSON" in summarize_file(view).error
    view.write_text(good)
    capped = load_capture(folder, Limits(max_bytes=1 << 20, max_events=1))
    assert any("cut after 1 host events" in w for w in capped.warnings)
    assert any("cut after 1 kernels" in w for w in capped.warnings)
