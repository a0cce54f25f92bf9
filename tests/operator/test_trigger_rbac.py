"""A ProfileTrigger fires under exactly the chart's RBAC (the operator as its ServiceAccount): it
takes an alert from its annotation, creates the session it owns (blockOwnerDeletion needs
profiletriggers/finalizers), writes its status and posts its Event."""
from __future__ import annotations

import json

import kubernetes

from stepscope.operator.settings import GROUP, PLURAL, VERSION
from stepscope.operator.triggers.alerts import ALERT_ANNOTATION
from stepscope.operator.triggers.policy import TRIGGER_LABEL, TRIGGER_PLURAL
from stepscope.testing.kube.fixtures import REPO
from stepscope.testing.kube.helpers import wait_for
from tests.chart.conftest import helm  # noqa: F401 (a fixture chart_operator uses)
from tests.operator.harness import NAMESPACE
from tests.operator.test_chart_rbac import chart_operator  # noqa: F401 (a fixture)


def test_a_trigger_fires_under_the_charts_rbac(cluster, chart_operator, monkeypatch) -> None:
    cluster.apply_crd(REPO / "crds" / "profiletrigger.yaml")
    monkeypatch.setenv("STEPSCOPE_TRIGGER_POLL_INTERVAL_S", "0.5")
    operator = chart_operator()
    alert = json.dumps({"time": "2026-11-24T03:00:00Z", "summary": "StepscopeHang: no step for 10m"})
    operator.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, TRIGGER_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileTrigger",
        "metadata": {"name": "rbac-watch", "annotations": {ALERT_ANNOTATION: alert}},
        "spec": {"selector": {"matchLabels": {"job": "none"}}, "sessionTemplate": {"storage": {"uri": "s3://bucket/auto", "credentialsSecret": "store-credentials"}}}})
    [session] = wait_for(lambda: operator.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, label_selector=f"{TRIGGER_LABEL}=rbac-watch")["items"],
                         20, "the trigger's session")
    assert session["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    status = wait_for(lambda: (s := operator.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, TRIGGER_PLURAL, "rbac-watch").get("status") or {})
                      .get("sessionsCreated") and s, 10, "the trigger's status")
    assert status["lastFired"]["session"] == session["metadata"]["name"]
    assert status["conditions"][0]["reason"] == "NoPodsSelected"
    trigger = operator.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, TRIGGER_PLURAL, "rbac-watch")
    assert ALERT_ANNOTATION not in (trigger["metadata"].get("annotations") or {})
    events = wait_for(lambda: [e for e in kubernetes.client.CoreV1Api(operator.kube.api_client).list_namespaced_event(NAMESPACE).items
                               if e.reason == "SessionCreated"], 10, "the SessionCreated event")
    assert session["metadata"]["name"] in events[0].message
