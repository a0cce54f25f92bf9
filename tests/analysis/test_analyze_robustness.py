"""Bad ranks in a session: each gives a clear per-rank problem in the report, the others are
analysed, nothing crashes and nothing captured is changed. Real traces, real summariser."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from stepscope.analysis.gathering import session_files
from stepscope.analysis.model import encode
from stepscope.analysis.pipeline import analyze_uri
from stepscope.cli import main
from stepscope.testing.synthetic_ranks import make_summaries


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file() and "report" not in p.parts}


@pytest.fixture()
def broken_session(tmp_path: Path, shared_traces: Path) -> Path:
    root = tmp_path / "session"
    ranks = root / "ranks"
    ranks.mkdir(parents=True)
    pair = shared_traces / "hta__trace_filter_2rank"
    shutil.copy(pair / "sampled_rank-0.json.gz", ranks / "rank-0.trace.json.gz")
    (ranks / "rank-1.trace.json.gz").write_bytes((pair / "sampled_rank-1.json.gz").read_bytes()[:30_000])
    (ranks / "rank-2.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": '))
    (ranks / "rank-3.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    shutil.copy(next((shared_traces / "hta__critical_path_alexnet").glob("*.json.gz")), ranks / "rank-4.trace.json.gz")
    # rank 5 left nothing at all; rank 6 only its stacks (it hung before writing a trace)
    (ranks / "rank-6.stacks.json").write_text(json.dumps({"version": 1, "rank": 6, "step": 3, "secondsSinceStep": 320.0, "threads": [
        {"id": 1, "name": "MainThread", "main": True, "frames": [{"file": "train.py", "line": 5, "function": "load_batch"}]}]}))
    (ranks / "rank-7.summary.json").write_text('{"version": 1, "rank": 7, "kernels": [')
    return root


def test_every_bad_rank_is_reported_and_the_good_one_analysed(broken_session: Path):
    before = _files(broken_session)
    diagnosis = analyze_uri(str(broken_session), progress=False)
    assert _files(broken_session) == before
    document = json.loads((broken_session / "report" / "diagnosis.json").read_text())
    problems = {int(r): " | ".join(p) for r, p in document["problems"].items()}
    assert set(problems) >= {1, 2, 3, 4, 5, 6, 7}
    assert "rank-1.trace.json.gz" in problems[1] and ("truncated" in problems[1].lower() or "ended" in problems[1].lower())
    assert "rank-2.trace.json.gz" in problems[2]
    assert problems[5] == "no trace or summary was uploaded for this rank"
    assert "only Python stacks" in problems[6]
    assert "rank-7.summary.json is not a valid summary" in problems[7]
    assert 0 not in document["ranks"]["failed"]
    analysed = {r["rank"] for r in document["perRank"]}
    assert 0 in analysed and not analysed & {1, 2, 5, 6, 7}
    categories = {f.category for f in diagnosis.findings}
    assert {"trace", "hang"} <= categories
    assert any(f.category == "hang" and 6 in f.ranks for f in diagnosis.findings)
    assert (broken_session / "report" / "index.html").stat().st_size > 0
    assert 0 in document["mergedTrace"]["ranks"] and 1 not in document["mergedTrace"]["ranks"]


def test_folder_of_raw_traces_in_hta_layout(tmp_path: Path, shared_traces: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """A read-only folder of Kineto traces (HTA's layout): ranks come from the files, summarised in
    parallel processes (as large traces are); the report goes to --output."""
    monkeypatch.setattr(session_files, "PARALLEL_BYTES", 0)
    source = shared_traces / "hta__trace_filter_2rank"
    assert main(["analyze", str(source), "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    document = json.loads((tmp_path / "out" / "diagnosis.json").read_text())
    assert document["ranks"]["total"] == 2 and document["ranks"]["failed"] == []
    assert sorted(document["mergedTrace"]["ranks"]) == [0, 1]
    assert f"report: {tmp_path / 'out'}/index.html" in capsys.readouterr().out


def test_single_trace_file_and_a_report_that_cannot_be_written(tmp_path: Path, shared_traces: Path, capsys: pytest.CaptureFixture):
    trace = tmp_path / "run" / "rank_non_gpu.json.gz"
    trace.parent.mkdir()
    shutil.copy(next((shared_traces / "hta__rank_non_gpu").glob("*.json.gz")), trace)
    (tmp_path / "run" / "report").write_text("a file where the report folder should go")
    assert main(["analyze", str(trace), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot write the report" in err and "--output" in err
    assert main(["analyze", str(trace), "--no-progress", "--output", str(tmp_path / "out")]) == 0
    document = json.loads((tmp_path / "out" / "diagnosis.json").read_text())
    assert document["ranks"]["total"] == 1 and document["ranks"]["failed"] == []


def test_stacks_files_of_the_wrong_shape_are_per_rank_problems(tmp_path: Path, shared_traces: Path):
    root = tmp_path / "session"
    ranks = root / "ranks"
    ranks.mkdir(parents=True)
    shutil.copy(shared_traces / "hta__trace_filter_2rank" / "sampled_rank-0.json.gz", ranks / "rank-0.trace.json.gz")
    bad = {1: {"step": 3, "threads": "MainThread"},
           2: {"threads": [{"main": True, "frames": [1, "train.py"]}]},
           3: {"step": "three", "secondsSinceStep": "long", "threads": []},
           4: {"threads": ["MainThread"]}}
    for rank, body in bad.items():
        (ranks / f"rank-{rank}.stacks.json").write_text(json.dumps(body))
    (ranks / "rank-5.stacks.json").write_text(json.dumps({"version": 1, "rank": 5, "step": 3, "secondsSinceStep": 320.0, "threads": [
        {"id": 1, "name": "MainThread", "main": True, "frames": [{"file": "train.py", "line": None, "function": "load_batch"}]}]}))
    diagnosis = analyze_uri(str(root), progress=False)
    document = json.loads((root / "report" / "diagnosis.json").read_text())
    for rank in bad:
        assert any(f"rank-{rank}.stacks.json is not a stacks file" in p for p in document["problems"][str(rank)])
    hangs = [f for f in diagnosis.findings if f.category == "hang"]
    assert hangs[0].ranks == [5] and hangs[0].message == "rank 5 hung for 320 s at load_batch (train.py)"
    assert any(f.ranks == [0, 1, 2, 3, 4] and "left no readable stacks" in f.message for f in hangs)
    assert 0 in {r["rank"] for r in document["perRank"]}


def test_a_summary_claiming_another_ranks_number_keeps_its_files_rank(tmp_path: Path):
    root = tmp_path / "session"
    (root / "ranks").mkdir(parents=True)
    for rank, summary in enumerate(make_summaries(3)):
        summary.rank = 0 if rank == 2 else rank
        (root / "ranks" / f"rank-{rank}.summary.json").write_bytes(encode(summary))
    analyze_uri(str(root), progress=False)
    document = json.loads((root / "report" / "diagnosis.json").read_text())
    assert document["problems"] == {"2": ["ranks/rank-2.summary.json also says rank 0; shown as rank 2"]}
    assert sorted(r["rank"] for r in document["perRank"]) == [0, 1, 2]


@pytest.mark.parametrize("steps", [[], "negative", "zero"])
def test_summaries_without_usable_step_times_still_give_a_report(tmp_path: Path, steps):
    root = tmp_path / "session"
    (root / "ranks").mkdir(parents=True)
    for summary in make_summaries(3):
        if steps == []:
            summary.steps = []
        for row in summary.steps:
            row.durationUs = -1.0 if steps == "negative" else 0.0
        (root / "ranks" / f"rank-{summary.rank}.summary.json").write_bytes(encode(summary))
    analyze_uri(str(root), progress=False)
    document = json.loads((root / "report" / "diagnosis.json").read_text())
    assert document["ranks"]["failed"] == []
    assert "<h2>Median step time per rank</h2>" in (root / "report" / "index.html").read_text()


def test_summaries_with_a_negative_or_absurd_rank(tmp_path: Path):
    root = tmp_path / "session"
    (root / "ranks").mkdir(parents=True)
    summaries = make_summaries(4)
    summaries[2].rank, summaries[3].rank = -5, 1_000_000
    for rank, summary in enumerate(summaries):
        (root / "ranks" / f"rank-{rank}.summary.json").write_bytes(encode(summary))
    analyze_uri(str(root), progress=False)
    document = json.loads((root / "report" / "diagnosis.json").read_text())
    assert document["problems"] == {"2": ["ranks/rank-2.summary.json says rank -5; shown as rank 2"]}
    assert document["ranks"] == {"total": 4, "analysed": 4, "failed": []}
