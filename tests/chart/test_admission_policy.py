"""The chart's ValidatingAdmissionPolicies (templates/admission-policy.yaml), rendered by the real
helm and evaluated by the test double of stepscope/testing/kube/admission_policy.py (cel-python; what it does
not do is in its docstring): what the operator's identity writes is what the operator builds,
and the writes an attacker holding that identity would make are refused."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import cache
from typing import Any

import jsonpatch
import pytest

from stepscope.operator.injection.webhook import Endpoint
from stepscope.operator.sessions import jobs
from stepscope.operator.settings import OperatorSettings
from stepscope.testing.kube.admission_policy import refusals
from tests.chart.conftest import RELEASE_NAMESPACE
from tests.chart.conftest import render_templates as render

OPERATOR = f"system:serviceaccount:{RELEASE_NAMESPACE}:stepscope-operator"
JOBS = {"group": "batch", "version": "v1", "resource": "jobs"}
SECRETS = {"group": "", "version": "v1", "resource": "secrets"}
MWC = {"group": "admissionregistration.k8s.io", "version": "v1", "resource": "mutatingwebhookconfigurations"}


@cache
def _chart() -> tuple[dict[str, Any], ...]:
    return tuple(
        render("admission-policy.yaml", "deployment.yaml", "webhook.yaml", operator={"namespaces": ["team-a"]})
    )


def _policy(suffix: str) -> dict[str, Any]:
    (policy,) = [
        d
        for d in _chart()
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == f"stepscope-{suffix}.stepscope.io"
    ]
    (binding,) = [
        d
        for d in _chart()
        if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"]["policyName"] == policy["metadata"]["name"]
    ]
    assert binding["spec"]["validationActions"] == ["Deny"] and "matchResources" not in binding["spec"]
    return policy


def _request(
    resource: dict[str, str],
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None = None,
    operation: str = "CREATE",
    user: str = OPERATOR,
) -> dict[str, Any]:
    return {
        "operation": operation,
        "userInfo": {"username": user},
        "resource": resource,
        "namespace": "team-a",
        "name": ((obj or old or {}).get("metadata") or {}).get("name", ""),
        "object": obj,
        "oldObject": old,
    }


def _operator_settings() -> OperatorSettings:
    """The settings the chart's Deployment gives the operator (its env)."""
    (deployment,) = [d for d in _chart() if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    return OperatorSettings(image=env["STEPSCOPE_IMAGE"], analysis_account=env["STEPSCOPE_ANALYSIS_SERVICE_ACCOUNT"])


def _job() -> dict[str, Any]:
    """The analysis Job exactly as the operator builds it."""
    return jobs.job(
        "team-a",
        "s1",
        "0123456789abcdef",
        _operator_settings(),
        "store",
        {"accessKeyId": "AK", "secretAccessKey": "SK"},
    )


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def _root_fs(job: dict[str, Any]) -> None:
    _pod(job)["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    _pod(job)["containers"][0]["volumeMounts"] = [{"name": "root", "mountPath": "/host"}]


ATTACKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "another ServiceAccount": lambda j: _pod(j).update(serviceAccountName="default"),
    "no ServiceAccount (the namespace's default)": lambda j: _pod(j).pop("serviceAccountName"),
    "another image": lambda j: _pod(j)["containers"][0].update(image="evil.example/shell:latest"),
    "an init container of another image": lambda j: _pod(j).update(
        initContainers=[{"name": "x", "image": "busybox", "securityContext": {"allowPrivilegeEscalation": False}}]
    ),
    "privileged": lambda j: _pod(j)["containers"][0]["securityContext"].update(privileged=True),
    "hostPath /": _root_fs,
    "hostPID": lambda j: _pod(j).update(hostPID=True),
    "hostNetwork": lambda j: _pod(j).update(hostNetwork=True),
    "hostIPC": lambda j: _pod(j).update(hostIPC=True),
    "an added capability": lambda j: _pod(j)["containers"][0]["securityContext"].update(
        capabilities={"add": ["SYS_ADMIN"]}
    ),
    "privilege escalation": lambda j: _pod(j)["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
    "no container securityContext": lambda j: _pod(j)["containers"][0].pop("securityContext"),
    "runAsNonRoot false": lambda j: _pod(j)["containers"][0]["securityContext"].update(runAsNonRoot=False),
    "root user": lambda j: _pod(j)["securityContext"].update(runAsUser=0),
    "no pod runAsNonRoot": lambda j: _pod(j)["securityContext"].pop("runAsNonRoot"),
}


def test_the_job_the_operator_builds_passes() -> None:
    assert refusals(_policy("analysis-jobs"), _request(JOBS, _job())) == []


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_attack_job_of_the_operators_identity_is_refused(attack: str) -> None:
    job = copy.deepcopy(_job())
    ATTACKS[attack](job)
    assert refusals(_policy("analysis-jobs"), _request(JOBS, job)), attack


def test_other_users_jobs_are_not_the_policys_business() -> None:
    job = _job()
    ATTACKS["privileged"](job)
    assert refusals(_policy("analysis-jobs"), _request(JOBS, job, user="system:serviceaccount:team-a:ci")) is None


@pytest.mark.parametrize(
    ("secret", "refused"),
    [
        ({"metadata": {"name": "stepscope-hmac"}, "type": "Opaque", "data": {"key": "a2V5"}}, False),
        ({"metadata": {"name": "stepscope-hmac"}, "data": {"key": "a2V5"}}, False),
        ({"metadata": {"name": "stepscope-webhook-tls"}, "type": "kubernetes.io/tls", "data": {}}, False),
        # The token controller fills a token of the named ServiceAccount into such a Secret.
        (
            {
                "metadata": {"name": "steal", "annotations": {"kubernetes.io/service-account.name": "default"}},
                "type": "kubernetes.io/service-account-token",
            },
            True,
        ),
        ({"metadata": {"name": "steal"}, "type": "kubernetes.io/service-account-token"}, True),
        (
            {
                "metadata": {"name": "steal", "annotations": {"kubernetes.io/service-account.name": "default"}},
                "type": "Opaque",
            },
            True,
        ),
        ({"metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson", "data": {}}, True),
    ],
)
def test_the_operator_writes_no_token_secret(secret: dict[str, Any], refused: bool) -> None:
    assert bool(refusals(_policy("secrets"), _request(SECRETS, secret))) == refused


def _configuration() -> dict[str, Any]:
    (config,) = [d for d in _chart() if d["kind"] == "MutatingWebhookConfiguration"]
    return config


def _ca_patched(config: dict[str, Any]) -> dict[str, Any]:
    """The configuration after the operator's own caBundle upkeep (webhook.Endpoint's JSON patch)."""
    endpoint = Endpoint(
        config=config["metadata"]["name"],
        tls_secret="stepscope-webhook-tls",
        service="stepscope-webhook",
        namespace=RELEASE_NAMESPACE,
        url=None,
        addr="0.0.0.0",
        port=9443,
    )
    ops = endpoint.client_config_ops(config, "Q0E=")
    assert ops
    return jsonpatch.apply_patch(config, ops)


def _hook(c: dict[str, Any]) -> dict[str, Any]:
    return c["webhooks"][0]


WEBHOOK_ATTACKS: dict[str, Callable[[dict[str, Any]], None]] = {
    # Every pod of the cluster through the operator (kube-system's included).
    "namespaceSelector dropped": lambda c: _hook(c).pop("namespaceSelector"),
    "objectSelector dropped": lambda c: _hook(c).pop("objectSelector"),
    "namespaceSelector widened": lambda c: _hook(c).update(namespaceSelector={}),
    "matchConditions dropped": lambda c: _hook(c).pop("matchConditions"),
    "rules widened": lambda c: _hook(c).update(
        rules=[{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "operations": ["*"]}]
    ),
    "failurePolicy Fail (the operator blocks pods)": lambda c: _hook(c).update(failurePolicy="Fail"),
    "timeout raised": lambda c: _hook(c).update(timeoutSeconds=30),
    "sent elsewhere by URL": lambda c: (
        _hook(c)["clientConfig"].update(url="https://evil.example/") or _hook(c)["clientConfig"].pop("service")
    ),
    "another Service": lambda c: _hook(c)["clientConfig"]["service"].update(name="evil", namespace="team-a"),
    "a second webhook": lambda c: c["webhooks"].append({**copy.deepcopy(_hook(c)), "name": "more.stepscope.io"}),
    "an owner that is gone (the garbage collector deletes it)": lambda c: c["metadata"].update(
        ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "0"}]
    ),
    "a finalizer": lambda c: c["metadata"].update(finalizers=["stepscope.io/stuck"]),
}


