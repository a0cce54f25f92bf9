"""`stepscope analyze` end to end on session folders and through S3 (moto over real HTTP):
report files written and parseable, per-rank problems reported, nothing captured changed."""
from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import boto3
import pandas as pd
import pytest

from stepscope.analysis.model import encode
from stepscope.analysis.pipeline import EXIT_PARTIAL, AnalysisError, analyze_uri
from stepscope.cli import main
from stepscope.testing.synthetic_ranks import make_summaries
from tests.storage.conftest import moto_endpoint  # noqa: F401  (moto's S3 server over HTTP, one per module)

REPORT_FILES = {"diagnosis.json", "index.html", "step_trace_time.csv", "kernel_details.csv", "op_statistic.csv", "communication.csv", "merged.trace.json.gz"}


def _stacks(rank: int, function: str) -> dict:
    return {"version": 1, "rank": rank, "step": 12, "secondsSinceStep": 400.0,
            "threads": [{"id": 1, "name": "MainThread", "main": True, "frames": [{"file": "train.py", "line": 9, "function": function}]}]}


@pytest.fixture()
def session(tmp_path: Path, shared_traces: Path) -> Path:
    """8 ranks, rank 5's kernels 1.3x longer; rank 6 left nothing; rank 3's stacks file is cut
    short; ranks 0 and 1 kept their raw traces (real Kineto files); rank 7 has a cut trace."""
    root = tmp_path / "default" / "demo-1a2b3c4d"
    ranks = root / "ranks"
    ranks.mkdir(parents=True)
    for s in make_summaries(8, slow_rank=5, kernel_factor=1.3, seed=21):
        if s.rank != 6:
            (ranks / f"rank-{s.rank}.summary.json").write_bytes(encode(s))
    pair = shared_traces / "hta__trace_filter_2rank"
    shutil.copy(pair / "sampled_rank-0.json.gz", ranks / "rank-0.trace.json.gz")
    shutil.copy(pair / "sampled_rank-1.json.gz", ranks / "rank-1.trace.json.gz")
    (ranks / "rank-7.trace.json.gz").write_bytes((pair / "sampled_rank-1.json.gz").read_bytes()[:20_000])
    (ranks / "rank-3.stacks.json").write_text('{"version": 1, "rank": 3, "thre')
    (root / "session.json").write_text("{}")
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file() and "report" not in p.parts}


