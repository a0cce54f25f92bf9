"""Sessions the operator must end Failed, with a reason that says what to change; no sidecar runs."""
from __future__ import annotations

import kubernetes
import pytest

from tests.kube.fixtures import Kube
from tests.kube.helpers import wait_for
from tests.operator.harness import NAMESPACE, OperatorHarness, Pods, session_spec


def _condition(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def _events(operator: OperatorHarness, name: str) -> list[str]:
    items = kubernetes.client.CoreV1Api(operator.kube.api_client).list_namespaced_event(NAMESPACE).items
    return [f"{e.reason}: {e.message}" for e in items if e.involved_object.name == name]


def test_selector_without_ready_pods_fails_after_the_grace(operator: OperatorHarness, pods: Pods, s3_endpoint: str) -> None:
    pods.create("no-sidecar", {"job": "train"}, port=None)  # matches, but has no stepscope port
    pods.create("starting", {"job": "train"}, port=7470, running=False)
    operator.create_session("bad-selector", session_spec({"job": "train"}, s3_endpoint))
    status = operator.wait_phase("bad-selector", ("Failed",))
    ready = _condition(status, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "NoPodsSelected"
    assert "selects no Running pod with a stepscope sidecar in namespace default" in ready["message"]
    assert "2 pod(s) match" in ready["message"] and "stepscope.io/inject" in ready["message"]
    assert _condition(status, "Triggered")["status"] == "False"
    assert status["observedGeneration"] == 1 and status["completionTime"]
    assert wait_for(lambda: any("Failed" in e for e in _events(operator, "bad-selector")), 10, "a Failed event")


def test_missing_secret_fails_naming_it(operator: OperatorHarness, pods: Pods, s3_endpoint: str) -> None:
    spec = session_spec({"job": "train"}, s3_endpoint)
    spec["storage"]["credentialsSecret"] = "nope"
    operator.create_session("no-secret", spec)
    status = operator.wait_phase("no-secret", ("Failed",))
    assert status["message"] == "Secret nope not found in namespace default"
    assert _condition(status, "Ready")["reason"] == "SecretNotFound"


def test_unusable_bucket_fails_with_the_store_error(operator: OperatorHarness, pods: Pods, s3_endpoint: str) -> None:
    spec = session_spec({"job": "train"}, s3_endpoint)
    spec["storage"]["uri"] = "s3://no-such-bucket/sessions"
    operator.create_session("bad-store", spec)
    status = operator.wait_phase("bad-store", ("Failed",))
    assert _condition(status, "Ready")["reason"] == "StorageUnreachable"
    assert "s3://no-such-bucket/sessions is not usable" in status["message"] and "does not exist" in status["message"]
    assert "testing-secret" not in str(status) and "testing-key-id" not in str(status)


def test_finished_session_is_deleted_after_its_ttl(operator: OperatorHarness, s3_endpoint: str) -> None:
    operator.create_session("short-lived", session_spec({"job": "none"}, s3_endpoint, ttlSecondsAfterFinished=1))
    assert operator.wait_phase("short-lived", ("Failed",))["phase"] == "Failed"
    wait_for(lambda: operator.gone("short-lived"), 15, "the TTL to delete the session")


def test_capture_that_never_ends_times_out_keeping_what_was_captured(operator: OperatorHarness, pods: Pods, tmp_path, s3_endpoint: str) -> None:
    from stepscope.sidecar.daemon import Sidecar
    from tests.operator.harness import KEY

    idle = Sidecar(tmp_path / "idle", KEY, host="127.0.0.1", port=0, pod="idle").start()  # no training behind it
    try:
        pods.create("idle", {"job": "idle"}, port=idle.server.server_address[1])
        operator.create_session("too-slow", session_spec({"job": "idle"}, s3_endpoint, timeoutSeconds=3, hangTimeoutSeconds=2))
        status = operator.wait_phase("too-slow", ("Failed",), timeout=20)
        assert _condition(status, "Ready")["reason"] == "Timeout"
        assert status["message"].startswith("capture did not finish within spec.timeoutSeconds=3s; 0 of 1 worker(s) uploaded, kept in s3://")
        assert status["pods"]["triggered"] == 1
    finally:
        idle.shutdown(grace_s=1)


def test_secret_with_other_binary_data_still_gives_its_credentials(cluster: Kube) -> None:
    from stepscope.operator import credentials

    kubernetes.client.CoreV1Api(cluster.api_client).create_namespaced_secret(NAMESPACE, {"metadata": {"name": "mixed"}, "data": {
        "AWS_ACCESS_KEY_ID": "QUtJRA==", "AWS_SECRET_ACCESS_KEY": "U0VDUkVU", "ca.der": "MIIB/w=="}})  # AKID, SECRET, DER bytes
    assert credentials.from_secret(NAMESPACE, "mixed") == {"accessKeyId": "AKID", "secretAccessKey": "SECRET", "sessionToken": None}
    kubernetes.client.CoreV1Api(cluster.api_client).create_namespaced_secret(NAMESPACE, {"metadata": {"name": "binary-key"}, "data": {
        "accessKeyId": "QUtJRA==", "secretAccessKey": "/w=="}})
    with pytest.raises(credentials.CredentialsError, match="^Secret binary-key in namespace default: key secretAccessKey is not UTF-8 text$"):
        credentials.from_secret(NAMESPACE, "binary-key")
