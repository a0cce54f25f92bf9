"""`stepscope analyze` as a script sees it: exit codes, a missing path, files that are no traces,
ranks taken from the traces (distributedInfo), not from the order of the files."""
from __future__ import annotations

import gzip
import json
import shutil
import statistics
from pathlib import Path

import pytest

from stepscope.analysis.pipeline import EXIT_NONE, EXIT_OK, EXIT_PARTIAL
from stepscope.analysis.statistics.summary import summarize_file
from stepscope.cli import main


def _pair(tmp_path: Path, shared_traces: Path) -> Path:
    """The 2-rank traces under names without a rank in them, so only distributedInfo says which is which."""
    folder = tmp_path / "traces"
    folder.mkdir()
    pair = shared_traces / "hta__trace_filter_2rank"
    shutil.copy(pair / "sampled_rank-0.json.gz", folder / "worker-b.json.gz")
    shutil.copy(pair / "sampled_rank-1.json.gz", folder / "worker-a.json.gz")
    return folder


def test_a_path_that_does_not_exist_says_so(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert main(["analyze", str(tmp_path / "nowhere"), "--no-progress"]) == EXIT_NONE
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nowhere'} does not exist" in err and "expected ranks/" not in err


def test_a_stray_json_file_is_skipped_and_renumbers_no_rank(tmp_path: Path, shared_traces: Path, capsys: pytest.CaptureFixture):
    folder = _pair(tmp_path, shared_traces)
    (folder / "hparams.json").write_text(json.dumps({"lr": 0.1, "batch_size": 32}))
    assert main(["analyze", str(folder), "--output", str(tmp_path / "out"), "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    assert "skipped hparams.json: not a trace" in err
    document = json.loads((tmp_path / "out" / "diagnosis.json").read_text())
    assert document["ranks"]["total"] == 2 and document["ranks"]["failed"] == []
    # worker-b holds distributedInfo rank 0: whatever the file order, it is rank 0.
    own = summarize_file(folder / "worker-b.json.gz")
    assert own.rank == 0
    steps = {r["rank"]: r["stepTimeMs"] for r in document["perRank"]}
    assert steps[0] == pytest.approx(statistics.median(s.durationUs for s in own.steps) / 1000.0, rel=1e-3) != steps[1]


def test_exit_codes_tell_all_partial_and_none_apart(tmp_path: Path, shared_traces: Path, capsys: pytest.CaptureFixture):
    folder = _pair(tmp_path, shared_traces)
    (folder / "rank-2.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": '))
    assert main(["analyze", str(folder), "--output", str(tmp_path / "out"), "--no-progress"]) == EXIT_PARTIAL
    assert "1 of 3 rank(s) could not be analysed" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "rank-0.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": '))
    assert main(["analyze", str(broken), "--output", str(tmp_path / "out2"), "--no-progress"]) == EXIT_NONE
    assert EXIT_NONE != EXIT_PARTIAL != EXIT_OK
