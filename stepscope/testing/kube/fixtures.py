"""pytest fixtures for the test API server. Use them from any test folder with

    from stepscope.testing.kube.fixtures import kube  # noqa: F401  (in that folder's conftest.py)
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kubernetes
import pytest
import yaml

from .server import KubeTestServer

REPO = Path(__file__).resolve().parents[3]
CRD_PATH = REPO / "crds" / "profilesession.yaml"


@dataclass
class Kube:
    url: str
    kubeconfig: Path
    api_client: kubernetes.client.ApiClient
    server: KubeTestServer
    workdir: Path

    def apply_crd(self, path: Path = CRD_PATH) -> dict:
        """Create the CustomResourceDefinition in `path` (the ProfileSession CRD by default)."""
        body = yaml.safe_load(path.read_text())
        return kubernetes.client.ApiextensionsV1Api(self.api_client).create_custom_resource_definition(body).to_dict()

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig that acts as the ServiceAccount: every request is checked against the
        stored Roles/ClusterRoles and bindings (the admin kubeconfig bypasses RBAC)."""
        token = self.server.service_account_token(namespace, name)
        return self.server.write_kubeconfig(self.workdir / f"kubeconfig-{namespace}-{name}", namespace, token)

    def service_account_client(self, namespace: str, name: str) -> kubernetes.client.ApiClient:
        return kubernetes.config.new_client_from_config(config_file=str(self.service_account_kubeconfig(namespace, name)))

    def create_namespace(self, name: str) -> None:
        kubernetes.client.CoreV1Api(self.api_client).create_namespace({"metadata": {"name": name}})


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kube]:
    """A fresh API server for the test; KUBECONFIG points at it (kopf and
    `kubernetes.config.load_kube_config()` find it there)."""
    with KubeTestServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        # kubernetes.config reads KUBECONFIG once, at import; kopf's login_via_client relies on it.
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        try:
            yield Kube(server.url, kubeconfig, api_client, server, tmp_path)
        finally:
            api_client.close()
