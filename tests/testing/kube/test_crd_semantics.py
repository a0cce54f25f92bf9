"""What the test API server does with any CRD: pruning, defaulting, CEL (transition rules,
messageExpression, evaluation errors), refusing CRDs whose rules do not compile."""
from __future__ import annotations

import copy

import kubernetes
import pytest

from stepscope.testing.kube.helpers import refused

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
                {"rule": "!has(self.nested) || self.nested.inner != 'forbidden'", "fieldPath": ".nested.inner", "reason": "FieldValueForbidden"},
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
        'Widget.example.test "b" is invalid: spec: Invalid value: size 11 exceeds limit')
    assert "a large ratio needs size > 1" in _invalid(lambda: _create(widgets, "c", {"label": "w-c", "ratio": 1}))


def test_a_rule_that_cannot_evaluate_is_a_422_not_a_crash(widgets):
    # kube-apiserver's wording: the node's path and type, the rule's message (the rule when it has none).
    assert _invalid(lambda: _create(widgets, "d", {})) == (
        'Widget.example.test "d" is invalid: spec: Invalid value: "object": no such key: label evaluating rule: label must start with w-')


def test_transition_rules_run_on_updates_only(widgets):
    _create(widgets, "e", {"label": "w-e", "size": 5})
    patch = lambda size: widgets.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "e", {"spec": {"size": size}})  # noqa: E731 (a one-line helper local to the test)
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


def _crd_refusal(kube, mutate) -> str:
    broken = copy.deepcopy(WIDGET_CRD)
    mutate(broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])
    return _invalid(lambda: kubernetes.client.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(broken))


def _rule_on(node_name: str, rule: dict):
    def mutate(spec: dict) -> None:
        node = spec if node_name == "spec" else spec["properties"][node_name]
        node.setdefault("x-kubernetes-validations", []).append(rule)
    return mutate


def test_defaults_are_checked_against_the_rules_without_nested_defaults(kube):
    """What kube-apiserver v1.36 answered for stepscope's first CRD: a `{}` default is evaluated
    as `{}` against its node's rules (the nested defaults are not applied to it first)."""
    message = _crd_refusal(kube, _rule_on("nested", {"rule": "self.inner == 'x'", "message": "inner must be x"}))
    assert message == (
        'CustomResourceDefinition.apiextensions.k8s.io "widgets.example.test" is invalid: '
        'spec.validation.openAPIV3Schema.properties[spec].properties[nested].default: Invalid value: "object": '
        "no such key: inner evaluating rule: inner must be x")


def test_defaults_are_checked_against_their_schema_and_pruning(kube):
    def bad_defaults(spec: dict) -> None:
        spec["properties"]["size"]["minimum"] = 2
        spec["properties"]["nested"]["default"] = {"inner": "x", "stray": 1}
    message = _crd_refusal(kube, bad_defaults)
    assert "properties[size].default: Invalid value: 1:" in message and "should be greater than or equal to 2" in message
    assert 'properties[nested].default: Invalid value: "object": must not have unknown fields' in message


def test_rules_on_maps_methods_and_preserved_fields_are_not_flagged():
    from stepscope.testing.kube.schema import _undefined_fields
    spec = WIDGET_SCHEMA["properties"]["spec"]
    assert _undefined_fields("self.label.startsWith('w-') && self.free.anything.goes && self.nested.inner.size() > 0", spec, False) == []
    assert _undefined_fields("self.metadata.name == 'x' && self.spec.size > 0", WIDGET_SCHEMA, True) == []


def test_a_default_that_passes_its_rules_is_accepted(kube):
    crd = copy.deepcopy(WIDGET_CRD)
    _rule_on("nested", {"rule": "!has(self.inner) || self.inner == 'x'"})(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])
    kubernetes.client.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(crd)


@pytest.mark.parametrize("rule, refusal", [
    ({"rule": "true", "fieldPath": ".nosuch"}, 'fieldPath: Invalid value: ".nosuch": fieldPath must be a valid path'),
    ({"rule": "true", "reason": "Nope"}, 'reason: Unsupported value: "Nope"'),
    ({"rule": "true", "message": "two\nlines"}, "message must not contain line breaks"),
    ({"rule": " "}, "rule: Required value: rule is not specified"),
    ({"rule": "self.size <= self.limt"}, "rule: Invalid value: compilation failed: undefined field 'limt'"),
    ({"rule": "has(self.nested.innr)"}, "compilation failed: undefined field 'innr'"),
])
def test_rule_entries_are_checked(kube, rule, refusal):
    assert refusal in _crd_refusal(kube, _rule_on("spec", rule))


def test_list_map_keys_must_be_required_or_defaulted(kube):
    def map_list(spec: dict) -> None:
        spec["properties"]["entries"] = {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["id"],
                                         "items": {"type": "object", "properties": {"id": {"type": "string"}}}}
    assert "properties[entries].items.properties[id].default: Required value" in _crd_refusal(kube, map_list)


def test_printer_column_types_are_checked(kube):
    crd = copy.deepcopy(WIDGET_CRD)
    crd["spec"]["versions"][0]["additionalPrinterColumns"] = [{"name": "Size", "type": "int", "jsonPath": ".spec.size"}]
    message = _invalid(lambda: kubernetes.client.ApiextensionsV1Api(kube.api_client).create_custom_resource_definition(crd))
    assert 'spec.versions[0].additionalPrinterColumns[0].type: Unsupported value: "int"' in message
