"""The Helm chart, rendered by a real helm (helm/install_helm.py puts one in .venv/bin; `make
install` runs it). Without helm these tests skip and say so; tests/operator/test_manifests.py
keeps the renderer-free checks of the templates."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from stepscope.testing.kube.fixtures import kube  # noqa: F401 (the kube fixture)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "stepscope"
RELEASE_NAMESPACE = "stepscope"


def helm_binary() -> str | None:
    local = Path(sys.executable).parent / "helm"
    return str(local) if local.exists() else shutil.which("helm")


@pytest.fixture(scope="session")
def helm() -> str:
    found = helm_binary()
    if found is None:
        pytest.skip("no helm binary: run `python helm/install_helm.py .venv/bin/helm` (make install does)")
    return found


def render(helm: str, *sets: str, namespace: str = RELEASE_NAMESPACE) -> list[dict[str, Any]]:
    """`helm template` of the chart with `--set` values; raises CalledProcessError with helm's error."""
    args = [helm, "template", "stepscope", str(CHART), "--namespace", namespace, "--kube-version", "1.33"]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


class Failed(Exception):
    """helm refused to render (a template's `fail` or `required`); the message is helm's."""


def render_templates(*templates: str, namespace: str = RELEASE_NAMESPACE, **overrides: Any) -> list[dict[str, Any]]:
    """The documents of the chart's `templates` (file names under templates/), rendered by the real
    helm with values.yaml plus `overrides` (nested dicts merge, as `-f` does), in the order asked.
    Skips the calling test when there is no helm."""
    found = helm_binary()
    if found is None:
        pytest.skip("no helm binary: run `python helm/install_helm.py .venv/bin/helm` (make install does)")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values:
        yaml.safe_dump(overrides, values)
        values.flush()
        done = subprocess.run(
            [
                found,
                "template",
                "stepscope",
                str(CHART),
                "--namespace",
                namespace,
                "--kube-version",
                "1.33",
                "-f",
                values.name,
            ],
            capture_output=True,
            text=True,
        )
    if done.returncode:
        raise Failed(done.stderr.strip())
    # --show-only would refuse a template that renders nothing (peering.yaml with one replica).
    by_template: dict[str, list[dict[str, Any]]] = {}
    for text in done.stdout.split("\n---\n"):
        source = re.search(r"^# Source: stepscope/templates/(\S+)$", text, re.M)
        doc = yaml.safe_load(text)
        if source and doc:
            by_template.setdefault(source.group(1), []).append(doc)
    return [doc for template in templates for doc in by_template.get(template, [])]


def apply_rbac(api_client: kubernetes.client.ApiClient, docs: list[dict[str, Any]]) -> None:
    """Create the rendered ServiceAccounts, (Cluster)Roles and bindings, and the
    ValidatingAdmissionPolicies and their bindings, in an API server (as an admin would)."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
    admission = kubernetes.client.AdmissionregistrationV1Api(api_client)
    for doc in docs:
        ns = doc["metadata"].get("namespace")
        if doc["kind"] == "ValidatingAdmissionPolicy":
            admission.create_validating_admission_policy(doc)
        elif doc["kind"] == "ValidatingAdmissionPolicyBinding":
            admission.create_validating_admission_policy_binding(doc)
        elif doc["kind"] == "ServiceAccount":
            kubernetes.client.CoreV1Api(api_client).create_namespaced_service_account(ns, doc)
        elif doc["kind"] == "ClusterRole":
            rbac.create_cluster_role(doc)
        elif doc["kind"] == "ClusterRoleBinding":
            rbac.create_cluster_role_binding(doc)
        elif doc["kind"] == "Role":
            rbac.create_namespaced_role(ns, doc)
        elif doc["kind"] == "RoleBinding":
            rbac.create_namespaced_role_binding(ns, doc)
