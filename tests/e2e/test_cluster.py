"""The checks a real API server makes and the test API server may not (tests/e2e/README.md lists
them): the CRD's creation, schema, CEL rules and printer columns; the chart's RBAC being enough for
the operator and the analysis Job (real authorization, the chart's admission policy on the Job the
operator creates); the real garbage collector; the failures that must say why."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from typing import Any

import kubernetes
import pytest

from stepscope.sidecar.daemon import Sidecar
from tests.crd.test_rules import RULE_CASES, RULE_NODE_VALUE
from tests.e2e.conftest import Cluster, running_pod, session_body
from tests.operator.harness import port_of

GROUP, VERSION, PLURAL = "stepscope.io", "v1alpha1", "profilesessions"


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _api(cluster: Cluster) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(cluster.api_client)


def _create(cluster: Cluster, body: dict[str, Any]) -> dict[str, Any]:
    return _api(cluster).create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body)


def _get(cluster: Cluster, name: str) -> dict[str, Any]:
    return _api(cluster).get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, name)


def _phase(cluster: Cluster, name: str, phases: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
    return _wait(
        lambda: (s := _get(cluster, name).get("status") or {}).get("phase") in phases and s,
        timeout,
        f"{name} in {phases}",
    )


def _reason(status: dict[str, Any]) -> str:
    return next(c["reason"] for c in status["conditions"] if c["type"] == "Ready")


def _refused(call: Any) -> dict[str, Any]:
    with pytest.raises(kubernetes.client.ApiException) as e:
        call()
    assert e.value.status == 422, e.value.body
    return json.loads(e.value.body)


# -- the CRD on the real API server ----------------------------------------------------------


@pytest.mark.parametrize("case, spec, field, message", RULE_CASES, ids=[c[0] for c in RULE_CASES])
def test_the_crd_rules_refuse_bad_specs(cluster: Cluster, case: str, spec: dict, field: str, message: str) -> None:
    body = session_body(cluster, f"rule-{case}", {"app": "x"})
    for key in ("hangTimeoutSeconds", "timeoutSeconds"):  # the schema's defaults, as tests/crd has them
        del body["spec"][key]
    body["spec"].update(spec)
    status = _refused(lambda: _create(cluster, body))
    assert {"field": field, "message": f"Invalid value: {RULE_NODE_VALUE.get(case, '')}{message}"} in [
        {k: c[k] for k in ("field", "message")} for c in status["details"]["causes"]
    ], status


def test_defaults_and_printer_columns(cluster: Cluster) -> None:
    stored = _create(cluster, session_body(cluster, "defaults", {"app": "none"}, capture={}))
    spec = stored["spec"]
    assert spec["capture"]["waitSteps"] == 5 and spec["hardwareMetrics"]["intervalMicroseconds"] == 1000
    assert spec["registrationTimeoutSeconds"] == 120
    table = _api(cluster).list_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, _headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    )
    assert [c["name"] for c in table["columnDefinitions"]][:6] == [
        "Name",
        "Phase",
        "Workers",
        "Slowest Rank",
        "Summary",
        "Age",
    ]


# -- sessions through the real operator ------------------------------------------------------


def _run_analysis_as_its_service_account(cluster: Cluster, name: str, account: str) -> subprocess.CompletedProcess[str]:
    """What the Job's pod would run, with the Job's own identity and the env its secretKeyRefs give
    (no kubelet runs the Job here)."""
    kubeconfig = cluster.token_kubeconfig(cluster.namespace, account)
    job = kubernetes.client.BatchV1Api(cluster.api_client).read_namespaced_job(
        _get(cluster, name)["status"]["analysisJob"], cluster.namespace
    )
    core = kubernetes.client.CoreV1Api(cluster.api_client)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    for item in job.spec.template.spec.containers[0].env or []:
        ref = item.value_from.secret_key_ref
        env[item.name] = base64.b64decode(
            core.read_namespaced_secret(ref.name, cluster.namespace).data[ref.key]
        ).decode()
    return subprocess.run(
        [sys.executable, "-m", "stepscope.cli", "analyze", "--session", f"{cluster.namespace}/{name}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_session_captures_is_analysed_and_deleted(cluster: Cluster, operator: None, sidecar_a: Sidecar) -> None:
    running_pod(cluster, "train-a", {"e2e": "train"}, port_of(sidecar_a))
    created = _create(cluster, session_body(cluster, "ok", {"e2e": "train"}))
    uid = created["metadata"]["uid"]
    status = _phase(cluster, "ok", ("Analyzing", "Failed"), timeout=120)
    assert status["phase"] == "Analyzing", status
    assert status["workers"]["uploaded"] == 2
    # The operator created the Job as its ServiceAccount, through the chart's admission policy, to
    # run as the chart's analysis ServiceAccount.
    batch = kubernetes.client.BatchV1Api(cluster.api_client)
    job = batch.read_namespaced_job(status["analysisJob"], cluster.namespace)
    assert job.metadata.owner_references[0].block_owner_deletion is True and job.metadata.owner_references[0].uid == uid
    assert job.spec.template.spec.service_account_name == cluster.analysis_account
    result = _run_analysis_as_its_service_account(cluster, "ok", job.spec.template.spec.service_account_name)
    assert result.returncode == 0, result.stderr[-2000:]
    status = _get(cluster, "ok")["status"]
    assert status["diagnosis"]["summary"] and status["artifacts"]["report"].endswith("report/index.html")
    assert next(c for c in status["conditions"] if c["type"] == "Analyzed")["status"] == "True"

    # Spec frozen, the TTL not.
    def patch(spec):
        return _api(cluster).patch_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, "ok", {"spec": spec}
        )

    assert _refused(lambda: patch({"timeoutSeconds": 600}))["details"]["causes"][0]["field"] == "spec"
    assert patch({"ttlSecondsAfterFinished": 3600})["spec"]["ttlSecondsAfterFinished"] == 3600
    # Deleting it releases the finalizer; the real garbage collector removes what it owns.
    _api(cluster).delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "ok")

    def gone(read: Any) -> bool:
        try:
            read()
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    _wait(lambda: gone(lambda: _get(cluster, "ok")), 60, "the session to be deleted")
    _wait(
        lambda: gone(lambda: batch.read_namespaced_job(status["analysisJob"], cluster.namespace)),
        120,
        "the garbage collector to delete the Job",
    )


def test_no_running_pod_fails(cluster: Cluster, operator: None) -> None:
    _create(cluster, session_body(cluster, "nopods", {"e2e": "nothing-has-this"}))
    status = _phase(cluster, "nopods", ("Failed",))
    assert _reason(status) == "NoPodsSelected" and "selects no Running pod" in status["message"]


def test_invalid_selector_fails(cluster: Cluster, operator: None) -> None:
    _create(cluster, session_body(cluster, "badlabel", {"a b": "x"}))
    status = _phase(cluster, "badlabel", ("Failed",))
    assert _reason(status) == "InvalidSpec" and "label key 'a b'" in status["message"]


def test_missing_secret_fails_naming_it(cluster: Cluster, operator: None) -> None:
    body = session_body(cluster, "nosecret", {"e2e": "train"})
    body["spec"]["storage"]["credentialsSecret"] = "absent"
    _create(cluster, body)
    status = _phase(cluster, "nosecret", ("Failed",))
    assert status["message"] == f"Secret absent not found in namespace {cluster.namespace}"


def test_no_registered_training_process_fails(cluster: Cluster, operator: None, idle: Sidecar) -> None:
    running_pod(cluster, "idle", {"e2e": "idle"}, port_of(idle))
    _create(cluster, session_body(cluster, "noreg", {"e2e": "idle"}, registrationTimeoutSeconds=2))
    status = _phase(cluster, "noreg", ("Failed",))
    assert _reason(status) == "NoTrainingProcess" and "is PYTHONPATH set to the bootstrap dir?" in status["message"]
