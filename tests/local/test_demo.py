"""`stepscope demo`, the README's second command, end to end as a user runs it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stepscope.contracts.session import DEFAULT_CAPTURE_STEPS

REPO = Path(__file__).resolve().parents[2]


def test_demo_finds_the_slowed_rank_and_its_function(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "stepscope.cli", "demo", "--output-dir", str(out)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "diagnosis: rank 2 holds the job back (confidence " in result.stdout, result.stdout[-3000:]
    diagnosis = json.loads((out / "session" / "report" / "diagnosis.json").read_text())
    slow = [f for f in diagnosis["findings"] if f["category"] == "slow-worker"]
    assert slow and slow[0]["ranks"] == [2] and "augment_batch_slowly" in slow[0]["message"]
    assert diagnosis["diagnosis"]["confidence"] >= 0.65
    assert (out / "session" / "report" / "index.html").is_file()


def test_demo_scenario_names_the_blocked_rank_and_where_it_blocks(tmp_path: Path) -> None:
    """`stepscope demo --scenario`: a fault-injection scenario at the default capture size."""
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "stepscope.cli", "demo", "--scenario", "blocking-io", "--ranks", "2", "--output-dir", str(out)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "scenario blocking-io on rank 1" in result.stdout
    assert "diagnosis: rank 1 holds the job back (confidence " in result.stdout, result.stdout[-3000:]
    assert "fetch_remote_features (workload.py:" in result.stdout
    session = json.loads((out / "session" / "session.json").read_text())
    assert session["spec"]["capture"]["steps"] == DEFAULT_CAPTURE_STEPS


def test_demo_help_lists_every_scenario(capsys, monkeypatch) -> None:
    import pytest

    from stepscope.cli import main
    from stepscope.local.scenarios import SCENARIOS

    monkeypatch.setenv("COLUMNS", "100000")  # one line per option: no name broken at its hyphen
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(f"{name}: {s.description}" in out for name, s in SCENARIOS.items())


def test_a_scenario_of_two_slow_ranks_refuses_too_few_ranks(tmp_path: Path) -> None:
    """Two slow ranks need a healthy one beside them: with 2 ranks both faults would land on one."""
    result = subprocess.run([sys.executable, "-m", "stepscope.cli", "demo", "--scenario", "two-slow", "--ranks", "2", "--output-dir",
                             str(tmp_path / "demo")], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "scenario two-slow needs --ranks 3 or more" in result.stderr, result.stderr
