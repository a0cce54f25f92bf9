"""The ProfileSession CRD document itself: a valid apiextensions/v1 object, a structural schema,
rules that compile, the printer columns and defaults that agree with stepscope.contracts.session."""

from __future__ import annotations

import copy

import kubernetes
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from kubernetes.client import ApiException

from stepscope.contracts.session import DEFAULT_CAPTURE_STEPS, MAX_ANALYSIS_PARALLELISM, SessionSpec, SpecError
from stepscope.testing.kube.fixtures import CRD_PATH
from stepscope.testing.kube.schema import apply_defaults, prune, structural_errors


@pytest.fixture(scope="module")
def crd() -> dict:
    return yaml.safe_load(CRD_PATH.read_text())


def _schema(crd: dict) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("kubernetes_version", ["1.29", "1.31", kubernetes_validate.utils.latest_version()])
def test_crd_is_a_valid_apiextensions_v1_object(crd, kubernetes_version):
    kubernetes_validate.validate(crd, kubernetes_version, strict=True)
    assert crd["metadata"]["name"] == "profilesessions.stepscope.io"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["kind"] == "ProfileSession"
    [version] = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_kubernetes_validate_catches_a_broken_crd(crd):
    broken = copy.deepcopy(crd)
    broken["spec"]["versions"][0]["served"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.31", strict=True)


def test_schema_is_structural_and_its_rules_compile(crd):
    assert structural_errors(_schema(crd)) == []


def test_structural_check_finds_untyped_fields_and_bad_rules(crd):
    broken = copy.deepcopy(_schema(crd))
    del broken["properties"]["spec"]["properties"]["capture"]["type"]
    broken["properties"]["spec"]["x-kubernetes-validations"].append({"rule": "self.timeoutSeconds >"})
    problems = structural_errors(broken)
    assert any("properties[capture].type: Required value" in p for p in problems), problems
    assert any("x-kubernetes-validations[1].rule" in p and "compilation failed" in p for p in problems), problems


def test_server_refuses_a_non_structural_crd(kube, crd):
    broken = copy.deepcopy(crd)
    del _schema(broken)["properties"]["status"]["type"]
    api = kubernetes.client.ApiextensionsV1Api(kube.api_client)
    with pytest.raises(ApiException) as e:
        api.create_custom_resource_definition(broken)
    assert e.value.status == 422
    assert "properties[status].type: Required value" in e.value.body


def test_printer_columns(crd):
    columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Workers": ".status.workersReady",
        "Slowest Rank": ".status.diagnosis.slowWorkers[0].rank",
        "Summary": ".status.diagnosis.summary",
        "Age": ".metadata.creationTimestamp",
    }
    status = _schema(crd)["properties"]["status"]["properties"]
    assert status["workersReady"]["type"] == "string"
    assert status["diagnosis"]["properties"]["slowWorkers"]["items"]["properties"]["rank"]["type"] == "integer"


def _without_nones(value):
    if isinstance(value, dict):
        return {k: _without_nones(v) for k, v in value.items() if v is not None}
    return value


@pytest.mark.parametrize(
    "capture, steps", [({}, DEFAULT_CAPTURE_STEPS), ({"steps": 7}, 7), ({"durationSeconds": 30}, None)]
)
def test_schema_defaults_agree_with_the_session_model(crd, capture, steps):
    minimal = {
        "selector": {"matchLabels": {"app": "trainer"}},
        "storage": {"uri": "s3://bucket/prefix"},
        "capture": capture,
    }
    stored = apply_defaults(prune({"spec": minimal}, _schema(crd), root=True), _schema(crd))["spec"]
    model = SessionSpec.from_dict(stored)
    assert model.capture.steps == steps
    expected = _without_nones(model.to_dict())
    if "steps" not in capture:
        expected["capture"].pop("steps", None)  # the operator's default, deliberately not the schema's
    assert stored == expected


def test_the_api_server_accepts_the_crd(kube, crd):
    """kube-apiserver checks every default against the rules of its node when the CRD is created
    (an earlier CRD was refused for hardwareMetrics' `{}` default)."""
    created = kube.apply_crd()
    assert created["metadata"]["name"] == crd["metadata"]["name"]
    assert structural_errors(_schema(crd), "spec.validation.openAPIV3Schema") == []


def _undescribed(node: dict, path: str) -> list[str]:
    found = [] if node.get("description") else [path]
    for key, sub in (node.get("properties") or {}).items():
        if not (path == "" and key == "metadata"):  # the API server allows nothing but its type there
            found += _undescribed(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict) and node["items"].get("properties"):
        found += _undescribed(node["items"], f"{path}[]")
    return found


