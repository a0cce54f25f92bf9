"""The diagnosis on real captures: 2 gloo ranks of stepscope's workload started the zero-code way
(rank 1 doing 80 ms of extra Python work per step in augment_batch_slowly, or blocking forever);
the agent writes traces or stacks, `stepscope analyze` reads the agent's folder as it is."""
from __future__ import annotations

import json
from pathlib import Path

from stepscope.analysis.pipeline import analyze_uri
from stepscope.cli import main
from tests.agent.protocol import start_job, stepscope_dir, wait_for, wait_for_state, write_request  # noqa: F401  (fixtures)


def test_real_gloo_run_names_the_slow_rank_and_its_function(stepscope_dir: Path, start_job, tmp_path: Path, capsys) -> None:
    write_request(stepscope_dir, "slow", waitSteps=2, steps=4)
    job = start_job(2, "--steps", "0", "--step-sleep-ms", "5", "--slow-rank", "1", "--slow-ms", "80")
    for rank in (0, 1):
        wait_for_state(stepscope_dir, "slow", rank, ("done",), timeout=120)
    job.terminate()
    assert main(["analyze", str(stepscope_dir / "slow"), "--output", str(tmp_path / "report"), "--no-progress"]) == 0
    print(capsys.readouterr().out)
    document = json.loads((tmp_path / "report" / "diagnosis.json").read_text())
    assert document["ranks"]["failed"] == []
    assert [w["rank"] for w in document["diagnosis"]["slowWorkers"]] == [1]
    summary = document["diagnosis"]["summary"]
    assert summary.startswith("rank 1 ") and "augment_batch_slowly (workload.py:" in summary
    python = [f for f in document["findings"] if f["category"] == "python" and f["ranks"] == [1]]
    assert python and python[0]["data"]["usPerStep"] > 60_000
    assert document["mergedTrace"]["ranks"] == [1, 0]


def test_real_hang_names_the_rank_that_left_the_others_waiting(stepscope_dir: Path, start_job, tmp_path: Path) -> None:
    job = start_job(2, "--steps", "0", "--step-sleep-ms", "5", "--hang-rank", "1", "--hang-at-step", "4")
    wait_for(lambda: all(_heartbeat(stepscope_dir, rank).get("step") == 5 for rank in (0, 1)), 60, "both ranks stuck")
    write_request(stepscope_dir, "hang", waitSteps=1, steps=2, hang_timeout=2)
    for rank in (0, 1):
        wait_for_state(stepscope_dir, "hang", rank, ("hung",), timeout=30)
    job.terminate()
    diagnosis = analyze_uri(str(stepscope_dir / "hang"), output=str(tmp_path / "report"), progress=False)
    hang = diagnosis.findings[0]
    assert hang.category == "hang" and hang.ranks == [1], diagnosis.findings
    assert "block_forever (workload.py:" in hang.message and "average_loss_across_ranks (workload.py:" in hang.message
    assert diagnosis.summary == hang.message


def _heartbeat(directory: Path, rank: int) -> dict:
    try:
        return json.loads((directory / "agents" / f"rank-{rank}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
