"""The single-machine capture path for real: `stepscope sidecar` as its own process, a 2-rank gloo
training started the zero-code way (the sidecar's bootstrap on PYTHONPATH, nothing of stepscope in
the training script): captures triggered through the sidecar's HTTP API and through
`stepscope capture --analyze`, and a real hang reported with every rank's stacks and diagnosed."""
from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path

import pytest

from stepscope.analysis.model import decode_summary
from stepscope.contracts import layout
from stepscope.local.launch import LocalJob, launch_ranks
from stepscope.sidecar_client import SidecarClient
from tests.sidecar.conftest import KEY, eventually, wait_for
from tests.sidecar.test_commands import sidecar_process, stepscope  # noqa: F401 - fixture
from tests.sidecar.test_control_endpoint import trigger_body

pytestmark = pytest.mark.slow


def _logs(job) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in job.logs if log.exists())


def _training(shared: Path, tmp_path: Path, *args: str) -> LocalJob:
    """Two gloo ranks of the unchanged workload, stepping (so a short hang timeout cannot fire during start-up)."""
    job = launch_ranks(2, shared, ["--steps", "0", "--step-sleep-ms", "20", "--hidden", "64", *args], log_dir=tmp_path / "logs")

    def stepping() -> bool:
        try:
            records = [json.loads(p.read_text()) for p in (shared / "agents").glob("rank-*.json")]
        except (OSError, ValueError):
            return False
        return len(records) == 2 and all(r["step"] >= 1 for r in records)

    try:
        eventually(stepping, timeout=90, what="both ranks stepping")
    except AssertionError:
        job.terminate()
        raise AssertionError(f"training did not start\n{_logs(job)}") from None
    return job


def _capture_and_analyze(url: str, out_dir: Path, job: LocalJob, *args: str) -> tuple[int, str]:
    """`stepscope capture --analyze` as a user runs it: exit code and stdout (with stderr and the ranks' logs when it failed)."""
    capture = stepscope("capture", "--sidecar", url, "--output-dir", str(out_dir), "--analyze", *args)
    out, err = capture.communicate(timeout=180)
    return capture.returncode, out if capture.returncode == 0 else f"{out}\n{err}\n{_logs(job)}"


def test_real_training_captured_through_the_sidecar_and_the_capture_command(sidecar_process, tmp_path: Path) -> None:
    _, url, shared = sidecar_process
    client = SidecarClient(url, KEY)
    with _training(shared, tmp_path) as job:
        # 1. Through the HTTP API, as the operator does.
        session = str(uuid.uuid4())
        store = tmp_path / "api-store"
        client.put_session(session, trigger_body(session, store.as_uri(), saveRawTrace="all",
                                                 capture={"waitSteps": 2, "steps": 3, "activities": ["CPU"]}))
        try:
            status = wait_for(client, session, lambda s: s["phase"] in ("Succeeded", "Failed"), timeout=120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_logs(job)}") from None
        assert status["phase"] == "Succeeded", (status, _logs(job))
        assert status["workers"]["uploaded"] == 2
        for rank in (0, 1):
            state = status["ranks"][rank]
            assert state["endStep"] - state["startStep"] == 3
            trace = json.loads(gzip.decompress((store / layout.rank_trace(rank)).read_bytes()))
            assert sum(str(e.get("name", "")).startswith("ProfilerStep#") for e in trace["traceEvents"]) == 3
            summary = decode_summary((store / layout.rank_summary(rank)).read_bytes())
            assert summary.rank == rank and summary.worldSize == 2 and summary.pod == "pod-p"
            assert not summary.error and len(summary.steps) == 3

        # 2. Through `stepscope capture`, as a user on one machine does.
        out_dir = tmp_path / "capture"
        code, out = _capture_and_analyze(url, out_dir, job, "--wait", "1", "--steps", "2", "--save-raw-trace", "master")
        assert code == 0, out
        assert "Succeeded" in out and "diagnosis:" in out
        record = json.loads((out_dir / layout.session_json()).read_text())
        assert record["phase"] == "Succeeded" and record["workers"]["uploaded"] == 2
        assert (out_dir / layout.rank_trace(0)).exists() and not (out_dir / layout.rank_trace(1)).exists()
        assert (out_dir / layout.REPORT_DIAGNOSIS).exists() and (out_dir / layout.REPORT_HTML).exists()


def test_real_hang_is_reported_with_stacks_and_diagnosed(sidecar_process, tmp_path: Path) -> None:
    _, url, shared = sidecar_process
    with _training(shared, tmp_path, "--hang-rank", "1", "--hang-at-step", "4") as job:
        out_dir = tmp_path / "capture"
        code, out = _capture_and_analyze(url, out_dir, job, "--wait", "0", "--steps", "20", "--hang-timeout", "2")
    assert code == 1, out
    assert "Failed" in out and "rank 1 hung" in out
    for rank in (0, 1):
        stacks = json.loads((out_dir / layout.rank_stacks(rank)).read_text())
        assert stacks["rank"] == rank and stacks["threads"]
        assert "hung" in decode_summary((out_dir / layout.rank_summary(rank)).read_bytes()).error
    diagnosis = json.loads((out_dir / layout.REPORT_DIAGNOSIS).read_text())
    assert "block_forever" in json.dumps(diagnosis), out