def test_every_field_has_a_description_for_kubectl_explain(crd):
    assert _undescribed(_schema(crd), "") == []


def test_the_report_location_is_documented_where_users_look(crd):
    storage = _schema(crd)["properties"]["spec"]["properties"]["storage"]["description"]
    assert "<uri>/<namespace>/<name>-<first 8 characters of metadata.uid>/" in storage and "report/" in storage


def test_kubectl_explain_states_the_default_steps_the_operator_uses(crd):
    """`steps` has no schema default (it would break the steps/durationSeconds rule), so its
    description is where `kubectl explain` tells users the default: the spec's, from one home."""
    capture = _schema(crd)["properties"]["spec"]["properties"]["capture"]["properties"]
    assert f"({DEFAULT_CAPTURE_STEPS} when neither steps nor durationSeconds is set)" in capture["steps"]["description"]
    trigger = yaml.safe_load((CRD_PATH.parent / "profiletrigger.yaml").read_text())
    assert f"({DEFAULT_CAPTURE_STEPS} when neither" in yaml.safe_dump(trigger, width=10_000)


def test_capture_budget_bounds_are_the_session_models_and_kubectl_explain_says_why(crd):
    """maxStackEvents and maxMemoryMB: the CRD's maxima are the model's (a spec the CLI takes, the
    API server takes), and their descriptions state the bound and what it protects."""
    from stepscope.contracts.session import MAX_MEMORY_MB, MAX_STACK_EVENTS, SpecError

    limits = _schema(crd)["properties"]["spec"]["properties"]["capture"]["properties"]["limits"]["properties"]
    assert (limits["maxStackEvents"]["maximum"], limits["maxMemoryMB"]["maximum"]) == (MAX_STACK_EVENTS, MAX_MEMORY_MB)
    assert (
        "at most 1,000,000" in limits["maxStackEvents"]["description"]
        and "3 GB" in limits["maxStackEvents"]["description"]
    )
    assert "at most 16384" in limits["maxMemoryMB"]["description"]
    storage = {"uri": "s3://bucket/prefix", "credentialsSecret": "s"}
    SessionSpec.from_dict(
        {"storage": storage, "capture": {"limits": {"maxStackEvents": MAX_STACK_EVENTS, "maxMemoryMB": MAX_MEMORY_MB}}}
    )
    for limits_given in (
        {"maxStackEvents": MAX_STACK_EVENTS + 1},
        {"maxMemoryMB": MAX_MEMORY_MB + 1},
        {"maxStackEvents": 10**8},
        {"maxMemoryMB": 1 << 20},
    ):
        with pytest.raises(
            SpecError,
            match=(
                r"spec\.capture\.limits\.(maxStackEvents must be within 0\.\.1,000,000|maxMemoryMB must be within "
                r"1\.\.16,384)"
            ),
        ):
            SessionSpec.from_dict({"storage": storage, "capture": {"limits": limits_given}})


def test_the_cluster_refuses_file_stores_and_ambient_credentials_the_cli_keeps_them():
    from stepscope.contracts.session import SpecError

    local = SessionSpec.from_dict(
        {"storage": {"uri": "file:///tmp/sessions"}}
    )  # `stepscope capture` on the user's machine
    with pytest.raises(SpecError, match="file:// is for the local CLI only"):
        local.validate_for_cluster()
    with pytest.raises(SpecError, match="spec.storage.credentialsSecret is required on the cluster"):
        SessionSpec.from_dict({"storage": {"uri": "oss://bucket/p", "region": "cn-hangzhou"}}).validate_for_cluster()
    SessionSpec.from_dict({"storage": {"uri": "s3://bucket/p", "credentialsSecret": "store"}}).validate_for_cluster()


def test_the_analysis_parallelism_bounds_are_the_session_models(crd):
    """spec.analysis.parallelism: the CRD refuses what the model refuses (the chart caps it lower)."""
    node = _schema(crd)["properties"]["spec"]["properties"]["analysis"]["properties"]["parallelism"]
    base = {"selector": {"matchLabels": {"a": "b"}}, "storage": {"uri": "s3://b/p"}, "capture": {"steps": 2}}
    assert (node["minimum"], node["maximum"], node["default"]) == (
        1,
        MAX_ANALYSIS_PARALLELISM,
        SessionSpec.from_dict(base).analysis.parallelism,
    )
    for bad in (0, MAX_ANALYSIS_PARALLELISM + 1):
        with pytest.raises(SpecError, match="spec.analysis.parallelism"):
            SessionSpec.from_dict({**base, "analysis": {"parallelism": bad}})
