"""ProfileTrigger end to end: the real operator (kopf against the test API server) watches a real
2-rank gloo training (zero-code agent) through its real sidecar. After a healthy baseline one
rank slows down mid-run, or hangs: the ProfileTrigger creates a ProfileSession within 60 s, and
the session's diagnosis names that rank (its Python stacks for the hang).

Short windows (a 12 s baseline, a 3 s sustain, 1 s polls) keep it near a minute; the defaults are
minutes. `test_a_healthy_job_fires_nothing` runs 4 minutes: it is marked slow and runs only with
STEPSCOPE_LONG_TESTS=1."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import kubernetes
import pytest

from stepscope.local.launch import LocalJob, launch_ranks
from stepscope.operator.settings import GROUP, PLURAL, VERSION
from stepscope.operator.triggers.policy import TRIGGER_LABEL, TRIGGER_PLURAL
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient
from stepscope.testing.kube.fixtures import REPO, Kube
from stepscope.testing.kube.helpers import wait_for
from tests.operator.conftest import CREDENTIALS
from tests.operator.harness import BUCKET, KEY, NAMESPACE, OperatorHarness, Pods, port_of, session_spec

SELECTOR = {"job": "watched"}
BASE = ["--steps", "0", "--step-sleep-ms", "30", "--hidden", "64"]
SLOW_FROM_STEP = 250  # ~12 s of healthy steps first: the 12 s baseline needs 10 polls


@pytest.fixture
def watched(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> Kube:
    cluster.apply_crd(REPO / "crds" / "profiletrigger.yaml")
    monkeypatch.setenv("STEPSCOPE_TRIGGER_POLL_INTERVAL_S", "1")
    return cluster


def start(folder: Path, *fault: str) -> tuple[LocalJob, Sidecar]:
    job = launch_ranks(2, folder, [*BASE, *fault], log_dir=folder / "logs")
    sidecar = Sidecar(
        folder,
        KEY,
        host="127.0.0.1",
        port=0,
        pod="train-w",
        poll_interval_s=0.2,
        upload_attempts=2,
        upload_base_delay_s=0.2,
    ).start()
    return job, sidecar


@pytest.fixture
def stop() -> Iterator[list[Any]]:
    running: list[Any] = []
    yield running
    for job, sidecar in running:
        sidecar.shutdown(grace_s=2)
        job.terminate()


def create_trigger(operator: OperatorHarness, s3_endpoint: str, **conditions: Any) -> None:
    template = session_spec(SELECTOR, s3_endpoint, hangTimeoutSeconds=3, timeoutSeconds=50)
    del template["selector"]
    spec = {
        "selector": {"matchLabels": SELECTOR},
        "conditions": conditions,
        "sessionTemplate": template,
        "cooldownSeconds": 600,
    }
    operator.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NAMESPACE,
        TRIGGER_PLURAL,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileTrigger", "metadata": {"name": "watch"}, "spec": spec},
    )


def trigger_status(operator: OperatorHarness) -> dict[str, Any]:
    return (
        operator.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, TRIGGER_PLURAL, "watch").get("status")
        or {}
    )


def fired(operator: OperatorHarness) -> dict[str, Any]:
    """The trigger's status once it says it fired: the daemon writes it after creating the session."""
    return wait_for(
        lambda: (s := trigger_status(operator)).get("lastFired") and s,
        10,
        f"lastFired in the trigger status ({trigger_status(operator)})",
    )


def sessions(operator: OperatorHarness) -> list[dict[str, Any]]:
    return operator.custom.list_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, label_selector=f"{TRIGGER_LABEL}=watch"
    )["items"]


def rank_steps(sidecar: Sidecar, rank: int) -> int:
    answer = SidecarClient(f"http://127.0.0.1:{port_of(sidecar)}", KEY).get_telemetry()
    return next((int(r["steps"]) for r in answer.get("ranks") or () if r["rank"] == rank), 0)


def the_session_created_after(operator: OperatorHarness, since: float) -> dict[str, Any]:
    [session] = wait_for(
        lambda: sessions(operator), 60, f"a ProfileSession (trigger status {trigger_status(operator)})"
    )
    assert time.time() - since < 60
    return session


def analysed(operator: OperatorHarness, name: str) -> dict[str, Any]:
    status = operator.wait_phase(name, ("Analyzing", "Failed", "Succeeded"), timeout=60)
    assert status["phase"] == "Analyzing", status
    code, _ = operator.run_analysis_job(name)
    assert code == 0
    return operator.wait_phase(name, ("Succeeded", "Failed"))


