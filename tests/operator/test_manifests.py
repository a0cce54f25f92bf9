"""The YAML that ships: examples, the CRD, the Helm chart's values and the injected pod spec are
valid Kubernetes objects (kubernetes-validate's OpenAPI schemas; ProfileSessions through the test
API server, which applies the CRD's schema and CEL rules). The chart rendered by helm, its RBAC
and its package: tests/chart."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_validate
import yaml

from stepscope.operator.injection.injection import InjectionSettings, inject
from stepscope.operator.settings import OperatorSettings
from stepscope.testing.kube.fixtures import Kube

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "stepscope"
K8S_VERSION = "1.33"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _examples() -> list[dict[str, Any]]:
    return [d for p in sorted((REPO / "examples").glob("*.yaml")) for d in _documents(p)]


def test_builtin_example_objects_validate() -> None:
    builtin = [d for d in _examples() if d["apiVersion"] in ("v1", "batch/v1", "apps/v1")]
    assert {d["kind"] for d in builtin} >= {"Job", "Service", "Secret"}
    for doc in builtin:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_example_training_pods_opt_in_to_injection() -> None:
    templates = []
    for doc in _examples():
        if doc["kind"] == "PyTorchJob":
            templates += [r["template"] for r in doc["spec"]["pytorchReplicaSpecs"].values()]
        elif doc["kind"] == "Job":
            templates.append(doc["spec"]["template"])
    assert len(templates) == 3
    assert all(t["metadata"]["labels"]["stepscope.io/inject"] == "true" for t in templates)


def test_example_sessions_pass_the_crd(kube: Kube) -> None:
    kube.apply_crd()
    kube.create_namespace("training")
    api = kubernetes.client.CustomObjectsApi(kube.api_client)
    sessions = [d for d in _examples() if d["kind"] == "ProfileSession"]
    assert len(sessions) == 2
    for doc in sessions:
        stored = api.create_namespaced_custom_object("stepscope.io", "v1alpha1", doc["metadata"]["namespace"], "profilesessions", doc)
        assert stored["spec"]["capture"]["withStack"] is True  # schema defaults applied


def test_injected_pod_is_a_valid_pod() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"stepscope.io/inject": "true"}},
           "spec": {"containers": [{"name": "train", "image": "pytorch/pytorch"}]}}
    pod["spec"].update(inject(pod["spec"], InjectionSettings.from_operator(OperatorSettings())))
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_chart_templates_read_only_values_that_exist() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    optional = {"fullnameOverride"}  # read through `default`, absent on purpose
    for template in (CHART / "templates").iterdir():
        for path in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            if path in optional:
                continue
            node: Any = values
            for part in path.split("."):
                assert isinstance(node, dict) and part in node, f"{template.name} reads .Values.{path}, which values.yaml lacks"
                node = node[part]


def test_examples_create_a_secret_before_the_session_that_names_it() -> None:
    """`kubectl apply -f` creates in file order: a Secret after its session raced the operator."""
    for path in sorted((REPO / "examples").glob("*.yaml")):
        seen: set[str] = set()
        for doc in _documents(path):
            if doc["kind"] == "Secret":
                seen.add(doc["metadata"]["name"])
            named = (doc.get("spec") or {}).get("storage", {}).get("credentialsSecret") if doc["kind"] == "ProfileSession" else None
            defined_here = any(d["kind"] == "Secret" and d["metadata"]["name"] == named for d in _documents(path))
            assert not named or not defined_here or named in seen, f"{path.name}: Secret {named} comes after the session"
