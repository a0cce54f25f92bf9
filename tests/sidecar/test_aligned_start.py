"""Every rank of a job captures the same steps: the sidecar writes one absolute startStep for its
ranks (docs/wire.md, request.json), not waitSteps after whichever step each rank reads the request
at. Real: `stepscope sidecar` as its own process and 2 gloo ranks of the unchanged workload, rank 1
blocking 40 ms between its backward and its optimizer step: its steps end 40 ms after rank 0's, so
a request that lands in between reaches the ranks at different steps (most requests do)."""
from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path

import pytest

from stepscope.contracts import layout
from stepscope.local.launch import launch_ranks
from stepscope.sidecar_client import SidecarClient
from tests.agent.protocol import profiler_steps
from tests.sidecar.conftest import KEY, eventually, wait_for
from tests.sidecar.test_commands import sidecar_process, stepscope  # noqa: F401 - fixture
from tests.sidecar.test_control_endpoint import trigger_body

pytestmark = pytest.mark.slow


def _stepping(shared: Path) -> bool:
    try:
        records = [json.loads(p.read_text()) for p in (shared / "agents").glob("rank-*.json")]
    except (OSError, ValueError):
        return False
    return len(records) == 2 and all(r["step"] >= 3 for r in records)


def test_both_ranks_capture_the_same_profiler_steps(sidecar_process, tmp_path: Path) -> None:
    _, url, shared = sidecar_process
    with launch_ranks(2, shared, ["--steps", "0", "--hidden", "16", "--batch-size", "4", "--slow-rank", "1", "--fault", "log", "--slow-ms", "40"], log_dir=tmp_path / "logs") as job:
        eventually(lambda: _stepping(shared), timeout=90, what="both ranks stepping")
        session, store = str(uuid.uuid4()), tmp_path / "store"
        # waitSteps is the margin for the request to reach both ranks before the common start step.
        SidecarClient(url, KEY).put_session(session, trigger_body(session, store.as_uri(), saveRawTrace="all", capture={
            "waitSteps": 5, "steps": 3, "activities": ["CPU"], "withStack": False}))
        status = wait_for(SidecarClient(url, KEY), session, lambda s: s["phase"] in ("Succeeded", "Failed"), timeout=120)
        assert status["phase"] == "Succeeded", (status, [p.read_text()[-2000:] for p in job.logs if p.exists()])
    starts = [r["startStep"] for r in status["ranks"]]
    steps = [profiler_steps(json.loads(gzip.decompress((store / layout.rank_trace(rank)).read_bytes()))["traceEvents"]) for rank in (0, 1)]
    assert starts[0] == starts[1] and steps[0] == steps[1] == list(range(starts[0], starts[0] + 3)), (starts, steps)
