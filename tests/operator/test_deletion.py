"""Deleting a session stops its sidecars whatever state an operator left it in, and never hangs:
the pod record says whom to cancel even when the status never reached Capturing; a damaged
record, an API error or unreachable sidecars cost a warning Event, not the deletion."""
from __future__ import annotations

import base64
import socket
from typing import Any

import kubernetes
import pytest

from stepscope.operator.sessions import handlers, pod_record
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient
from stepscope.testing.kube.helpers import wait_for
from tests.operator.harness import KEY, NAMESPACE, OperatorHarness, Pods, port_of, session_spec, stop_before_capturing

SELECTOR = {"job": "idle"}


def sidecar_phase(sidecar: Sidecar, uid: str) -> str:
    return SidecarClient(sidecar.url, KEY).get_session(uid)["phase"]


def warnings(operator: OperatorHarness, name: str) -> dict[str, str]:
    items = kubernetes.client.CoreV1Api(operator.kube.api_client).list_namespaced_event(NAMESPACE).items
    return {e.reason: e.message for e in items if e.involved_object.name == name and e.type == "Warning"}


def capturing(operator: OperatorHarness, pods: Pods, idle: Sidecar, name: str, s3_endpoint: str) -> dict[str, Any]:
    """A session in Capturing on the idle sidecar (it stays there: no rank ever registers)."""
    pods.create("idle", SELECTOR, port=port_of(idle))
    created = operator.create_session(name, session_spec(SELECTOR, s3_endpoint))
    operator.wait_phase(name, ("Capturing",))
    return created


def test_session_deleted_before_its_status_said_capturing_is_cancelled_on_its_sidecars(
        operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stop_before_capturing(monkeypatch)
    pods.create("idle", SELECTOR, port=port_of(idle))
    uid = operator.create_session("crashed", session_spec(SELECTOR, s3_endpoint))["metadata"]["uid"]
    record = wait_for(lambda: pod_record.read(NAMESPACE, "crashed", uid), 30, "the pod record")
    assert record.triggered == {"idle"}
    assert sidecar_phase(idle, uid) == "Pending", "the sidecar runs the session"
    status = operator.status("crashed")
    assert status["phase"] == "Pending" and "pods" not in status

    operator.delete("crashed")
    wait_for(lambda: operator.gone("crashed"), 30, "the finalizer to be released")
    wait_for(lambda: sidecar_phase(idle, uid) == "Cancelled", 10, "the sidecar to cancel")


def test_unreadable_pod_record_cancels_every_selected_sidecar_and_lets_the_session_go(
        operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str) -> None:
    uid = capturing(operator, pods, idle, "damaged", s3_endpoint)["metadata"]["uid"]
    record = operator.status("damaged")["pods"]["record"]
    kubernetes.client.CoreV1Api(operator.kube.api_client).patch_namespaced_config_map(
        record, NAMESPACE, {"binaryData": {"triggered.gz": base64.b64encode(b"not gzip").decode()}})
    with pytest.raises(pod_record.PodRecordUnreadable, match=f"^ConfigMap {record}, the list of pods this session triggered, is unreadable: Not a gzipped file"):
        pod_record.read(NAMESPACE, "damaged", uid)

    operator.delete("damaged")
    wait_for(lambda: operator.gone("damaged"), 30, "the finalizer to be released")
    wait_for(lambda: sidecar_phase(idle, uid) == "Cancelled", 10, "the sidecar to cancel")
    message = wait_for(lambda: warnings(operator, "damaged").get("PodRecordUnreadable"), 10, "a PodRecordUnreadable event")
    assert record in message and "cancelling the session on every selected sidecar" in message


def test_api_errors_while_finding_the_sidecars_are_retried_then_the_session_goes(
        operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    capturing(operator, pods, idle, "no-api", s3_endpoint)
    reads = []

    def failing_read(*args: Any) -> None:
        reads.append(args)
        raise kubernetes.client.ApiException(status=503, reason="Service Unavailable")

    monkeypatch.setattr(pod_record, "read", failing_read)
    monkeypatch.setattr(handlers, "DELETE_RETRY_S", 0.5)
    operator.delete("no-api")
    wait_for(lambda: operator.gone("no-api"), 30, "the finalizer to be released")
    assert len(reads) == handlers.DELETE_ATTEMPTS
    message = wait_for(lambda: warnings(operator, "no-api").get("CancelSkipped"), 10, "a CancelSkipped event")
    assert "503" in message and "spec.timeoutSeconds" in message


def test_unreachable_sidecar_does_not_hold_deletion(operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str) -> None:
    uid = capturing(operator, pods, idle, "silent", s3_endpoint)["metadata"]["uid"]
    port = port_of(idle)
    idle.shutdown(grace_s=1)
    with socket.socket() as silent:  # takes the sidecar's port, accepts connections, never answers
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind(("127.0.0.1", port))
        silent.listen(16)
        operator.delete("silent")
        wait_for(lambda: operator.gone("silent"), 30, "the finalizer to be released")
    message = wait_for(lambda: warnings(operator, "silent").get("CancelUndelivered"), 10, "a CancelUndelivered event")
    assert message.startswith("1 of 1 sidecar(s) did not answer the cancel") and "spec.timeoutSeconds=60" in message
    assert uid not in message
