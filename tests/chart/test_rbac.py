"""The chart's RBAC, from every template that holds any (rbac.yaml, rbac-webhook.yaml, ...),
rendered by helm: the grants its operator ServiceAccount ends up with open no path to more power
(docs/security.md, "What the RBAC test refuses"), and they are exactly docs/security.md's tables."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest

from tests.chart.conftest import RELEASE_NAMESPACE, REPO, apply_rbac, render
from tests.kube.helpers import refused

NAMESPACES = ("team-a", "team-b")
SETS = ("operator.namespaces={team-a,team-b}",)
SERVICE_ACCOUNT = f"system:serviceaccount:{RELEASE_NAMESPACE}:stepscope-operator"
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
CLUSTER_SCOPED = {"namespaces", "nodes", "customresourcedefinitions", "mutatingwebhookconfigurations",
                  "validatingwebhookconfigurations", "clusterroles", "clusterrolebindings", "persistentvolumes"}
DANGEROUS_VERBS = {"escalate", "bind", "impersonate", "*"}
DANGEROUS_RESOURCES = {"serviceaccounts/token", "pods/exec", "pods/attach", "pods/portforward", "nodes/proxy", "*"}
WEBHOOK_CONFIGS = {"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}


@dataclass(frozen=True)
class Grant:
    verb: str
    group: str
    plural: str  # plural[/subresource]
    names: tuple[str, ...]
    scope: str  # "cluster" or a namespace

    @property
    def resource(self) -> str:
        """As docs/security.md writes it: group/plural, the core group's bare."""
        return f"{self.group}/{self.plural}" if self.group else self.plural