def test_the_operators_ca_bundle_upkeep_passes() -> None:
    old = _configuration()
    assert refusals(_policy("webhook-configuration"), _request(MWC, _ca_patched(old), old, "UPDATE")) == []


@pytest.mark.parametrize("attack", sorted(WEBHOOK_ATTACKS))
def test_any_other_change_of_the_webhook_configuration_is_refused(attack: str) -> None:
    old = _configuration()
    new = _ca_patched(old)
    WEBHOOK_ATTACKS[attack](new)
    assert refusals(_policy("webhook-configuration"), _request(MWC, new, old, "UPDATE")), attack


@pytest.mark.parametrize("operation", ["CREATE", "DELETE"])
def test_the_operator_never_creates_or_deletes_a_webhook_configuration(operation: str) -> None:
    config = _configuration()
    new, old = (config, None) if operation == "CREATE" else (None, config)
    assert refusals(_policy("webhook-configuration"), _request(MWC, new, old, operation))


def test_the_shard_job_the_operator_builds_passes() -> None:
    """The Indexed Job that summarises raw traces is the analysis Job's pod with other Job fields:
    the policy, which pins the pod, admits it as it is."""
    shards = jobs.shard_job(
        "team-a",
        "s1",
        "0123456789abcdef",
        _operator_settings(),
        "store",
        {"accessKeyId": "AK", "secretAccessKey": "SK"},
        completions=12,
        parallelism=4,
    )
    assert shards["spec"]["completionMode"] == "Indexed"
    assert refusals(_policy("analysis-jobs"), _request(JOBS, shards)) == []
    ATTACKS["privileged"](shards)
    assert refusals(_policy("analysis-jobs"), _request(JOBS, shards))
