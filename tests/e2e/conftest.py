"""A real Kubernetes API server for end-to-end tests, only when STEPSCOPE_E2E_KUBECONFIG is set
(a cluster-admin kubeconfig). Nothing else is needed: no kubelet, no image, no bucket.

What the suite sets up there, for one run (names carry a random run id) and removes afterwards
(the CRD stays):
- the ProfileSession CRD from crds/ (created, or replaced when one exists: the API server checks it);
- two namespaces: the release namespace and one opted-in namespace for sessions;
- the Helm chart's ServiceAccounts, RBAC and ValidatingAdmissionPolicies, rendered by helm (`make
  install` installs it) with operator.namespaces = the session namespace;
- the real operator (kopf) in this process, authenticated as that ServiceAccount with a token from
  the TokenRequest API, so every call it makes is authorized by the real RBAC;
- training pods as objects the test marks Running with podIP 127.0.0.1 (no kubelet runs them),
  whose `stepscope` port is a real sidecar in this process in front of a real 2-rank gloo training
  (tests/operator's fixtures); storage is moto's S3 server over HTTP on this machine, reached with
  the credentials of a Secret in the session namespace (a cluster session has no other).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kopf.testing import KopfRunner

from stepscope.operator import kube as operator_kube
from stepscope.operator import registry
from stepscope.operator.namespace_keys import namespace_key
from stepscope.sidecar.daemon import Sidecar
from stepscope.testing.kube.fixtures import CRD_PATH
from tests.chart.conftest import apply_rbac, helm, render  # noqa: F401 (helm is a fixture)
from tests.operator.conftest import CREDENTIALS, s3_endpoint, training  # noqa: F401 (fixtures)
from tests.operator.harness import BUCKET, OPERATOR_KEY

ENV = "STEPSCOPE_E2E_KUBECONFIG"
STORE_SECRET = "e2e-store"


@dataclass
class Cluster:
    api_client: kubernetes.client.ApiClient
    kubeconfig: Path
    namespace: str  # where sessions and training pods live (operator.namespaces)
    release_namespace: str
    fullname: str
    s3_endpoint: str  # moto's S3 server on this machine; the sessions' Secret is STORE_SECRET
    workdir: Path

    @property
    def analysis_account(self) -> str:
        """The chart's analysis ServiceAccount (one in each namespace of operator.namespaces)."""
        return f"{self.fullname}-analysis"

    @property
    def operator_user(self) -> str:
        return f"system:serviceaccount:{self.release_namespace}:{self.fullname}-operator"

    def token_kubeconfig(self, namespace: str, account: str) -> Path:
        """A kubeconfig for the ServiceAccount (TokenRequest API), same server and CA as the admin's."""
        core = kubernetes.client.CoreV1Api(self.api_client)
        token = core.create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 3600}}
        ).status.token
        config = yaml.safe_load(self.kubeconfig.read_text())
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = dict(next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"]))
        if cluster.get("certificate-authority"):  # relative to the kubeconfig it was written in
            cluster["certificate-authority"] = str(
                (self.kubeconfig.parent / cluster["certificate-authority"]).resolve()
            )
        path = self.workdir / f"kubeconfig-{namespace}-{account}"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "sa",
                    "clusters": [{"name": "c", "cluster": cluster}],
                    "users": [{"name": "sa", "user": {"token": token}}],
                    "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": namespace}}],
                }
            )
        )
        return path


