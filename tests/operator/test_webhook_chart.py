"""The chart's webhook configuration and RBAC (rendered by the real helm, tests/chart/conftest.py) against the code that
relies on them: valid objects, least privilege, and one idea of which namespaces are injected."""
from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from stepscope.operator.injection.webhook import HANDLER_ID
from stepscope.operator.settings import SYSTEM_NAMESPACES, OperatorSettings
from stepscope.testing.kube.admission import _matches
from tests.chart.conftest import Failed
from tests.chart.conftest import render_templates as render
from tests.operator.test_manifests import K8S_VERSION

TEMPLATES = ("rbac-webhook.yaml", "webhook.yaml", "deployment.yaml")


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("namespaces", [["default"], ["team-a", "stepscope"]])
def test_webhook_templates_render_valid_objects(namespaces: list[str]) -> None:
    for doc in render(*TEMPLATES, operator={"namespaces": namespaces}):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("namespaces", [["default"], ["team-a", "team-b", "stepscope"]])
def test_the_namespace_selector_and_the_operator_agree_on_what_is_injected(namespaces: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (config,) = _by_kind(render("webhook.yaml", operator={"namespaces": namespaces}), "MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["name"] == f"{HANDLER_ID}.{config['metadata']['name']}" and hook["clientConfig"]["service"]["path"] == f"/{HANDLER_ID}"
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    monkeypatch.setenv("STEPSCOPE_NAMESPACES", ",".join(namespaces))
    monkeypatch.setenv("POD_NAMESPACE", "stepscope")
    settings = OperatorSettings()
    for ns in ["default", "team-a", "team-b", "team-c", "stepscope", *SYSTEM_NAMESPACES]:
        selected = _matches(hook["namespaceSelector"], {"kubernetes.io/metadata.name": ns})
        assert selected == settings.injects_into(ns), ns
    assert not settings.injects_into("kube-system") and not settings.injects_into("stepscope")


def test_webhook_rbac_is_least_privilege() -> None:
    """Its own webhook configuration by name; Secrets: create, and patch by name, never read; the
    rest only in the namespaces of operator.namespaces (none of the system ones, nor the release's)."""
    docs = render("rbac-webhook.yaml", operator={"namespaces": ["team-a", "stepscope", "team-b"]})
    rules = [r for role in _by_kind(docs, "ClusterRole") for r in role["rules"]]
    assert all(set(r["verbs"]) <= {"get", "list", "create", "patch"} and "*" not in str(r) for r in rules)
    for rule in rules:
        if "mutatingwebhookconfigurations" in rule["resources"]:
            assert rule["resourceNames"] == ["stepscope-injector.stepscope.io"] and rule["verbs"] == ["get", "patch"]
        if "secrets" in rule["resources"]:
            assert set(rule["verbs"]) <= {"create", "patch"}
            assert "patch" not in rule["verbs"] or rule["resourceNames"] == ["stepscope-hmac"]
    (cluster_wide,) = _by_kind(docs, "ClusterRoleBinding")
    assert cluster_wide["roleRef"]["name"] == "stepscope-webhook"  # the one rule on a cluster-scoped resource
    (webhook_role,) = [r for r in _by_kind(docs, "ClusterRole") if r["metadata"]["name"] == "stepscope-webhook"]
    assert [r["resources"] for r in webhook_role["rules"]] == [["mutatingwebhookconfigurations"]]
    assert [(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in _by_kind(docs, "RoleBinding")] == [
        ("stepscope", "stepscope-webhook-tls"), ("team-a", "stepscope-injection"), ("team-b", "stepscope-injection")]
    (tls_role,) = _by_kind(docs, "Role")
    assert tls_role["metadata"]["namespace"] == "stepscope" and tls_role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["stepscope-webhook-tls"], "verbs": ["get"]}]


def test_more_than_one_replica_runs_kopf_peering_and_rolls_without_a_gap() -> None:
    for replicas, peering in ((1, False), (2, True)):
        docs = render("deployment.yaml", "peering.yaml", operator={"replicas": replicas, "namespaces": ["team-a", "team-b"]})
        (deployment,) = _by_kind(docs, "Deployment")
        command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
        assert ("--peering=stepscope" in command) is peering
        assert deployment["spec"]["strategy"]["type"] == ("RollingUpdate" if peering else "Recreate")
        assert [p["metadata"]["namespace"] for p in _by_kind(docs, "KopfPeering")] == (["team-a", "team-b"] if peering else [])


def test_the_chart_names_its_namespaces_and_never_a_system_one() -> None:
    """No cluster-wide mode (docs/security.md), so also no replica set without namespaces to elect in."""
    with pytest.raises(Failed, match="operator.namespaces is empty"):
        render("deployment.yaml", operator={"replicas": 2, "namespaces": []})
    with pytest.raises(Failed, match="operator.namespaces lists kube-system"):
        render("webhook.yaml", operator={"namespaces": ["team-a", "kube-system"]})
    assert render("deployment.yaml", operator={"replicas": 1, "namespaces": ["team-a"]})[0]["spec"]["replicas"] == 1
