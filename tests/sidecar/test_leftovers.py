"""Nothing a capture writes is left behind or mistaken: an exporting rank is not called dead, a
hung rank that resumes still has its trace uploaded, and files no session needs are removed by
age or by the disk bound, also by a sidecar that did not write them."""
from __future__ import annotations

import os
import time
from pathlib import Path

from stepscope.analysis.model import decode_summary
from stepscope.contracts import layout
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient
from tests.sidecar.conftest import KEY, SimulatedRanks, wait_for
from tests.sidecar.test_session_flow import real_traces, trigger  # noqa: F401 - fixture


def test_an_exporting_rank_is_not_called_dead_until_its_grace_runs_out(stepscope_dir: Path, ranks: SimulatedRanks, tmp_path: Path,
                                                                       real_traces: dict[int, Path]) -> None:
    sidecar = Sidecar(stepscope_dir, KEY, host="127.0.0.1", port=0, pod="pod-a", poll_interval_s=0.05, stale_after_s=0.5,
                      export_grace_s=5.0).start()
    try:
        client = SidecarClient(sidecar.url, KEY, timeout=5)
        trigger(client, "s-w", tmp_path / "store")
        ranks.state("s-w", 0, "writing")
        ranks.state("s-w", 1, "writing")
        wait_for(client, "s-w", lambda s: [r["state"] for r in s["ranks"]] == ["writing", "writing"])
        # Both stop beating, as a process whose GIL torch holds while it processes the events.
        ranks.kill(0)
        ranks.kill(1)
        time.sleep(1.5)
        status = client.get_session("s-w")
        assert status["phase"] == "Capturing" and status["workers"]["failed"] == 0, status
        ranks.state("s-w", 0, "done", trace_from=real_traces[0])
        status = wait_for(client, "s-w", lambda s: s["phase"] == "Failed", timeout=15)
        rank1 = status["ranks"][1]
        assert rank1["state"] == "failed" and "writing its trace" in rank1["error"] and "heartbeat" in rank1["error"], rank1
        assert status["ranks"][0]["uploaded"]
    finally:
        sidecar.shutdown(5)


def test_a_hung_rank_that_resumes_has_its_trace_uploaded(client: SidecarClient, ranks: SimulatedRanks, stepscope_dir: Path,
                                                         tmp_path: Path, real_traces: dict[int, Path]) -> None:
    store = tmp_path / "store"
    trigger(client, "s-h", store)
    ranks.state("s-h", 0, "done", trace_from=real_traces[0])
    ranks.state("s-h", 1, "hung", stacks=True)
    status = wait_for(client, "s-h", lambda s: s["phase"] == "Failed")
    assert (store / layout.rank_stacks(1)).exists() and not (store / layout.rank_trace(1)).exists()
    # Its steps resume; the agent finishes the capture and writes the trace.
    ranks.state("s-h", 1, "capturing")
    ranks.state("s-h", 1, "done", trace_from=real_traces[1])
    status = wait_for(client, "s-h", lambda s: s["ranks"][1]["uploaded"])
    assert status["phase"] == "Failed" and "rank 1 finished its capture after" in status["message"]
    assert (store / layout.rank_trace(1)).read_bytes() == real_traces[1].read_bytes()
    assert not decode_summary((store / layout.rank_summary(1)).read_bytes()).error
    deadline = time.monotonic() + 5
    while list((stepscope_dir / "s-h").glob("*.trace.json.gz")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list((stepscope_dir / "s-h").glob("*.trace.json.gz")), "uploaded, so removed from the shared volume"


def _leave(stepscope_dir: Path, session: str, size: int, age_s: float) -> Path:
    folder = stepscope_dir / session
    folder.mkdir()
    trace = folder / "rank-0.trace.json.gz"
    trace.write_bytes(os.urandom(size))
    (folder / "rank-0.state.json").write_text("{}")
    old = time.time() - age_s
    for path in (trace, folder / "rank-0.state.json", folder):
        os.utime(path, (old, old))
    return folder


def test_a_restarted_sidecar_removes_old_leftovers_and_bounds_the_disk(stepscope_dir: Path, tmp_path: Path) -> None:
    """What an earlier sidecar left (its uploads failed, or it stopped before they ran) and no
    session re-sends is removed once older than the TTL; within the TTL, the oldest go first
    while all of it exceeds the disk bound. Bootstrap, registry and step telemetry files stay (a
    ring file's mtime need not move while its process writes it through a memory map)."""
    from stepscope.sidecar.bootstrap import install_bootstrap

    install_bootstrap(stepscope_dir)
    expired = _leave(stepscope_dir, "s-old", 1000, age_s=7200)
    older = _leave(stepscope_dir, "s-older", 600_000, age_s=600)
    newer = _leave(stepscope_dir, "s-newer", 600_000, age_s=60)
    (stepscope_dir / "sidecar" / "s-old").mkdir(parents=True)
    telemetry = _leave(stepscope_dir, "telemetry", 10, age_s=7200)
    sidecar = Sidecar(stepscope_dir, KEY, host="127.0.0.1", port=0, pod="pod-a", poll_interval_s=0.05,
                      leftover_ttl_s=3600, max_local_mb=1.0).start()
    try:
        assert not expired.exists() and not (stepscope_dir / "sidecar" / "s-old").exists()
        assert not older.exists() and newer.exists(), "over 1 MB: the oldest goes first"
        assert (stepscope_dir / "bootstrap" / "stepscope_agent" / "__init__.py").exists() and telemetry.exists()
        assert sidecar.manager.local_bytes == 600_000 + 2
    finally:
        sidecar.shutdown(5)
