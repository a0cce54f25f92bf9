"""What the agents' capture budget dropped or cut reaches the session's message (and so the
operator's status) and each rank's summary, from which the diagnosis and the report take it."""
from __future__ import annotations

from pathlib import Path

from stepscope.analysis.model import decode_summary
from stepscope.contracts import layout
from stepscope.sidecar_client import SidecarClient
from tests.sidecar.conftest import SimulatedRanks, wait_for
from tests.sidecar.test_session_flow import real_traces, trigger  # noqa: F401 - fixture

CUT = ("capture cut after 3 of 20 steps: the process grew 530 MB while profiling, over capture.limits.maxMemoryMB=512; "
       "capture fewer steps, set capture.withStack=false or raise capture.limits.maxMemoryMB")


def test_a_degraded_capture_says_so_in_the_status_and_the_summary(client: SidecarClient, ranks: SimulatedRanks, tmp_path: Path,
                                                                   real_traces: dict[int, Path]) -> None:
    store = tmp_path / "store"
    trigger(client, "s-b", store)
    ranks.state("s-b", 0, "done", trace_from=real_traces[0])
    ranks.state("s-b", 1, "done", trace_from=real_traces[1], degraded=[CUT])
    status = wait_for(client, "s-b", lambda s: s["phase"] == "Succeeded")
    assert "1 rank(s) degraded by the capture budget, rank 1: capture cut after 3 of 20 steps" in status["message"]
    assert status["ranks"][1]["degraded"] == [CUT] and status["ranks"][0]["degraded"] == []
    assert CUT in decode_summary((store / layout.rank_summary(1)).read_bytes()).warnings
    assert CUT not in decode_summary((store / layout.rank_summary(0)).read_bytes()).warnings
