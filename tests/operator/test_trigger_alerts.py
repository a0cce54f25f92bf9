"""The Alertmanager webhook endpoint over real HTTP: Alertmanager's payload, the namespace's bearer
token, and the real operator taking the alert into a ProfileSession."""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from stepscope.local.launch import free_port
from stepscope.operator.settings import GROUP, PLURAL, VERSION
from stepscope.operator.triggers.alerts import ALERT_ANNOTATION, alert_token
from stepscope.operator.triggers.policy import TRIGGER_LABEL, TRIGGER_PLURAL
from stepscope.testing.kube.fixtures import REPO, Kube
from stepscope.testing.kube.helpers import wait_for
from tests.operator.harness import KEY, NAMESPACE, OperatorHarness

# What Alertmanager posts (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config).
PAYLOAD = {
    "version": "4", "groupKey": "{}:{alertname=\"StepscopeStepTimeHigh\"}", "truncatedAlerts": 0, "status": "firing",
    "receiver": "stepscope", "groupLabels": {"alertname": "StepscopeStepTimeHigh"},
    "commonLabels": {"alertname": "StepscopeStepTimeHigh", "namespace": "default"}, "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "alerts": [
        {"status": "firing", "labels": {"alertname": "StepscopeStepTimeHigh", "pod": "train-0"},
         "annotations": {"summary": "step time 2.1x the last hour's"}, "startsAt": "2026-11-24T02:00:00Z",
         "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus/graph", "fingerprint": "a1"},
        {"status": "resolved", "labels": {"alertname": "StepscopeHang"}, "annotations": {}, "startsAt": "2026-11-24T01:00:00Z",
         "endsAt": "2026-11-24T01:10:00Z", "generatorURL": "", "fingerprint": "b2"}],
}


@pytest.fixture
def alerting(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> tuple[Kube, int]:
    cluster.apply_crd(REPO / "crds" / "profiletrigger.yaml")
    port = free_port()
    monkeypatch.setenv("STEPSCOPE_ALERTS_PORT", str(port))
    monkeypatch.setenv("STEPSCOPE_TRIGGER_POLL_INTERVAL_S", "0.5")
    return cluster, port


def post(port: int, path: str, body: Any, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_an_alert_fires_the_trigger_into_a_session(alerting: tuple[Kube, int], operator: OperatorHarness) -> None:
    _, port = alerting
    spec = {"selector": {"matchLabels": {"job": "none"}}, "sessionTemplate": {"storage": {"uri": "s3://bucket/auto", "credentialsSecret": "store-credentials"}}}
    operator.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, TRIGGER_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileTrigger", "metadata": {"name": "alerted"}, "spec": spec})
    path = f"/v1/alerts/{NAMESPACE}/alerted"
    token = alert_token(KEY)
    wait_for(lambda: listening(port), 20, "the endpoint (served from kopf's startup)")

    assert post(port, path, PAYLOAD, None)[0] == 401
    assert post(port, path, PAYLOAD, alert_token(b"another namespace's key"))[0] == 401
    assert post(port, path, {"not": "alertmanager"}, token)[0] == 400
    assert post(port, f"/v1/alerts/{NAMESPACE}/missing", PAYLOAD, token) == (404, {"error": "no such ProfileTrigger"})
    resolved = {**PAYLOAD, "status": "resolved", "alerts": PAYLOAD["alerts"][1:]}
    assert post(port, path, resolved, token)[0] == 200

    status, answer = post(port, path, PAYLOAD, token)
    assert status == 202 and answer["fired"], answer
    [session] = wait_for(lambda: operator.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, label_selector=f"{TRIGGER_LABEL}=alerted")["items"],
                         20, "the alert's session")
    assert session["metadata"]["name"].startswith("alerted-")
    fired = wait_for(lambda: (s := operator.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, TRIGGER_PLURAL, "alerted").get("status") or {})
                     .get("lastFired") and s["lastFired"], 10, "the trigger's status")
    assert fired["condition"] == "Alert" and fired["reason"] == "Alertmanager: StepscopeStepTimeHigh: step time 2.1x the last hour's"
    assert fired["session"] == session["metadata"]["name"]
    trigger = operator.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, TRIGGER_PLURAL, "alerted")
    assert ALERT_ANNOTATION not in (trigger["metadata"].get("annotations") or {})


def test_a_label_key_the_schema_cannot_check_makes_the_trigger_invalid(alerting: tuple[Kube, int], operator: OperatorHarness) -> None:
    spec = {"selector": {"matchLabels": {"bad key!": "x"}}, "sessionTemplate": {"storage": {"uri": "s3://bucket/auto", "credentialsSecret": "store-credentials"}}}
    operator.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, TRIGGER_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileTrigger", "metadata": {"name": "bad-key"}, "spec": spec})
    status = wait_for(lambda: (s := operator.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, TRIGGER_PLURAL, "bad-key").get("status") or {})
                      .get("state") and s, 10, "the trigger's status")
    assert status["state"] == "Invalid"
    [ready] = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert "spec.selector.matchLabels: label key 'bad key!'" in ready["message"]
