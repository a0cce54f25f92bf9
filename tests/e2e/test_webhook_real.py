"""The injection webhook registered with a real API server, when STEPSCOPE_E2E_KUBECONFIG is set.

The chart's own webhook configuration and RBAC are rendered under a unique name (so an installed
chart is left alone) and applied; the operator runs here, as the chart's ServiceAccount (a token
from the TokenRequest API), and listens on STEPSCOPE_E2E_WEBHOOK_URL (default
https://127.0.0.1:<free port>, right when the API server runs on this machine; otherwise an https
URL of this machine that the API server reaches). Pods are created with dryRun=All, so no kubelet
is needed: the API server calls the webhook (sideEffects None allows it) and its own Pod Security
admission, and answers the pod it would store. Everything created is deleted at the end."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes
import pytest
import yaml
from kopf.testing import KopfRunner

from stepscope.local.launch import free_port
from stepscope.operator import kube as operator_kube
from stepscope.operator import registry
from stepscope.operator.injection.injection import SIDECAR_NAME
from stepscope.testing.polling import wait_for
from tests.chart.conftest import render_templates as render
from tests.e2e.conftest import ensure_default_service_account

TEMPLATES = ("serviceaccount.yaml", "rbac.yaml", "rbac-webhook.yaml", "webhook.yaml")
RESTRICTED = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 1000,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _sa_kubeconfig(admin_kubeconfig: str, token: str, path: Path) -> Path:
    config = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "sa",
                                    "clusters": [cluster], "users": [{"name": "sa", "user": {"token": token}}],
                                    "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa"}}]}))
    return path


@pytest.fixture
def real_chart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    kubeconfig = os.environ.get("STEPSCOPE_E2E_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("STEPSCOPE_E2E_KUBECONFIG is not set: this test needs a real API server")
    run = uuid.uuid4().hex[:6]
    name, training, release = f"stepscope-e2e-{run}", f"stepscope-e2e-train-{run}", f"stepscope-e2e-sys-{run}"
    config = f"{name}.stepscope.io"
    url = os.environ.get("STEPSCOPE_E2E_WEBHOOK_URL") or f"https://127.0.0.1:{free_port()}"
    admin = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    core = kubernetes.client.CoreV1Api(admin)
    docs = render(*TEMPLATES, namespace=release, fullnameOverride=name, operator={"namespaces": [training], "replicas": 1},
                  webhook={"configurationName": config})
    created: list[dict[str, Any]] = []
    try:
        core.create_namespace({"metadata": {"name": release}})
        core.create_namespace({"metadata": {"name": training, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
        ensure_default_service_account(core, training)
        for doc in docs:
            kubernetes.utils.create_from_dict(admin, doc)
            created.append(doc)
        token = core.create_namespaced_service_account_token(f"{name}-operator", release, {"spec": {"expirationSeconds": 3600}}).status.token
        parts = urlsplit(url)
        env = {"KUBECONFIG": str(_sa_kubeconfig(kubeconfig, token, tmp_path / "operator-kubeconfig")), "POD_NAMESPACE": release,
               "STEPSCOPE_NAMESPACES": training, "STEPSCOPE_WEBHOOK_URL": url, "STEPSCOPE_WEBHOOK_ADDR": parts.hostname or "0.0.0.0",
               "STEPSCOPE_WEBHOOK_PORT": str(parts.port or 443), "STEPSCOPE_WEBHOOK_CONFIG": config,
               "STEPSCOPE_WEBHOOK_TLS_SECRET": f"{name}-webhook-tls", "STEPSCOPE_HMAC_KEY": uuid.uuid4().hex,
               "STEPSCOPE_INJECTION_RESYNC_S": "1"}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        operator_kube.reset()
        yield {"admin": admin, "core": core, "config": config, "training": training}
    finally:
        admission = kubernetes.client.AdmissionregistrationV1Api(admin)
        rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
        for doc in created:
            kind, meta = doc["kind"], doc["metadata"]
            name = meta["name"]
            delete = {"MutatingWebhookConfiguration": lambda name=name: admission.delete_mutating_webhook_configuration(name),
                      "ClusterRole": lambda name=name: rbac.delete_cluster_role(name),
                      "ClusterRoleBinding": lambda name=name: rbac.delete_cluster_role_binding(name)}.get(kind)
            if delete:
                try:
                    delete()
                except kubernetes.client.ApiException:
                    pass
        for ns in (training, release):
            try:
                core.delete_namespace(ns)
            except kubernetes.client.ApiException:
                pass
        admin.close()


def _dry_run_pod(core: kubernetes.client.CoreV1Api, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    body = {"metadata": {"name": "trainer-0", "labels": labels},
            "spec": {"containers": [{"name": "pytorch", "image": "pytorch/pytorch", "securityContext": RESTRICTED}]}}
    return core.api_client.sanitize_for_serialization(core.create_namespaced_pod(namespace, body, dry_run="All"))


def _reapply_keeps_the_injected_pythonpath(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """A bare pod that declares PYTHONPATH, created for real (no kubelet: it stays Pending), then the
    three-way patch `kubectl apply` of the same manifest sends: the API server calls the webhook on
    UPDATE, which puts the injected value back, so pod update validation lets it through."""
    container = {"name": "pytorch", "image": "pytorch/pytorch", "securityContext": RESTRICTED, "env": [{"name": "PYTHONPATH", "value": "/app"}]}
    body = {"metadata": {"name": "trainer-reapply", "labels": {"stepscope.io/inject": "true"}}, "spec": {"containers": [container]}}
    created = core.api_client.sanitize_for_serialization(core.create_namespaced_pod(namespace, body))
    try:
        assert created["metadata"]["annotations"]["stepscope.io/injected"] == "true"
        reapply = {"spec": {"$setElementOrder/containers": [{"name": "pytorch"}], "containers": [
            {"$setElementOrder/env": [{"name": "PYTHONPATH"}], "env": container["env"], "name": "pytorch"}]}}
        patched = core.api_client.sanitize_for_serialization(core.patch_namespaced_pod(
            "trainer-reapply", namespace, reapply, _content_type="application/strategic-merge-patch+json"))
        assert patched["spec"]["containers"] == created["spec"]["containers"]
    finally:
        core.delete_namespaced_pod("trainer-reapply", namespace, grace_period_seconds=0)


def test_the_webhook_injects_through_a_real_api_server_under_the_chart_rbac(real_chart: dict[str, Any]) -> None:
    core, training = real_chart["core"], real_chart["training"]
    admission = kubernetes.client.AdmissionregistrationV1Api(real_chart["admin"])

    def hooks() -> list[dict[str, Any]]:
        return real_chart["admin"].sanitize_for_serialization(admission.read_mutating_webhook_configuration(real_chart["config"]))["webhooks"]

    with KopfRunner(["run", "--standalone", f"--namespace={training}"], registry=registry.build(with_webhook=True), timeout=60):
        wait_for(lambda: hooks()[0]["clientConfig"].get("caBundle"), 60, "the operator to put its CA into the webhook configuration")
        wait_for(lambda: core.list_namespaced_secret(training, field_selector="metadata.name=stepscope-hmac").items, 60, "the namespace's key Secret")

        def injected() -> dict[str, Any] | None:
            pod = _dry_run_pod(core, training, {"stepscope.io/inject": "true"})
            return pod if (pod["metadata"].get("annotations") or {}).get("stepscope.io/injected") else None
        pod = wait_for(injected, 60, "a labelled pod to be injected (restricted Pod Security enforced by the API server)")
        (sidecar,) = [c for c in pod["spec"]["initContainers"] if c["name"] == SIDECAR_NAME]
        assert sidecar["restartPolicy"] == "Always" and sidecar["securityContext"]["runAsNonRoot"] is True
        assert "annotations" not in _dry_run_pod(core, training, {"app": "web"})["metadata"]
        _reapply_keeps_the_injected_pythonpath(core, training)
        during = hooks()
    assert hooks() == during, "stopping the operator leaves the webhook configuration as it was"
