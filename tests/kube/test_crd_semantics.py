"""What the test API server does with any CRD: pruning, defaulting, CEL (transition rules,
messageExpression, evaluation errors), refusing CRDs whose rules do not compile."""
from __future__ import annotations

import copy

import kubernetes
import pytest

from tests.kube.helpers import refused

GROUP, VERSION, PLURAL = "example.test", "v1", "widgets"
WIDGET_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "x-kubernetes-validations": [
                {"rule": "self.size <= self.limit", "messageExpression": "'size ' + string(self.size) + ' exceeds limit'"},
                {"rule": "self.ratio < 0.5 || self.size > 1", "message": "a large ratio needs size > 1"},
                {"rule": "self.size >= oldSelf.size", "message": "size may only grow"},
                {"rule": "self.label.startsWith('w-')", "message": "label must start with w-"},
            ],
            "properties": {
                "size": {"type": "integer", "default": 1},
                "limit": {"type": "integer", "default": 10},
                "ratio": {"type": "number", "default": 0},
                "label": {"type": "string"},
                "nested": {"type": "object", "default": {}, "properties": {"inner": {"type": "string", "default": "x"}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "maybe": {"type": "string", "nullable": True},
            },
        },
        "status": {"type": "object", "properties": {"count": {"type": "integer"}}},
    },
}
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {"group": GROUP, "scope": "Namespaced",
             "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
             "versions": [{"name": VERSION, "served": True, "storage": True, "schema": {"openAPIV3Schema": WIDGET_SCHEMA}}]},
}


@pytest.fixture
def widgets(kube):
    kubernetes.client.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(WIDGET_CRD)
    return kubernetes.client.CustomObjectsApi(kube.api_client)


def _create(api, name: str, spec: dict) -> dict:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget", "metadata": {"name": name}, "spec": spec}
    return api.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)


def _invalid(call) -> str:
    return refused(call, 422)["message"]


def test_pruning_nulls_and_nested_defaults(widgets):
    stored = _create(widgets, "a", {"label": "w-a", "unknown": 1, "maybe": None, "free": {"any": {"thing": 1}}})
    assert stored["spec"] == {"label": "w-a", "size": 1, "limit": 10, "ratio": 0, "nested": {"inner": "x"},
                              "free": {"any": {"thing": 1}}, "maybe": None}


def test_message_expression_and_numbers_as_doubles(widgets):
    assert _invalid(lambda: _create(widgets, "b", {"label": "w-b", "size": 11})) == (
        'Widget.example.test "b" is invalid: spec: Invalid value: "object": size 11 exceeds limit')
    assert "a large ratio needs size > 1" in _invalid(lambda: _create(widgets, "c", {"label": "w-c", "ratio": 1}))


def test_a_rule_that_cannot_evaluate_is_a_422_not_a_crash(widgets):
    message = _invalid(lambda: _create(widgets, "d", {}))
    assert "evaluating rule: self.label.startsWith('w-')" in message


def test_transition_rules_run_on_updates_only(widgets):
    _create(widgets, "e", {"label": "w-e", "size": 5})
    patch = lambda size: widgets.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "e", {"spec": {"size": size}})  # noqa: E731
    assert patch(6)["spec"]["size"] == 6
    assert "size may only grow" in _invalid(lambda: patch(2))


def test_without_a_status_subresource_status_is_written_with_the_object(widgets):
    created = _create(widgets, "f", {"label": "w-f"})
    updated = widgets.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "f", {"status": {"count": 3}})
    assert updated["status"] == {"count": 3}
    assert updated["metadata"]["generation"] == created["metadata"]["generation"] + 1


def test_a_crd_whose_rule_does_not_compile_is_refused(kube):
    broken = copy.deepcopy(WIDGET_CRD)
    broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"] = [{"rule": "self.size >"}]
    message = _invalid(lambda: kubernetes.client.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(broken))
    assert "x-kubernetes-validations[0].rule: Invalid value: compilation failed" in message


def test_dry_run_is_refused_rather_than_stored(widgets):
    refused(lambda: widgets.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget", "metadata": {"name": "g"}, "spec": {"label": "w-g"}}, dry_run="All"), 400)
    assert widgets.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"] == []


def test_a_crd_must_be_named_plural_dot_group(kube):
    misnamed = copy.deepcopy(WIDGET_CRD)
    misnamed["metadata"]["name"] = "gadgets.example.test"
    message = _invalid(lambda: kubernetes.client.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(misnamed))
    assert 'metadata.name: Invalid value: "gadgets.example.test": must be spec.names.plural+"."+spec.group' in message
