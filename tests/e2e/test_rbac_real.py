"""The chart's RBAC and admission policies on a real API server: what the operator's ServiceAccount
may do, asked of the real authorizer (SubjectAccessReview, what `kubectl auth can-i --as` asks),
and the writes the policies must refuse, made as that ServiceAccount (dryRun where one could pass).
The `cluster` fixture applies the chart rendered with webhook.enabled=false and the default two
replicas (tests/e2e/conftest.py)."""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from stepscope.operator.injection.webhook import Endpoint
from stepscope.operator.sessions import jobs
from stepscope.operator.settings import OperatorSettings
from tests.chart.conftest import render
from tests.e2e.conftest import Cluster


def can(cluster: Cluster, verb: str, resource: str, namespace: str = "", group: str = "", name: str = "") -> bool:
    """`kubectl auth can-i <verb> <resource>[/<subresource>] --as=<the operator's ServiceAccount>`, by the real authorizer."""
    plural, _, subresource = resource.partition("/")
    review = {"spec": {"user": cluster.operator_user,
                       "groups": ["system:serviceaccounts", f"system:serviceaccounts:{cluster.release_namespace}", "system:authenticated"],
                       "resourceAttributes": {"verb": verb, "resource": plural, "subresource": subresource, "group": group,
                                              "namespace": namespace, "name": name}}}
    return bool(kubernetes.client.AuthorizationV1Api(cluster.api_client).create_subject_access_review(review).status.allowed)


def _as_operator(cluster: Cluster) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(
        config_file=str(cluster.token_kubeconfig(cluster.release_namespace, f"{cluster.fullname}-operator")))


def _refused_by_policy(call: Any, policy: str) -> None:
    with pytest.raises(kubernetes.client.ApiException) as e:
        call()
    assert e.value.status in (403, 422), e.value.body
    assert f"ValidatingAdmissionPolicy '{policy}'" in json.loads(e.value.body)["message"], e.value.body


def test_the_operator_may_not_make_or_bind_identities(cluster: Cluster) -> None:
    ns = cluster.namespace
    for verb in ("create", "update", "patch"):
        assert not can(cluster, verb, "serviceaccounts", ns)
        assert not can(cluster, verb, "roles", ns, "rbac.authorization.k8s.io")
        assert not can(cluster, verb, "rolebindings", ns, "rbac.authorization.k8s.io")
    assert not can(cluster, "create", "serviceaccounts/token", ns, name="default")
    assert not can(cluster, "create", "secrets", "kube-system")
    assert not can(cluster, "list", "secrets", ns)
    assert not can(cluster, "create", "validatingadmissionpolicybindings", group="admissionregistration.k8s.io")
    assert not can(cluster, "delete", "validatingadmissionpolicies", group="admissionregistration.k8s.io")
    # What the policies pin: Jobs where sessions run, Secrets (the master key) in the release namespace.
    assert can(cluster, "create", "jobs", ns, "batch") and can(cluster, "create", "secrets", cluster.release_namespace)


def test_the_operator_creates_no_token_secret_nor_another_job(cluster: Cluster) -> None:
    """`create secrets` (here in the release namespace, for the master key) and `create jobs` are
    held; the chart's policies refuse the attacks they would allow."""
    operator = _as_operator(cluster)
    core, batch = kubernetes.client.CoreV1Api(operator), kubernetes.client.BatchV1Api(operator)
    ns = cluster.namespace
    try:
        token = {"metadata": {"name": "steal", "annotations": {"kubernetes.io/service-account.name": "default"}},
                 "type": "kubernetes.io/service-account-token"}
        _refused_by_policy(lambda: core.create_namespaced_secret(cluster.release_namespace, token), f"{cluster.fullname}-secrets.stepscope.io")
        settings = OperatorSettings(analysis_account=cluster.analysis_account)
        job = jobs.job(ns, "probe", uuid.uuid4().hex, settings, None, {})
        job["metadata"].pop("ownerReferences")
        batch.create_namespaced_job(ns, job, dry_run="All")  # the Job the operator builds passes
        pod = job["spec"]["template"]["spec"]
        pod.update(serviceAccountName="default", hostPID=True, volumes=[{"name": "root", "hostPath": {"path": "/"}}])
        pod["containers"][0]["securityContext"]["privileged"] = True
        pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
        _refused_by_policy(lambda: batch.create_namespaced_job(ns, job, dry_run="All"), f"{cluster.fullname}-analysis-jobs.stepscope.io")
    finally:
        operator.close()


