"""The ProfileTrigger CRD: a valid, structural apiextensions/v1 object the test API server accepts;
its session template is the ProfileSession spec without the selector; its defaults agree with
stepscope.operator.triggers.policy; bad specs are refused when applied, with the field named."""
from __future__ import annotations

import copy

import kubernetes
import kubernetes_validate
import pytest
import yaml

from stepscope.operator.settings import GROUP, VERSION
from stepscope.operator.triggers.policy import TRIGGER_PLURAL, Policy
from stepscope.testing.kube.fixtures import CRD_PATH, REPO
from stepscope.testing.kube.helpers import refused
from stepscope.testing.kube.schema import apply_defaults, prune, structural_errors

TRIGGER_CRD = REPO / "crds" / "profiletrigger.yaml"
SPEC = {"selector": {"matchLabels": {"job": "train"}}, "sessionTemplate": {"storage": {"uri": "s3://bucket/auto", "credentialsSecret": "store-credentials"}}}


def _schema(path=TRIGGER_CRD) -> dict:
    return yaml.safe_load(path.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_crd_is_valid_structural_and_packaged_beside_the_session_crd() -> None:
    crd = yaml.safe_load(TRIGGER_CRD.read_text())
    kubernetes_validate.validate(crd, "1.31", strict=True)
    assert TRIGGER_CRD.resolve() == REPO / "helm" / "stepscope" / "crds" / "profiletrigger.yaml"
    assert (crd["metadata"]["name"], crd["spec"]["scope"], crd["spec"]["names"]["kind"]) == ("profiletriggers.stepscope.io", "Namespaced", "ProfileTrigger")
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    assert structural_errors(_schema()) == []


def test_session_template_is_the_session_spec_without_its_selector() -> None:
    session = copy.deepcopy(_schema(CRD_PATH)["properties"]["spec"])
    template = copy.deepcopy(_schema()["properties"]["spec"]["properties"]["sessionTemplate"])
    del session["properties"]["selector"], session["description"], template["description"]
    session["required"].remove("selector")
    assert template == session


def _undescribed(node: dict, path: str) -> list[str]:
    found = [] if node.get("description") or path.endswith(".metadata") else [path]
    for key, sub in (node.get("properties") or {}).items():
        found += _undescribed(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict) and node["items"].get("properties"):
        found += _undescribed(node["items"], f"{path}[]")
    return found


def test_every_field_is_explained() -> None:
    assert _undescribed(_schema(), "") == []


def test_schema_defaults_agree_with_the_trigger_policy() -> None:
    stored = apply_defaults(prune({"spec": SPEC}, _schema(), root=True), _schema())["spec"]
    assert stored["conditions"]["stepTime"] == {"enabled": True, "factor": 1.5, "baselineMinutes": 10, "sustainedSeconds": 60}
    assert Policy.from_spec("t", stored) == Policy.from_spec("t", {})


@pytest.fixture
def api(kube):
    kube.apply_crd()
    kube.apply_crd(TRIGGER_CRD)
    return kubernetes.client.CustomObjectsApi(kube.api_client)


def _create(api, name: str, spec: dict) -> dict:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileTrigger", "metadata": {"name": name}, "spec": spec}
    return api.create_namespaced_custom_object(GROUP, VERSION, "default", TRIGGER_PLURAL, body)


@pytest.mark.parametrize("spec, field, complaint", [
    ({"conditions": {"stepTime": {"factor": 1}}}, "spec.conditions.stepTime.factor", "should be greater than 1"),
    ({"conditions": {"hang": {"noStepSeconds": 0}}}, "spec.conditions.hang.noStepSeconds", "should be greater than 0"),
    ({"maxSessionsPerHour": 0}, "spec.maxSessionsPerHour", "should be greater than or equal to 1"),
    ({"sessionTemplate": {"storage": {"uri": "http://bucket/p"}}}, "spec.sessionTemplate.storage.uri", "uri must be s3://bucket/prefix"),
    ({"sessionTemplate": {"storage": {"uri": "s3://b/p"}, "timeoutSeconds": 60}}, "spec.sessionTemplate.hangTimeoutSeconds",
     "hangTimeoutSeconds must not exceed timeoutSeconds"),
    ({"selector": {"matchLabels": {}}}, "spec.selector", "an empty selector would profile every pod"),
], ids=["factor-1", "no-hang-time", "no-sessions", "http-uri", "hang-beyond-timeout", "empty-selector"])
def test_bad_triggers_are_refused_naming_the_field(api, spec, field, complaint) -> None:
    status = refused(lambda: _create(api, "bad", {**SPEC, **spec}), 422)
    causes = [(c["field"], c["message"]) for c in status["details"]["causes"]]
    assert any(f == field and complaint in m for f, m in causes), causes


def test_a_minimal_trigger_is_stored_with_defaults_and_listed_with_its_columns(api) -> None:
    stored = _create(api, "watch", SPEC)["spec"]
    assert (stored["cooldownSeconds"], stored["maxSessionsPerHour"], stored["suspend"]) == (900, 4, False)
    assert stored["conditions"]["hang"] == {"enabled": True, "noStepSeconds": 300}
    assert stored["sessionTemplate"]["capture"]["waitSteps"] == 5
    api.patch_namespaced_custom_object_status(GROUP, VERSION, "default", TRIGGER_PLURAL, "watch", {"status": {
        "state": "Watching", "baseline": {"stepTimeSeconds": 0.25}, "sessionsCreated": 2,
        "lastFired": {"time": "2026-11-24T02:00:00Z", "condition": "Hang", "reason": "no step", "session": "watch-20261124020000"}}})
    rows = api.list_namespaced_custom_object(GROUP, VERSION, "default", TRIGGER_PLURAL, _headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    assert [c["name"] for c in rows["columnDefinitions"]] == ["Name", "State", "Baseline", "Last Fired", "Sessions", "Last Session", "Age"]
    [row] = rows["rows"]
    assert row["cells"][:3] == ["watch", "Watching", 0.25] and row["cells"][4:6] == [2, "watch-20261124020000"]


def test_the_example_trigger_is_accepted_as_written(api) -> None:
    body = yaml.safe_load((REPO / "examples" / "profiletrigger.yaml").read_text())
    kubernetes.client.CoreV1Api(api.api_client).create_namespace({"metadata": {"name": body["metadata"]["namespace"]}})
    stored = api.create_namespaced_custom_object(GROUP, VERSION, body["metadata"]["namespace"], TRIGGER_PLURAL, body)
    policy = Policy.from_spec(body["metadata"]["name"], stored["spec"])
    assert (policy.conditions.baseline_window_s, policy.conditions.hang_after_s, policy.cooldown_s) == (1800, 600, 1800)
