"""The operator scenarios of tests/operator on a real cluster: the webhook injects the sidecar into
a real 2-rank training Job, a session captures and is diagnosed by a real analysis Job; bad
sessions fail with their reason; deleting a session cancels it."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from tests.e2e.conftest import Cluster

GROUP, VERSION, PLURAL = "stepscope.io", "v1alpha1", "profilesessions"


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


CREATED: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def delete_sessions(cluster: Cluster) -> Iterator[None]:
    yield
    api = kubernetes.client.CustomObjectsApi(cluster.api_client)
    for name in CREATED:
        try:
            api.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, name)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise


def _session(cluster: Cluster, name: str, selector: dict[str, str], **spec: Any) -> str:
    CREATED.append(name)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileSession", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": selector}, "capture": {"waitSteps": 5, "steps": 2}, "storage": dict(cluster.storage), **spec}}
    kubernetes.client.CustomObjectsApi(cluster.api_client).create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body)
    return name


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    obj = kubernetes.client.CustomObjectsApi(cluster.api_client).get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, name)
    return obj.get("status") or {}


def _finished(cluster: Cluster, name: str, timeout: float = 600) -> dict[str, Any]:
    return _wait(lambda: (s := _status(cluster, name)).get("phase") in ("Succeeded", "Failed") and s, timeout, f"{name} to finish")


@pytest.fixture(scope="module")
def training(cluster: Cluster) -> Iterator[dict[str, str]]:
    """A 2-rank gloo training Job whose pod opts in to injection; yields its pod labels."""
    name = f"stepscope-e2e-{cluster.run_id}"
    labels = {"stepscope.io/inject": "true", "stepscope-e2e": cluster.run_id}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {
        "metadata": {"labels": labels},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "train", "image": cluster.training_image,
                 "command": ["torchrun", "--nproc-per-node=2", "-m", "stepscope.workload", "--steps", "0", "--step-sleep-ms", "20"]}]}}}}
    batch, core = kubernetes.client.BatchV1Api(cluster.api_client), kubernetes.client.CoreV1Api(cluster.api_client)
    batch.create_namespaced_job(cluster.namespace, job)
    selector = f"stepscope-e2e={cluster.run_id}"
    _wait(lambda: [p for p in core.list_namespaced_pod(cluster.namespace, label_selector=selector).items if p.status.phase == "Running"], 300, "the training pod to run")
    yield {"stepscope-e2e": cluster.run_id}
    batch.delete_namespaced_job(name, cluster.namespace, propagation_policy="Foreground")


def test_session_succeeds_with_a_diagnosis(cluster: Cluster, training: dict[str, str]) -> None:
    name = _session(cluster, f"e2e-ok-{cluster.run_id}", training)
    status = _finished(cluster, name)
    assert status["phase"] == "Succeeded", status
    assert status["workers"]["uploaded"] == 2 and status["diagnosis"]["summary"]
    assert status["artifacts"]["report"].endswith("report/index.html")


def test_bad_selector_fails(cluster: Cluster) -> None:
    status = _finished(cluster, _session(cluster, f"e2e-nopods-{cluster.run_id}", {"no-such-label": cluster.run_id}), timeout=120)
    assert status["phase"] == "Failed" and "selects no Running pod" in status["message"]


def test_missing_secret_fails(cluster: Cluster, training: dict[str, str]) -> None:
    name = f"e2e-nosecret-{cluster.run_id}"
    _session(cluster, name, training, storage={**cluster.storage, "credentialsSecret": f"absent-{cluster.run_id}"})
    status = _finished(cluster, name, timeout=120)
    assert status["message"] == f"Secret absent-{cluster.run_id} not found in namespace {cluster.namespace}"


def test_deleting_a_session_cancels_it(cluster: Cluster, training: dict[str, str]) -> None:
    name = _session(cluster, f"e2e-cancel-{cluster.run_id}", training, capture={"waitSteps": 100000, "steps": 2})
    _wait(lambda: _status(cluster, name).get("phase") == "Capturing", 120, "capturing")
    api = kubernetes.client.CustomObjectsApi(cluster.api_client)
    api.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, name)

    def gone() -> bool:
        try:
            api.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, name)
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False
    _wait(gone, 120, "the finalizer (cancel on every sidecar) to be released")