def ensure_default_service_account(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """The `default` ServiceAccount that kube-controller-manager creates in every namespace: without
    it, the ServiceAccount admission plugin refuses every pod ("error looking up service account
    <ns>/default"), so a control plane without the controller manager needs it made here."""
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise


def _install_crd(api_client: kubernetes.client.ApiClient) -> None:
    api = kubernetes.client.ApiextensionsV1Api(api_client)
    body = yaml.safe_load(CRD_PATH.read_text())
    try:
        existing = api.read_custom_resource_definition(body["metadata"]["name"])
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise
        api.create_custom_resource_definition(body)
    else:
        body["metadata"]["resourceVersion"] = existing.metadata.resource_version
        api.replace_custom_resource_definition(body["metadata"]["name"], body)
    wait = kubernetes.watch.Watch()
    for event in wait.stream(
        api.list_custom_resource_definition,
        field_selector=f"metadata.name={body['metadata']['name']}",
        timeout_seconds=30,
    ):
        conditions = event["object"].status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            wait.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, helm: str, s3_endpoint: str) -> Iterator[Cluster]:
    kubeconfig = os.environ.get(ENV)
    if not kubeconfig:
        pytest.skip(f"{ENV} is not set: the end-to-end tests need a real Kubernetes API server (tests/e2e/README.md)")
    run_id = uuid.uuid4().hex[:6]
    api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    core = kubernetes.client.CoreV1Api(api_client)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
    namespace, release = f"stepscope-e2e-{run_id}", f"stepscope-e2e-sys-{run_id}"
    fullname = f"stepscope-e2e-{run_id}"
    workdir = tmp_path_factory.mktemp("e2e")
    _install_crd(api_client)
    for ns in (namespace, release):
        core.create_namespace({"metadata": {"name": ns, "labels": {"stepscope-e2e": run_id}}})
        ensure_default_service_account(core, ns)
    core.create_namespaced_secret(namespace, {"metadata": {"name": STORE_SECRET}, "stringData": dict(CREDENTIALS)})
    docs = render(
        helm,
        f"operator.namespaces={{{namespace}}}",
        f"fullnameOverride={fullname}",
        "webhook.enabled=false",
        namespace=release,
    )
    identity = [
        d
        for d in docs
        if d["kind"]
        in (
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        )
    ]
    admission = kubernetes.client.AdmissionregistrationV1Api(api_client)
    try:
        apply_rbac(api_client, identity)
        yield Cluster(api_client, Path(kubeconfig), namespace, release, fullname, s3_endpoint, workdir)
    finally:
        for doc in identity:
            name = doc["metadata"]["name"]
            try:
                if doc["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(name)
                elif doc["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(name)
                elif doc["kind"] == "ValidatingAdmissionPolicy":
                    admission.delete_validating_admission_policy(name)
                elif doc["kind"] == "ValidatingAdmissionPolicyBinding":
                    admission.delete_validating_admission_policy_binding(name)
            except kubernetes.client.ApiException:
                pass
        for ns in (namespace, release):
            core.delete_namespace(ns)
        api_client.close()


@pytest.fixture(scope="session")
def operator(cluster: Cluster) -> Iterator[None]:
    """The operator as the chart runs it (kopf, standalone, one namespace), as its ServiceAccount,
    its analysis Jobs as the chart's analysis ServiceAccount (the admission policy refuses others)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(
            "KUBECONFIG", str(cluster.token_kubeconfig(cluster.release_namespace, f"{cluster.fullname}-operator"))
        )
        for name, value in (
            ("STEPSCOPE_HMAC_KEY", OPERATOR_KEY.decode()),
            ("STEPSCOPE_SELECTION_GRACE_S", "3"),
            ("STEPSCOPE_POLL_INTERVAL_S", "0.5"),
            ("STEPSCOPE_TRIGGER_ATTEMPTS", "2"),
            ("STEPSCOPE_SIDECAR_TIMEOUT_S", "3"),
            ("STEPSCOPE_ANALYSIS_SERVICE_ACCOUNT", cluster.analysis_account),
        ):
            env.setenv(name, value)
        operator_kube.reset()
        with KopfRunner(
            ["run", "--standalone", f"--namespace={cluster.namespace}"], registry=registry.build(), timeout=120
        ) as runner:
            yield
        operator_kube.reset()
    assert runner.exit_code == 0, runner.output


def _sidecar(cluster: Cluster, folder: Path, pod: str) -> Sidecar:
    """A sidecar as the webhook injects it: with the key of the sessions' namespace (the operator signs with it)."""
    return Sidecar(
        folder,
        namespace_key(OPERATOR_KEY, cluster.namespace),
        host="127.0.0.1",
        port=0,
        pod=pod,
        poll_interval_s=0.2,
        upload_attempts=2,
        upload_base_delay_s=0.2,
    ).start()


@pytest.fixture(scope="module")
def sidecar_a(cluster: Cluster, training: Path) -> Iterator[Sidecar]:
    sidecar = _sidecar(cluster, training, "train-a")
    yield sidecar
    sidecar.shutdown(grace_s=2)


@pytest.fixture
def idle(cluster: Cluster, tmp_path: Path) -> Iterator[Sidecar]:
    """A sidecar with no training behind it: it waits for ranks until its session ends."""
    sidecar = _sidecar(cluster, tmp_path / "idle", "idle")
    yield sidecar
    sidecar.shutdown(grace_s=1)


def running_pod(cluster: Cluster, name: str, labels: dict[str, str], port: int) -> None:
    """A training pod as a kubelet would report it: Running, podIP 127.0.0.1, its sidecar's port."""
    core = kubernetes.client.CoreV1Api(cluster.api_client)
    core.create_namespaced_pod(
        cluster.namespace,
        {
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "initContainers": [
                    {
                        "name": "stepscope-sidecar",
                        "image": "stepscope",
                        "restartPolicy": "Always",
                        "ports": [{"name": "stepscope", "containerPort": port}],
                    }
                ],
                "containers": [{"name": "train", "image": "pytorch"}],
            },
        },
    )
    core.patch_namespaced_pod_status(
        name, cluster.namespace, {"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    )


def session_body(cluster: Cluster, name: str, selector: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stepscope.io/v1alpha1",
        "kind": "ProfileSession",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": selector},
            "capture": {"waitSteps": 3, "steps": 2, "activities": ["CPU"]},
            "hardwareMetrics": {"enabled": False},
            "timeoutSeconds": 120,
            "storage": {
                "uri": f"s3://{BUCKET}/e2e",
                "endpoint": cluster.s3_endpoint,
                "region": "us-east-1",
                "credentialsSecret": STORE_SECRET,
            },
            "hangTimeoutSeconds": 60,
            **spec,
        },
    }
