"""Updates of a pod in the test API server: the spec rules of kube-apiserver's ValidatePodUpdate,
and the mutating webhooks called on UPDATE (with oldObject) before those rules see the result."""
from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import pytest

from stepscope.operator.injection import certs
from stepscope.testing.kube.fixtures import Kube
from stepscope.testing.kube.helpers import pod, refused

SMP = "application/strategic-merge-patch+json"
PYTHONPATH = [{"name": "PYTHONPATH", "value": "/app"}]


@pytest.fixture
def core(kube: Kube) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kube.api_client)


def _patch(core: kubernetes.client.CoreV1Api, name: str, body: dict[str, Any], content_type: str = SMP) -> dict[str, Any]:
    return core.api_client.sanitize_for_serialization(core.patch_namespaced_pod(name, "default", body, _content_type=content_type))


def test_a_pod_update_may_change_only_what_kube_apiserver_lets_it(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p", {"app": "a"}, tolerations=[{"key": "k", "operator": "Exists", "effect": "NoExecute"}]))
    env = {"spec": {"containers": [{"name": "train", "env": PYTHONPATH}]}}
    status = refused(lambda: _patch(core, "p", env), 422)
    message = status["message"]
    assert [(c["field"], c["reason"]) for c in status["details"]["causes"]] == [("spec", "FieldValueForbidden")]
    assert message.startswith('Pod "p" is invalid: spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,')
    assert "+ containers:" in message
    added = {"spec": {"containers": [{"name": "train", "image": "trainer:1"}, {"name": "more", "image": "x"}]}}
    assert refused(lambda: _patch(core, "p", added), 422)["message"].endswith("spec.containers: Forbidden: pod updates may not add or remove containers")
    changed = {"spec": {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]}}
    assert "spec.tolerations: Forbidden: existing toleration can not be modified" in refused(lambda: _patch(core, "p", changed, "application/merge-patch+json"), 422)["message"]
    # What may change: metadata, images, added tolerations (with tolerationSeconds), a lower deadline.
    _patch(core, "p", {"metadata": {"labels": {"app": "b"}}, "spec": {"containers": [{"name": "train", "image": "trainer:2"}],
                                                                      "activeDeadlineSeconds": 60}})
    _patch(core, "p", {"spec": {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5},
                                                {"key": "new", "operator": "Exists"}]}}, "application/merge-patch+json")
    assert "must be less than or equal to previous value" in refused(lambda: _patch(core, "p", {"spec": {"activeDeadlineSeconds": 61}}), 422)["message"]
    stored = core.api_client.sanitize_for_serialization(core.read_namespaced_pod("p", "default"))
    assert stored["spec"]["containers"][0]["image"] == "trainer:2" and len(stored["spec"]["tolerations"]) == 2


class _Hook(BaseHTTPRequestHandler):
    """A mutating webhook that records each AdmissionReview and puts PYTHONPATH back to /boot:/app."""
    reviews: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.reviews.append(review["request"])
        ops = [{"op": "replace", "path": "/spec/containers/0/env/0/value", "value": "/boot:/app"}]
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(ops).encode()).decode()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    cert = certs.generate(["127.0.0.1"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.socket = cert.server_context().wrap_socket(server.socket, server_side=True)
    _Hook.reviews = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}/", base64.b64encode(cert.ca_pem).decode(), _Hook.reviews
    server.shutdown()
    server.server_close()


def test_mutating_webhooks_are_called_on_update_with_the_old_object_and_their_match_conditions(
        kube: Kube, core: kubernetes.client.CoreV1Api, hook: tuple[str, str, list[dict[str, Any]]]) -> None:
    url, ca, reviews = hook
    injected = "has(oldObject.metadata.annotations) && 'example.io/injected' in oldObject.metadata.annotations"
    kubernetes.client.AdmissionregistrationV1Api(kube.api_client).create_mutating_webhook_configuration({
        "metadata": {"name": "restore"}, "webhooks": [{
            "name": "restore.example.io", "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "clientConfig": {"url": url, "caBundle": ca}, "objectSelector": {"matchLabels": {"inject": "true"}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["UPDATE"]}],
            "matchConditions": [{"name": "injected", "expression": injected},
                                {"name": "spec-changed", "expression": "object.spec != oldObject.spec"}]}]})
    body = pod("p", {"inject": "true"}, containers=[{"name": "train", "image": "trainer:1", "env": [{"name": "PYTHONPATH", "value": "/boot:/app"}]}])
    body["metadata"]["annotations"] = {"example.io/injected": "true"}
    core.create_namespaced_pod("default", body)
    assert reviews == []  # a CREATE: the rule names UPDATE only
    _patch(core, "p", {"metadata": {"labels": {"more": "x"}}})
    assert reviews == []  # the spec did not change: matchConditions skip the call
    # kubectl apply's three-way patch putting the manifest's value back: the webhook restores it.
    reverted = {"spec": {"$setElementOrder/containers": [{"name": "train"}],
                         "containers": [{"$setElementOrder/env": [{"name": "PYTHONPATH"}], "env": PYTHONPATH, "name": "train"}]}}
    stored = _patch(core, "p", reverted)
    assert stored["spec"]["containers"][0]["env"] == [{"name": "PYTHONPATH", "value": "/boot:/app"}]
    (review,) = reviews
    assert review["operation"] == "UPDATE" and review["options"]["kind"] == "UpdateOptions"
    assert review["object"]["spec"]["containers"][0]["env"] == PYTHONPATH
    assert review["oldObject"]["spec"]["containers"][0]["env"][0]["value"] == "/boot:/app"
    # A pod without the annotation is not sent: its update is refused by the pod update rules.
    core.create_namespaced_pod("default", pod("q", {"inject": "true"}, containers=[{"name": "train", "image": "t", "env": PYTHONPATH}]))
    changed = {"spec": {"containers": [{"name": "train", "env": [{"name": "PYTHONPATH", "value": "/other"}]}]}}
    assert "pod updates may not change fields" in refused(lambda: _patch(core, "q", changed), 422)["message"]
    assert len(reviews) == 1