def _check_report(report: Path, *, charts: bool = True) -> dict:
    assert REPORT_FILES <= {p.name for p in report.iterdir()}
    document = json.loads((report / "diagnosis.json").read_text())
    for name in REPORT_FILES - {"diagnosis.json", "index.html", "merged.trace.json.gz"}:
        pd.read_csv(report / name)
    page = (report / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert ("<svg" in page) == charts
    # Self-contained: nothing is fetched from elsewhere.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//|@import""", page, re.I)
    return document


def test_session_folder_report(session: Path):
    before = _snapshot(session)
    diagnosis = analyze_uri(str(session), progress=False)
    assert _snapshot(session) == before
    assert [w.rank for w in diagnosis.slowWorkers] == [5]
    assert diagnosis.summary.startswith("rank 5 holds its peers back, they wait ")
    document = _check_report(session / "report")
    assert document["ranks"] == {"total": 8, "analysed": 7, "failed": [6]}
    problems = document["problems"]
    assert "rank-3.stacks.json cannot be read" in problems["3"][0]
    assert problems["6"] == ["no trace or summary was uploaded for this rank"]
    assert any("left out of the merged trace" in p for p in problems["7"])
    assert document["mergedTrace"]["ranks"] == [0, 1]
    assert document["findings"][0]["category"] == "slow-worker"
    page = (session / "report" / "index.html").read_text()
    assert "<h2>Slow workers</h2><h3>rank 5</h3>" in page and "volta_sgemm" in page

    steps = pd.read_csv(session / "report" / "step_trace_time.csv")
    assert sorted(steps["Rank"].unique()) == [0, 1, 2, 3, 4, 5, 7] and len(steps) == 7 * 4
    kernels = pd.read_csv(session / "report" / "kernel_details.csv")
    slow = kernels[(kernels["Rank"] == 5) & (kernels["Type"] == "COMP")]
    assert slow["Ratio To Peers"].between(1.2, 1.4).all()

    with gzip.open(session / "report" / "merged.trace.json.gz") as f:
        merged = json.load(f)["traceEvents"]
    originals = [json.loads(gzip.decompress((session / "ranks" / f"rank-{r}.trace.json.gz").read_bytes()))["traceEvents"] for r in (0, 1)]
    assert len(merged) >= sum(len(o) for o in originals)
    pids = {e["pid"] for e in merged}
    # Each rank's pids start with 1 (2 for the traces' string pids) and its rank in five digits.
    assert {str(p)[1:6] for p in pids} == {"00000", "00001"} and {str(p)[0] for p in pids} == {"1", "2"}
    assert len(pids) == sum(len({e["pid"] for e in o}) for o in originals)
    names = [e["args"]["name"] for e in merged if e.get("ph") == "M" and e["name"] == "process_name"]
    assert any(n.startswith("rank 0: ") for n in names) and any(n.startswith("rank 1: ") for n in names)
    flows0 = {e["id"] for e in originals[0] if e.get("ph") in ("s", "f")}
    flows1 = {e["id"] for e in originals[1] if e.get("ph") in ("s", "f")}
    merged_flows = {e["id"] for e in merged if e.get("ph") in ("s", "f")}
    assert len(merged_flows) == len(flows0) + len(flows1)


def test_cli_prints_the_summary_and_where_the_report_is(session: Path, capsys: pytest.CaptureFixture):
    # Rank 6 left nothing: a partial analysis, which a script can tell from a whole one.
    assert main(["analyze", str(session), "--no-progress"]) == EXIT_PARTIAL
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("rank 5 holds its peers back")
    assert f"report: {session}/report/index.html" in out


def test_output_elsewhere_and_nothing_to_analyse(tmp_path: Path, session: Path, capsys: pytest.CaptureFixture):
    analyze_uri(str(session), progress=False, output=str(tmp_path / "out"))
    assert REPORT_FILES <= {p.name for p in (tmp_path / "out").iterdir()}
    assert not (session / "report").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisError, match="nothing to analyse"):
        analyze_uri(str(tmp_path / "empty"), progress=False)
    assert main(["analyze", str(tmp_path / "empty"), "--no-progress"]) == 1
    assert "nothing to analyse" in capsys.readouterr().err


def test_hang_session_names_the_culprit(tmp_path: Path):
    root = tmp_path / "hung"
    (root / "ranks").mkdir(parents=True)
    for r in range(4):
        (root / "ranks" / f"rank-{r}.stacks.json").write_text(json.dumps(_stacks(r, "read_shard" if r == 1 else "all_reduce")))
    diagnosis = analyze_uri(str(root), progress=False)
    assert diagnosis.findings[0].category == "hang" and diagnosis.findings[0].ranks == [1]
    assert "read_shard (train.py:9)" in diagnosis.summary
    document = _check_report(root / "report", charts=False)
    page = (root / "report" / "index.html").read_text()
    assert "<h2>Where each rank is stuck</h2>" in page and page.index("read_shard (train.py:9)") < page.index("all_reduce (train.py:9)")
    assert document["ranks"]["analysed"] == 0


def test_session_in_s3(session: Path, moto_endpoint: str):
    credentials = {"accessKeyId": "AKIDANALYSIS", "secretAccessKey": "analysis-secret"}
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    s3.create_bucket(Bucket="traces")
    for path in session.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "traces", f"prefix/{path.relative_to(session).as_posix()}")
    diagnosis = analyze_uri("s3://traces/prefix", endpoint=moto_endpoint, region="us-east-1", credentials=credentials, progress=False)
    assert [w.rank for w in diagnosis.slowWorkers] == [5]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="traces", Prefix="prefix/report/")["Contents"]}
    assert {f"prefix/report/{n}" for n in REPORT_FILES} <= keys
    document = json.loads(s3.get_object(Bucket="traces", Key="prefix/report/diagnosis.json")["Body"].read())
    assert document["mergedTrace"]["ranks"] == [0, 1]
    assert "analysis-secret" not in json.dumps(document)



def test_cli_refuses_unclear_arguments(capsys: pytest.CaptureFixture):
    assert main(["analyze", "--no-progress"]) == 2
    assert "give a session folder" in capsys.readouterr().err
    assert main(["analyze", "--session", "only-a-name"]) == 2
    assert "--session wants NAMESPACE/NAME" in capsys.readouterr().err
