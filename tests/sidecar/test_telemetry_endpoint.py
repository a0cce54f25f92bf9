"""Step telemetry through the real sidecar's HTTP server, from real torch ranks over gloo started the
zero-code way: Prometheus metrics on GET /metrics (unsigned) and JSON on the signed GET /v1/telemetry,
while the job trains, hangs (one rank blocks, its peer waits in the collective) and dies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stepscope.local.launch import LocalJob, launch_ranks
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient
from tests.agent.protocol import wait_for
from tests.sidecar.test_control_endpoint import raw


@pytest.fixture()
def hanging_job(stepscope_dir: Path, tmp_path: Path) -> Iterator[LocalJob]:
    job = launch_ranks(
        2,
        stepscope_dir,
        ["--steps", "0", "--step-sleep-ms", "10", "--hang-rank", "1", "--hang-at-step", "40"],
        log_dir=tmp_path / "logs",
    )
    yield job
    job.terminate()


def metrics(sidecar: Sidecar) -> dict[str, dict[tuple[str, ...], float]]:
    """Every sample of GET /metrics: {sample name: {(rank, local_rank): value}} (histogram buckets keyed
    with `le` too)."""
    with urlopen(sidecar.url + "/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    samples: dict[str, dict[tuple[str, ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.labels["rank"], s.labels["local_rank"], *([s.labels["le"]] if "le" in s.labels else []))
            samples.setdefault(s.name, {})[key] = s.value
    return samples


def ranks_by_index(client: SidecarClient) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in client.get_telemetry()["ranks"]}


def test_steps_then_a_hang_then_death_as_metrics_and_json(
    sidecar: Sidecar, client: SidecarClient, hanging_job: LocalJob
) -> None:
    # Rank 1 blocks after its optimizer step 40 (zero-based); rank 0 then waits in the next all-reduce.
    def stuck() -> dict[int, dict[str, Any]] | None:
        ranks = ranks_by_index(client)
        if set(ranks) == {0, 1} and all(r["steps"] == 41 and r["secondsSinceStep"] >= 3 for r in ranks.values()):
            return ranks
        return None

    ranks = wait_for(stuck, 90, "both ranks stuck after 41 steps for 3 s")
    telemetry = client.get_telemetry()
    assert telemetry["pod"] == "pod-a" and telemetry["node"] == "node-a"
    for rank, r in ranks.items():
        assert r["alive"] and r["localRank"] == rank and r["worldSize"] == 2
        # Step 1 (timed from the agent's start) is not in the recent durations; each step sleeps 10 ms.
        assert [step for step, _ in r["recent"]] == list(range(2, 42))
        assert all(0.01 <= duration < 10 for _, duration in r["recent"])
        assert (
            r["lastStepSeconds"] == r["recent"][-1][1]
            and abs(r["lastStepAt"] - telemetry["time"] + r["secondsSinceStep"]) < 1
        )
        # DDP timed only its warm-up iterations before the hang: no wait share yet.
        assert r["collectiveWaitSeconds"] is None and r["waitShare"] is None, r

    samples = metrics(sidecar)
    assert "stepscope_collective_wait_share" not in samples
    for rank in ("0", "1"):
        key = (rank, rank)
        assert samples["stepscope_steps_total"][key] == 41
        assert samples["stepscope_step_duration_seconds_count"][key] == 40
        assert samples["stepscope_step_duration_seconds_bucket"][(*key, "+Inf")] == 40
        assert samples["stepscope_step_duration_seconds_bucket"][(*key, "0.005")] == 0  # every step sleeps 10 ms
        assert 0.4 <= samples["stepscope_step_duration_seconds_sum"][key] < 390
        assert samples["stepscope_last_step_duration_seconds"][key] >= 0.01
        assert samples["stepscope_seconds_since_last_step"][key] >= 3

    # The telemetry is on the signed API only: no signature, no answer.
    status, payload = raw(sidecar, "GET", "/v1/telemetry")
    assert status == 401 and "error" in payload

    # Dead processes (no heartbeat) leave the metrics; the JSON still shows their last steps.
    hanging_job.terminate()
    wait_for(lambda: not any(r["alive"] for r in client.get_telemetry()["ranks"]), 30, "both ranks reported dead")
    assert "stepscope_steps_total" not in metrics(sidecar)
