"""The operator's master HMAC key under `helm template` (Argo CD, Flux): the chart never renders
it, so no sync can replace it; the operator creates it once, under the chart's RBAC, and never
overwrites it (stepscope/operator/master_key.py)."""
from __future__ import annotations

import base64

import kubernetes
import pytest

from stepscope.cli import main
from stepscope.operator import kube as operator_kube
from stepscope.operator import master_key
from stepscope.signing import KeyLoadError
from stepscope.testing.kube.helpers import refused
from tests.chart.conftest import CHART, RELEASE_NAMESPACE, apply_rbac, render


def test_two_renders_are_the_same_and_hold_no_key(helm: str) -> None:
    first, second = render(helm), render(helm)
    assert first == second
    assert not [d for d in first if d["kind"] == "Secret"]
    assert not [t.name for t in (CHART / "templates").iterdir() if "lookup" in t.read_text()]


@pytest.fixture
def admin(kube, helm, monkeypatch: pytest.MonkeyPatch) -> kubernetes.client.CoreV1Api:
    """The chart's RBAC applied, the operator's own client (stepscope.operator.kube) as the chart's
    ServiceAccount; the admin's client for the test's own calls."""
    kube.create_namespace(RELEASE_NAMESPACE)
    apply_rbac(kube.api_client, render(helm))
    monkeypatch.setenv("KUBECONFIG", str(kube.service_account_kubeconfig(RELEASE_NAMESPACE, "stepscope-operator")))
    operator_kube.reset()
    yield kubernetes.client.CoreV1Api(kube.api_client)
    operator_kube.reset()


def test_the_operator_creates_the_key_once_and_keeps_it(admin) -> None:
    key = master_key.ensure(RELEASE_NAMESPACE, "stepscope-hmac", "key")
    assert len(key) >= 32
    assert master_key.ensure(RELEASE_NAMESPACE, "stepscope-hmac", "key") == key  # a restart, a second replica
    stored = admin.read_namespaced_secret("stepscope-hmac", RELEASE_NAMESPACE)
    assert base64.b64decode(stored.data["key"]) == key and stored.type == "Opaque"


def test_a_key_the_user_created_is_the_one_used(admin) -> None:
    admin.create_namespaced_secret(RELEASE_NAMESPACE, {"metadata": {"name": "stepscope-hmac"}, "stringData": {"key": "my-own-key"}})
    assert master_key.ensure(RELEASE_NAMESPACE, "stepscope-hmac", "key") == b"my-own-key"
    assert base64.b64decode(admin.read_namespaced_secret("stepscope-hmac", RELEASE_NAMESPACE).data["key"]) == b"my-own-key"


def test_a_secret_without_the_key_is_a_clear_error_not_overwritten(admin) -> None:
    admin.create_namespaced_secret(RELEASE_NAMESPACE, {"metadata": {"name": "stepscope-hmac"}, "stringData": {"other": "x"}})
    with pytest.raises(KeyLoadError, match="has no data key 'key'"):
        master_key.ensure(RELEASE_NAMESPACE, "stepscope-hmac", "key")


def test_the_operator_reads_no_other_secret_of_its_namespace(kube, admin) -> None:
    admin.create_namespaced_secret(RELEASE_NAMESPACE, {"metadata": {"name": "other"}, "stringData": {"key": "x"}})
    with pytest.raises(KeyLoadError, match="cannot read or create the key Secret stepscope/other: the API server answered 403"):
        master_key.ensure(RELEASE_NAMESPACE, "other", "key")
    operator = kubernetes.client.CoreV1Api(kube.service_account_client(RELEASE_NAMESPACE, "stepscope-operator"))
    assert refused(lambda: operator.list_namespaced_secret(RELEASE_NAMESPACE), 403)


def test_the_operator_command_takes_its_key_from_the_secret_or_says_why_not(kube, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`stepscope operator` as the chart runs it (STEPSCOPE_HMAC_SECRET, no key in its env): an
    identity that may not read the Secret stops it at once with one line, before kopf starts."""
    for name in ("STEPSCOPE_HMAC_KEY", "STEPSCOPE_HMAC_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STEPSCOPE_HMAC_SECRET", "stepscope-hmac")
    monkeypatch.setenv("POD_NAMESPACE", RELEASE_NAMESPACE)
    kube.create_namespace(RELEASE_NAMESPACE)
    monkeypatch.setenv("KUBECONFIG", str(kube.service_account_kubeconfig(RELEASE_NAMESPACE, "no-rights")))
    operator_kube.reset()
    try:
        assert main(["operator", "--metrics-port", "0"]) == 2
    finally:
        operator_kube.reset()
    assert capsys.readouterr().err.strip() == ("stepscope operator: cannot read or create the key Secret stepscope/stepscope-hmac: "
                                               "the API server answered 403 Forbidden")
