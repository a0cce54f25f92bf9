"""The chart's RBAC, from every template that holds any (rbac.yaml, rbac-webhook.yaml, ...),
rendered by helm: the grants its operator ServiceAccount ends up with open no path to more power
(docs/security.md, "What the RBAC test refuses"), and they are exactly docs/security.md's tables."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest

from stepscope.operator.sessions import jobs
from stepscope.operator.settings import OperatorSettings
from stepscope.testing.kube.helpers import refused
from tests.chart.conftest import RELEASE_NAMESPACE, REPO, apply_rbac, render

NAMESPACES = ("team-a", "team-b")
SETS = ("operator.namespaces={team-a,team-b}",)
SERVICE_ACCOUNT = f"system:serviceaccount:{RELEASE_NAMESPACE}:stepscope-operator"
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
CLUSTER_SCOPED = {"namespaces", "nodes", "customresourcedefinitions", "mutatingwebhookconfigurations",
                  "validatingwebhookconfigurations", "clusterroles", "clusterrolebindings", "persistentvolumes"}
DANGEROUS_VERBS = {"escalate", "bind", "impersonate", "*"}
DANGEROUS_RESOURCES = {"serviceaccounts/token", "pods/exec", "pods/attach", "pods/portforward", "nodes/proxy", "*"}
WEBHOOK_CONFIGS = {"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}
# Making or binding an identity: a Role bound to system:authenticated, a ServiceAccount to run as.
IDENTITIES = {"serviceaccounts", "roles", "rolebindings", "clusterroles", "clusterrolebindings"}
# What would lift the admission policies that pin the operator's writes.
POLICIES = {"validatingadmissionpolicies", "validatingadmissionpolicybindings", "mutatingadmissionpolicies",
            "mutatingadmissionpolicybindings"}
# Whoever creates these runs a pod as any ServiceAccount of the namespace, privileged, on the node's filesystem.
WORKLOADS = {"pods", "jobs", "cronjobs", "deployments", "replicasets", "statefulsets", "daemonsets", "replicationcontrollers"}
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
OPERATIONS = {"CREATE": ("create",), "UPDATE": ("update", "patch"), "DELETE": ("delete", "deletecollection")}


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


def pinned(docs: list[dict[str, Any]], account: str = SERVICE_ACCOUNT) -> set[tuple[str, str]]:
    """(plural, verb) whose content a rendered ValidatingAdmissionPolicy checks for `account`'s
    requests (matched by its username, bound with Deny): RBAC says which objects, the policy
    which content. What the policies refuse is tests/chart/test_admission_policy.py's."""
    bound = {d["spec"]["policyName"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"].get("validationActions") == ["Deny"]}
    found = set()
    for policy in (d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] in bound):
        conditions = policy["spec"].get("matchConditions") or []
        if not any(f"request.userInfo.username == '{account.replace(chr(39), '')}'" == c["expression"] for c in conditions):
            continue
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
            found |= {(plural, verb) for plural in rule["resources"] for op in rule["operations"] for verb in OPERATIONS.get(op, ())}
    return found


def escalations(found: set[Grant], namespaces: tuple[str, ...] = NAMESPACES, policed: set[tuple[str, str]] = frozenset()) -> list[str]:
    """Every grant that opens a way to more power than the table means to give; `policed`
    (pinned()) are the writes whose content an admission policy limits."""
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
        if base in WEBHOOK_CONFIGS and g.verb in WRITES and (g.verb == "create" or (base, g.verb) not in policed):
            problems.append(f"{where}: a webhook configuration of one's own sees and mutates every pod (a name limits the object, not its selectors)")
        if base in IDENTITIES and g.verb in WRITES:
            problems.append(f"{where}: makes or binds an identity (a Role bound to system:authenticated, an account to run as)")
        if base in POLICIES:
            problems.append(f"{where}: could lift the admission policies that pin the operator's writes")
        if base in WORKLOADS and g.verb in WRITES - {"delete", "deletecollection"} and (base, g.verb) not in policed:
            problems.append(f"{where}: runs a pod as any ServiceAccount of the namespace, privileged, with the node's filesystem")
        if base == "secrets" and g.verb in ("create", "update", "patch") and (base, g.verb) not in policed:
            problems.append(f"{where}: a kubernetes.io/service-account-token Secret gets another ServiceAccount's token")
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
    assert escalations(found, policed=pinned(rendered)) == []


def test_without_its_admission_policies_the_charts_grants_are_escalations(rendered):
    """What the policies carry: the same grants, unpinned, are the attacks they close."""
    problems = "\n".join(escalations(grants(rendered)))
    assert "create batch/jobs (team-a): runs a pod as any ServiceAccount" in problems
    assert "create secrets (team-a): a kubernetes.io/service-account-token Secret" in problems
    assert "patch admissionregistration.k8s.io/mutatingwebhookconfigurations (cluster): a webhook configuration of one's own" in problems


def test_the_check_finds_what_the_chart_granted_before_its_admission_policies():
    """The per-namespace Role and webhook ClusterRole as they were: an identity per session made
    by the operator, and its webhook configuration patched by name."""
    before = {Grant(v, g, r, n, s) for g, r, n, s, vs in (
        ("", "serviceaccounts", (), "team-a", ("get", "create")), ("rbac.authorization.k8s.io", "roles", (), "team-a", ("get", "create")),
        ("rbac.authorization.k8s.io", "rolebindings", (), "team-a", ("get", "create")),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", ("stepscope-injector.stepscope.io",), "cluster", ("get", "patch"))) for v in vs}
    problems = "\n".join(escalations(before))
    for resource in ("serviceaccounts", "rbac.authorization.k8s.io/roles", "rbac.authorization.k8s.io/rolebindings"):
        assert f"create {resource} (team-a): makes or binds an identity" in problems
    assert "patch admissionregistration.k8s.io/mutatingwebhookconfigurations (cluster): a webhook configuration of one's own" in problems


def test_the_analysis_account_reads_its_namespaces_sessions_only(rendered):
    account = f"system:serviceaccount:{NAMESPACES[0]}:stepscope-analysis"
    """It reads the session; its result goes to the store, and the operator alone writes the status."""
    assert grants(rendered, account) == {Grant("get", "stepscope.io", "profilesessions", (), NAMESPACES[0])}


def test_peering_is_granted_without_the_webhook(helm):
    """Two replicas elect the one that handles sessions through kopf's peering, webhook or not."""
    found = grants(render(helm, *SETS, "webhook.enabled=false"))
    assert {(g.verb, g.scope) for g in found if g.plural == "kopfpeerings"} == {(v, ns) for v in ("get", "list", "watch", "patch") for ns in NAMESPACES}


def test_the_grants_are_the_tables_of_docs_security(rendered):
    assert as_rows(grants(rendered)) == documented()


def test_owner_references_may_block_deletion(rendered):
    found = grants(rendered)
    assert all(Grant("update", "stepscope.io", "profilesessions/finalizers", (), ns) in found for ns in NAMESPACES)


def test_the_check_finds_what_the_first_chart_granted():
    """The rules of the first chart, bound cluster-wide."""
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


def _as_operator(kube, docs: list[dict[str, Any]]) -> kubernetes.client.ApiClient:
    kube.apply_crd()
    for ns in (RELEASE_NAMESPACE, *NAMESPACES):
        kube.create_namespace(ns)
    apply_rbac(kube.api_client, docs)
    return kube.service_account_client(RELEASE_NAMESPACE, "stepscope-operator")


def test_the_operator_identity_makes_no_identity_token_or_privileged_pod(kube, rendered):
    """The rendered RBAC and admission policies in the test API server, the operator's
    ServiceAccount as the caller: it creates the analysis Job it builds and its key Secrets, and
    none of the attacks that `create` on Jobs, Secrets, ServiceAccounts, Roles and RoleBindings
    would allow in a namespace it serves."""
    operator = _as_operator(kube, rendered)
    core, batch = kubernetes.client.CoreV1Api(operator), kubernetes.client.BatchV1Api(operator)
    rbac = kubernetes.client.RbacAuthorizationV1Api(operator)
    settings = OperatorSettings()  # the chart's defaults: its image and analysis account
    batch.create_namespaced_job("team-a", jobs.job("team-a", "s1", "0123456789abcdef", settings, None, {}))
    core.create_namespaced_secret("team-a", {"metadata": {"name": "stepscope-hmac"}, "type": "Opaque", "data": {"key": "a2V5"}})
    root = jobs.job("team-a", "s2", "0123456789abcdef", settings, None, {})
    pod = root["spec"]["template"]["spec"]
    pod.update(serviceAccountName="default", hostPID=True, volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    pod["containers"][0]["securityContext"]["privileged"] = True
    token = {"metadata": {"name": "steal", "annotations": {"kubernetes.io/service-account.name": "default"}}, "type": "kubernetes.io/service-account-token"}
    everyone = {"metadata": {"name": "everyone"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "stepscope-operator"},
                "subjects": [{"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"}]}
    refusals = {
        "job": refused(lambda: batch.create_namespaced_job("team-a", root), 403)["message"],
        "token": refused(lambda: core.create_namespaced_secret("team-a", token), 403)["message"],
        "account": refused(lambda: core.create_namespaced_service_account("team-a", {"metadata": {"name": "mine"}}), 403)["message"],
        "role": refused(lambda: rbac.create_namespaced_role("team-a", {"metadata": {"name": "mine"}, "rules": []}), 403)["message"],
        "binding": refused(lambda: rbac.create_namespaced_role_binding("team-a", everyone), 403)["message"],
    }
    assert "ValidatingAdmissionPolicy 'stepscope-analysis-jobs.stepscope.io'" in refusals["job"]
    assert "ValidatingAdmissionPolicy 'stepscope-secrets.stepscope.io'" in refusals["token"]
    assert all("cannot create resource" in refusals[k] for k in ("account", "role", "binding"))


def test_the_operator_uses_kopf_peering_without_the_webhook(kube, helm):
    kube.apply_crd(REPO / "helm" / "stepscope" / "crds" / "kopfpeering.yaml")
    operator = kubernetes.client.CustomObjectsApi(_as_operator(kube, render(helm, *SETS, "webhook.enabled=false")))
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "stepscope"}}
    kubernetes.client.CustomObjectsApi(kube.api_client).create_namespaced_custom_object("kopf.dev", "v1", "team-a", "kopfpeerings", peering)
    assert [p["metadata"]["name"] for p in operator.list_namespaced_custom_object("kopf.dev", "v1", "team-a", "kopfpeerings")["items"]] == ["stepscope"]
    operator.patch_namespaced_custom_object("kopf.dev", "v1", "team-a", "kopfpeerings", "stepscope", {"status": {"replica-1": {"priority": 1}}})