def grants(docs: list[dict[str, Any]], account: str = SERVICE_ACCOUNT) -> set[Grant]:
    """What the bindings give `account`: each rule of the bound (Cluster)Role, at the binding's scope."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    found = set()
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        subjects = {f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
        if account not in subjects:
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        scope = namespace if binding["kind"] == "RoleBinding" else "cluster"
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        found.add(Grant(verb, group, resource, tuple(rule.get("resourceNames") or ()), scope))
    return found


def escalations(found: set[Grant], namespaces: tuple[str, ...] = NAMESPACES) -> list[str]:
    """Every grant that opens a way to more power than the table means to give."""
    problems = []
    for g in sorted(found, key=lambda g: (g.scope, g.resource, g.verb)):
        plural, base = g.plural, g.plural.split("/")[0]
        where = f"{g.verb} {g.resource} ({g.scope})"
        if g.verb in DANGEROUS_VERBS or plural in DANGEROUS_RESOURCES or "*" in g.resource:
            problems.append(f"{where}: wildcard or escalation verb/subresource")
        if g.scope == "cluster" and base not in CLUSTER_SCOPED:
            problems.append(f"{where}: cluster-wide grant on a namespaced resource")
        if g.scope in SYSTEM_NAMESPACES:
            problems.append(f"{where}: grant in a system namespace")
        elif g.scope != "cluster" and g.scope not in namespaces and g.scope != RELEASE_NAMESPACE:
            problems.append(f"{where}: grant outside operator.namespaces")
        if base == "secrets" and g.scope == "cluster":
            problems.append(f"{where}: Secrets cluster-wide (create a token Secret in kube-system, read it back)")
        if base == "secrets" and g.verb in ("list", "watch") and not g.names:
            problems.append(f"{where}: listing Secrets returns all their data")
        if base in WEBHOOK_CONFIGS and (g.verb == "create" or not g.names):
            problems.append(f"{where}: a webhook configuration of one's own sees and mutates every pod")
    return problems


def documented() -> set[tuple[str, str, str, str]]:
    """(verb, resource, names, scope) of every row of docs/security.md's tables."""
    rows = set()
    for line in (REPO / "docs" / "security.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("Verbs", "---") or not line.startswith("|"):
            continue
        verbs, resource, names, scope, _why = cells
        for verb in verbs.split(","):
            rows.add((verb.strip(), resource, "" if names == "–" else names, scope))
    return rows


def as_rows(found: set[Grant], namespaces: tuple[str, ...] = NAMESPACES) -> set[tuple[str, str, str, str]]:
    """Grants in the table's words: one row for a grant that every operator.namespaces has."""
    rows = set()
    for g in found:
        scope = {"cluster": "cluster", RELEASE_NAMESPACE: "release namespace"}.get(g.scope) or ("each operator.namespaces" if g.scope in namespaces else g.scope)
        if scope == "each operator.namespaces" and not all(Grant(g.verb, g.group, g.plural, g.names, ns) in found for ns in namespaces):
            scope = g.scope
        rows.add((g.verb, g.resource, ", ".join(g.names), scope))
    return rows


@pytest.fixture(scope="module")
def rendered(helm: str) -> list[dict[str, Any]]:
    return render(helm, *SETS)


def test_no_grant_opens_an_escalation_path(rendered):
    found = grants(rendered)
    assert found, "no RBAC for the operator's ServiceAccount was rendered"
    assert escalations(found) == []


def test_the_grants_are_the_tables_of_docs_security(rendered):
    assert as_rows(grants(rendered)) == documented()


def test_owner_references_may_block_deletion(rendered):
    found = grants(rendered)
    assert all(Grant("update", "stepscope.io", "profilesessions/finalizers", (), ns) in found for ns in NAMESPACES)


def test_the_check_finds_what_the_first_chart_granted():
    """The rules of the chart as issue 9 found it, bound cluster-wide."""
    first = {Grant(v, g, r, (), "cluster") for g, r, vs in (
        ("", "secrets", ("get", "create")), ("batch", "jobs", ("get", "create")), ("rbac.authorization.k8s.io", "roles", ("create",)),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", ("get", "create", "patch"))) for v in vs}
    problems = "\n".join(escalations(first))
    assert "create secrets (cluster): Secrets cluster-wide" in problems
    assert "create batch/jobs (cluster): cluster-wide grant on a namespaced resource" in problems
    assert "create rbac.authorization.k8s.io/roles (cluster): cluster-wide grant on a namespaced resource" in problems
    assert "patch admissionregistration.k8s.io/mutatingwebhookconfigurations (cluster): a webhook configuration of one's own" in problems


@pytest.mark.parametrize("namespaces, refusal", [
    ("operator.namespaces=null", "operator.namespaces is empty"),
    ("operator.namespaces={default,kube-system}", "operator.namespaces lists kube-system"),
])
def test_helm_refuses_a_cluster_wide_or_system_install(helm, namespaces, refusal):
    with pytest.raises(subprocess.CalledProcessError) as e:
        render(helm, namespaces)
    assert refusal in e.value.stderr


def test_the_api_server_enforces_the_rendered_rbac(kube, rendered):
    """The rendered RBAC in the test API server: the operator reads a named Secret in its
    namespaces, and cannot reach the issue's escalation path (a token Secret in kube-system)."""
    core = kubernetes.client.CoreV1Api(kube.api_client)
    for ns in (RELEASE_NAMESPACE, *NAMESPACES):
        kube.create_namespace(ns)
    apply_rbac(kube.api_client, rendered)
    for ns in ("team-a", "kube-system"):
        core.create_namespaced_secret(ns, {"metadata": {"name": "store"}, "stringData": {"accessKeyId": "a"}})
    operator = kubernetes.client.CoreV1Api(kube.service_account_client(RELEASE_NAMESPACE, "stepscope-operator"))
    assert operator.read_namespaced_secret("store", "team-a").data["accessKeyId"]
    token_secret = {"metadata": {"name": "steal", "annotations": {"kubernetes.io/service-account.name": "clusterrole-aggregation-controller"}},
                    "type": "kubernetes.io/service-account-token"}
    for call in (lambda: operator.create_namespaced_secret("kube-system", token_secret),
                 lambda: operator.read_namespaced_secret("store", "kube-system"),
                 lambda: operator.list_namespaced_secret("team-a"),
                 lambda: kubernetes.client.BatchV1Api(operator.api_client).create_namespaced_job("kube-system", {"metadata": {"name": "j"}})):
        assert refused(call, 403)["reason"] == "Forbidden"