def test_a_rank_slowed_mid_run_is_captured_and_named(
    watched: Kube, operator: OperatorHarness, pods: Pods, s3_endpoint: str, tmp_path: Path, stop: list[Any]
) -> None:
    job, sidecar = start(
        tmp_path / "pod",
        "--slow-rank",
        "1",
        "--fault",
        "sleep",
        "--slow-ms",
        "120",
        "--slow-from-step",
        str(SLOW_FROM_STEP),
    )
    stop.append((job, sidecar))
    pods.create("train-w", SELECTOR, port=port_of(sidecar))
    create_trigger(
        operator,
        s3_endpoint,
        stepTime={"baselineMinutes": 0.2, "sustainedSeconds": 3},
        rankDivergence={"enabled": False},
        hang={"noStepSeconds": 30},
    )
    wait_for(
        lambda: (s := trigger_status(operator)).get("state") == "Watching" and s,
        40,
        f"a baseline (trigger status {trigger_status(operator)})",
    )
    assert sessions(operator) == [], "fired before the slowdown"
    wait_for(lambda: rank_steps(sidecar, 1) >= SLOW_FROM_STEP, 40, "the slowdown")
    slowed = time.time()

    session = the_session_created_after(operator, slowed)
    name = session["metadata"]["name"]
    assert name.startswith("watch-") and session["metadata"]["ownerReferences"][0]["kind"] == "ProfileTrigger"
    status = fired(operator)
    assert (
        status["lastFired"]["session"] == name
        and status["lastFired"]["condition"] == "Slowdown"
        and status["sessionsCreated"] == 1
    )
    assert status["current"]["stepTimeRatio"] > 1.5 and status["baseline"]["stepTimeSeconds"] > 0

    diagnosis = analysed(operator, name)["diagnosis"]
    assert diagnosis["slowWorkers"][0]["rank"] == 1, diagnosis
    events = kubernetes.client.CoreV1Api(operator.kube.api_client).list_namespaced_event(NAMESPACE).items
    assert any(e.reason == "SessionCreated" and name in e.message for e in events)


def test_a_hang_is_captured_with_the_hung_ranks_stacks(
    watched: Kube, operator: OperatorHarness, pods: Pods, s3_endpoint: str, tmp_path: Path, stop: list[Any]
) -> None:
    job, sidecar = start(tmp_path / "pod", "--hang-rank", "1", "--hang-at-step", "150")
    stop.append((job, sidecar))
    pods.create("train-w", SELECTOR, port=port_of(sidecar))
    create_trigger(
        operator, s3_endpoint, stepTime={"enabled": False}, rankDivergence={"enabled": False}, hang={"noStepSeconds": 4}
    )
    wait_for(lambda: rank_steps(sidecar, 1) >= 150, 40, "the hang")
    hung = time.time()

    session = the_session_created_after(operator, hung)
    name = session["metadata"]["name"]
    assert fired(operator)["lastFired"]["condition"] == "Hang"
    # A hung job makes no step to capture; the analysis reads the hung ranks' stacks instead.
    status = analysed(operator, name)
    assert any(w.get("rank") == 1 and "hung" in w["reason"] for w in status["failedWorkers"]), status
    assert status["phase"] == "Succeeded" and "block_forever" in status["diagnosis"]["summary"], status
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["accessKeyId"],
        aws_secret_access_key=CREDENTIALS["secretAccessKey"],
    )
    prefix = status["artifacts"]["prefix"].removeprefix(f"s3://{BUCKET}/")

    def where(rank: int) -> str:
        return s3.get_object(Bucket=BUCKET, Key=f"{prefix}/ranks/rank-{rank}.stacks.json")["Body"].read().decode()

    assert "block_forever" in where(1) and "block_forever" not in where(0)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("STEPSCOPE_LONG_TESTS"), reason="4 minutes: set STEPSCOPE_LONG_TESTS=1 to run it"
)
def test_a_healthy_job_fires_nothing(
    watched: Kube, operator: OperatorHarness, pods: Pods, s3_endpoint: str, tmp_path: Path, stop: list[Any]
) -> None:
    """Several minutes of a healthy job (its step time jitters with the machine's load) with the
    tight test windows: no session."""
    job, sidecar = start(tmp_path / "pod")
    stop.append((job, sidecar))
    pods.create("train-w", SELECTOR, port=port_of(sidecar))
    create_trigger(
        operator,
        s3_endpoint,
        stepTime={"baselineMinutes": 1, "sustainedSeconds": 10},
        rankDivergence={"sustainedSeconds": 10},
        hang={"noStepSeconds": 10},
    )
    deadline = time.time() + 240
    while time.time() < deadline:
        assert sessions(operator) == [], trigger_status(operator)
        time.sleep(5)
    assert trigger_status(operator)["state"] == "Watching"
