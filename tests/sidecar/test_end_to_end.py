"""The single-machine capture path for real: `stepscope sidecar` as its own process, a 2-rank gloo
training started the zero-code way (the sidecar's bootstrap on PYTHONPATH, nothing of stepscope in
the training script), one capture triggered through the sidecar's HTTP API and one through
`stepscope capture --analyze`."""
from __future__ import annotations

import gzip
import json
import signal
import uuid
from pathlib import Path

import pytest

from stepscope import layout
from stepscope.analysis.model import decode_summary
from stepscope.launch import launch_ranks
from stepscope.sidecar_client import SidecarClient
from tests.sidecar.conftest import KEY, eventually, wait_for
from tests.sidecar.test_commands import stepscope
from tests.sidecar.test_control_endpoint import trigger_body

pytestmark = pytest.mark.slow


def _logs(job) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in job.logs if log.exists())


def test_real_training_captured_through_the_sidecar_and_the_capture_command(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    sidecar = stepscope("sidecar", "--dir", str(shared), "--host", "127.0.0.1", "--port", "0", "--pod", "pod-e2e", "--poll-interval", "0.1")
    job = None
    try:
        line = sidecar.stdout.readline()
        assert "listening on" in line, sidecar.stderr.read()
        url = line.split("listening on ", 1)[1].split()[0]
        client = SidecarClient(url, KEY)
        job = launch_ranks(2, shared, ["--steps", "0", "--step-sleep-ms", "20", "--hidden", "64"], log_dir=tmp_path / "logs")
        eventually(lambda: len(list((shared / "agents").glob("rank-*.json"))) == 2, timeout=90, what="both ranks registered")

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
            assert summary.rank == rank and summary.worldSize == 2 and summary.pod == "pod-e2e"
            assert not summary.error and len(summary.steps) == 3

        # 2. Through `stepscope capture`, as a user on one machine does.
        out_dir = tmp_path / "capture"
        capture = stepscope("capture", "--sidecar", url, "--output-dir", str(out_dir), "--wait", "1", "--steps", "2",
                            "--save-raw-trace", "master", "--analyze")
        out, err = capture.communicate(timeout=180)
        assert capture.returncode == 0, f"{out}\n{err}\n{_logs(job)}"
        assert "Succeeded" in out and "diagnosis:" in out
        record = json.loads((out_dir / layout.session_json()).read_text())
        assert record["phase"] == "Succeeded" and record["workers"]["uploaded"] == 2
        assert (out_dir / layout.rank_trace(0)).exists() and not (out_dir / layout.rank_trace(1)).exists()
        assert (out_dir / layout.REPORT_DIAGNOSIS).exists() and (out_dir / layout.REPORT_HTML).exists()
    finally:
        if job is not None:
            job.terminate()
        sidecar.send_signal(signal.SIGTERM)
        assert sidecar.wait(timeout=30) == 0
