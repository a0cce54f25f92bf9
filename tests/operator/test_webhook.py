"""The injection webhook over real HTTPS: kopf serves it with the operator's own certificate and
registers it in a MutatingWebhookConfiguration; AdmissionReviews are POSTed to it as an API
server would, and the JSON patch it answers is applied to the pod."""
from __future__ import annotations

import base64
import json
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import jsonpatch
import kubernetes
import pytest
from cryptography import x509
from kopf.testing import KopfRunner

from stepscope.launch import free_port
from stepscope.operator import registry
from tests.kube.fixtures import Kube
from tests.kube.helpers import wait_for
from tests.operator.harness import KEY

CONFIG = "stepscope-injector.stepscope.io"



@pytest.fixture
def webhook(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The operator with its webhook; yields the webhook entry kopf registered."""
    yield from _running_webhook(cluster, monkeypatch)


def _running_webhook(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("STEPSCOPE_WEBHOOK_PORT", str(free_port()))
    monkeypatch.setenv("STEPSCOPE_WEBHOOK_ADDR", "127.0.0.1")
    monkeypatch.setenv("STEPSCOPE_WEBHOOK_CONFIG", CONFIG)
    monkeypatch.setenv("STEPSCOPE_IMAGE", "registry.example/stepscope:test")
    admission = kubernetes.client.AdmissionregistrationV1Api(cluster.api_client)
    with KopfRunner(["run", "--standalone", "--all-namespaces"], registry=registry.build(with_webhook=True), timeout=60):
        def registered() -> Any:
            try:
                hooks = admission.read_mutating_webhook_configuration(CONFIG).to_dict()["webhooks"] or []
            except kubernetes.client.ApiException:
                return None
            return hooks[0] if hooks and hooks[0]["client_config"].get("ca_bundle") else None
        yield wait_for(registered, 30, "kopf to register the webhook")


def _review(config: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
                          "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
                          "namespace": "default", "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
                          "object": pod, "dryRun": False}}
    client = config["client_config"]
    context = ssl.create_default_context(cadata=base64.b64decode(client["ca_bundle"]).decode())
    request = urllib.request.Request(client["url"], data=json.dumps(review).encode(), method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return json.loads(response.read())["response"]


def _pod(labels: dict[str, str], env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer-0", "namespace": "default", "labels": labels},
            "spec": {"containers": [{"name": "pytorch", "image": "pytorch/pytorch", "env": env or []},
                                    {"name": "logger", "image": "busybox"}]}}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def test_labelled_pod_gets_sidecar_volume_and_bootstrap(webhook: dict[str, Any], cluster: Kube) -> None:
    assert webhook["failure_policy"] == "Ignore" and webhook["rules"][0]["operations"] == ["CREATE"]
    pod = _pod({"stepscope.io/inject": "true"}, env=[{"name": "PYTHONPATH", "value": "/app/lib"}])
    answer = _review(webhook, pod)
    assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
    patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))
    spec = patched["spec"]
    (sidecar,) = spec["initContainers"]
    assert sidecar["name"] == "stepscope-sidecar" and sidecar["image"] == "registry.example/stepscope:test"
    assert sidecar["command"] == ["stepscope", "sidecar"] and sidecar["restartPolicy"] == "Always"
    assert sidecar["ports"] == [{"name": "stepscope", "containerPort": 7470, "protocol": "TCP"}]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "stepscope"}
    env = _env(sidecar)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}} and env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["STEPSCOPE_HMAC_KEY"] == {"secretKeyRef": {"name": "stepscope-hmac", "key": "key"}}
    assert spec["volumes"] == [{"name": "stepscope-run", "emptyDir": {}}]
    for container in spec["containers"] + spec["initContainers"]:
        assert {"name": "stepscope-run", "mountPath": "/var/run/stepscope"} in container["volumeMounts"]
    training, logger = spec["containers"]
    assert _env(training)["PYTHONPATH"] == "/var/run/stepscope/bootstrap:/app/lib"
    assert _env(logger)["PYTHONPATH"] == "/var/run/stepscope/bootstrap" and _env(logger)["STEPSCOPE_DIR"] == "/var/run/stepscope"
    secret = kubernetes.client.CoreV1Api(cluster.api_client).read_namespaced_secret("stepscope-hmac", "default")
    assert base64.b64decode(secret.data["key"]) == KEY

    again = _review(webhook, patched)
    assert again["allowed"] is True and "patch" not in again, "a pod that has the sidecar is left alone"


def test_unlabelled_pod_is_not_touched(webhook: dict[str, Any]) -> None:
    answer = _review(webhook, _pod({"app": "web"}))
    assert answer["allowed"] is True and "patch" not in answer


def test_in_a_cluster_the_webhook_is_reached_through_its_service(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPSCOPE_WEBHOOK_SERVICE", "stepscope-webhook")
    monkeypatch.setenv("STEPSCOPE_WEBHOOK_NAMESPACE", "stepscope")
    for hook in _running_webhook(cluster, monkeypatch):
        assert hook["name"] == "inject-sidecar.stepscope-injector.stepscope.io"
        client = hook["client_config"]
        assert client["url"] is None
        assert client["service"] == {"name": "stepscope-webhook", "namespace": "stepscope", "port": 443, "path": "/inject-sidecar"}
        ca = x509.load_pem_x509_certificate(base64.b64decode(client["ca_bundle"]))
        assert ca.subject.rfc4514_string() == "CN=stepscope-webhook-ca"
