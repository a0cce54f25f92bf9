"""The real operator (kopf, watching one namespace as the chart runs it) under exactly the RBAC the
Helm chart renders, as its ServiceAccount in the test API server: enough for a whole session up to
its analysis Job (which passes the chart's admission policy on the way), and a refused pod list
fails the session saying so."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from stepscope.operator import kube as operator_kube
from stepscope.operator import registry
from stepscope.sidecar.daemon import Sidecar
from stepscope.testing.kube.fixtures import Kube
from tests.chart.conftest import RELEASE_NAMESPACE, apply_rbac, helm, render  # noqa: F401 (helm is a fixture)
from tests.operator.harness import NAMESPACE, OperatorHarness, Pods, port_of, session_spec


def _without_pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):  # the injection's ClusterRole, bound per namespace, lists pods too
            doc["rules"] = [r for r in doc["rules"] if "pods" not in r["resources"]]
    return docs


@pytest.fixture
def chart_operator(cluster: Kube, helm: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[[list[dict[str, Any]]], list[dict[str, Any]]]], OperatorHarness]]:
    runners: list[KopfRunner] = []

    def start(edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] = lambda docs: docs) -> OperatorHarness:
        cluster.create_namespace(RELEASE_NAMESPACE)
        apply_rbac(cluster.api_client, edit(render(helm, f"operator.namespaces={{{NAMESPACE}}}")))
        kubeconfig = str(cluster.service_account_kubeconfig(RELEASE_NAMESPACE, "stepscope-operator"))
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        operator_kube.reset()
        runner = KopfRunner(["run", "--standalone", f"--namespace={NAMESPACE}"], registry=registry.build(), timeout=60)
        runner.__enter__()
        runners.append(runner)
        return OperatorHarness(cluster)  # its own calls stay the admin's: it only creates and reads

    yield start
    for runner in runners:
        runner.__exit__(None, None, None)
    operator_kube.reset()


def test_a_session_runs_under_the_charts_rbac(chart_operator, pods: Pods, sidecar_a: Sidecar, s3_endpoint: str) -> None:
    operator = chart_operator()
    pods.create("train-a", {"job": "train"}, port=port_of(sidecar_a))
    operator.create_session("under-rbac", session_spec({"job": "train"}, s3_endpoint))
    status = operator.wait_phase("under-rbac", ("Analyzing", "Succeeded", "Failed"), timeout=60)
    assert status["phase"] == "Analyzing", status
    assert status["analysisJob"]


def test_a_refused_pod_list_fails_the_session(chart_operator, pods: Pods, s3_endpoint: str) -> None:
    operator = chart_operator(_without_pods)
    operator.create_session("no-pod-list", session_spec({"job": "train"}, s3_endpoint))
    status = operator.wait_phase("no-pod-list", ("Failed",), timeout=20)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "PodsUnlistable"
    assert "HTTP 403" in status["message"] and 'cannot list resource "pods"' in status["message"]
    assert "operator.namespaces" in status["message"]