def test_peering_is_granted_without_the_webhook(cluster: Cluster) -> None:
    """Two replicas (the default) with webhook.enabled=false elect the one that handles sessions."""
    for verb in ("get", "list", "watch", "patch"):
        assert can(cluster, verb, "kopfpeerings", cluster.namespace, "kopf.dev"), verb


@pytest.fixture
def own_webhook(cluster: Cluster, helm: str) -> Iterator[dict[str, Any]]:
    """The chart's webhook RBAC and a webhook configuration of this run's name, which selects no
    pod (an objectSelector label nobody sets) and calls nothing that exists."""
    config = f"{cluster.fullname}.stepscope.io"
    docs = render(helm, f"operator.namespaces={{{cluster.namespace}}}", f"fullnameOverride={cluster.fullname}",
                  f"webhook.configurationName={config}", namespace=cluster.release_namespace)
    admin = cluster.api_client
    rbac, admission = kubernetes.client.RbacAuthorizationV1Api(admin), kubernetes.client.AdmissionregistrationV1Api(admin)
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == f"{cluster.fullname}-webhook"]
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == f"{cluster.fullname}-webhook"]
    (mwc,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    mwc["webhooks"][0]["objectSelector"] = {"matchLabels": {"stepscope-e2e-never": cluster.fullname}}
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(binding)
    admission.create_mutating_webhook_configuration(mwc)
    try:
        yield admin.sanitize_for_serialization(admission.read_mutating_webhook_configuration(config))
    finally:
        for delete in (lambda: admission.delete_mutating_webhook_configuration(config), lambda: rbac.delete_cluster_role_binding(binding["metadata"]["name"]),
                       lambda: rbac.delete_cluster_role(role["metadata"]["name"])):
            try:
                delete()
            except kubernetes.client.ApiException:
                pass


def test_the_operator_changes_only_the_ca_bundle_of_its_webhook(cluster: Cluster, own_webhook: dict[str, Any]) -> None:
    name = own_webhook["metadata"]["name"]
    assert can(cluster, "patch", "mutatingwebhookconfigurations", group="admissionregistration.k8s.io", name=name)
    assert not can(cluster, "patch", "mutatingwebhookconfigurations", group="admissionregistration.k8s.io", name="another.example.com")
    assert not can(cluster, "create", "mutatingwebhookconfigurations", group="admissionregistration.k8s.io")
    operator = _as_operator(cluster)
    admission = kubernetes.client.AdmissionregistrationV1Api(operator)
    try:
        endpoint = Endpoint(config=name, tls_secret="unused", service=f"{cluster.fullname}-webhook", namespace=cluster.release_namespace,
                            url=None, addr="0.0.0.0", port=9443)
        ops = endpoint.client_config_ops(own_webhook, "Q0E=")  # the operator's own upkeep patch
        assert ops
        admission.patch_mutating_webhook_configuration(name, ops)
        policy = f"{cluster.fullname}-webhook-configuration.stepscope.io"
        _refused_by_policy(lambda: admission.patch_mutating_webhook_configuration(name, [{"op": "remove", "path": "/webhooks/0/namespaceSelector"}]), policy)
        _refused_by_policy(lambda: admission.patch_mutating_webhook_configuration(name, [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}]), policy)
    finally:
        operator.close()
    stored = kubernetes.client.AdmissionregistrationV1Api(cluster.api_client).read_mutating_webhook_configuration(name)
    assert stored.webhooks[0].client_config.ca_bundle and stored.webhooks[0].namespace_selector.match_expressions
