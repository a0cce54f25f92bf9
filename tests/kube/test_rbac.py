"""RBAC for ServiceAccount tokens: what a Role grants is allowed, everything else is 403."""
from __future__ import annotations

import kubernetes

from tests.kube.helpers import GROUP, PLURAL, VERSION, pod, refused, session

ROLE = {"metadata": {"name": "analysis-s"}, "rules": [
    {"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": ["s"], "verbs": ["get"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": ["s"], "verbs": ["patch"]}]}
BINDING = {"metadata": {"name": "analysis-s"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "analysis-s"},
           "subjects": [{"kind": "ServiceAccount", "name": "analysis-s", "namespace": "default"}]}


def _forbidden(call) -> str:
    return refused(call, 403)["message"]


def test_a_role_with_resource_names_allows_exactly_its_rules(kube):
    kube.apply_crd()
    admin = kubernetes.client.CustomObjectsApi(kube.api_client)
    for name in ("s", "t"):
        admin.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, session(name))
    sa = kubernetes.client.CustomObjectsApi(kube.service_account_client("default", "analysis-s"))
    assert "cannot get resource" in _forbidden(lambda: sa.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s"))

    rbac = kubernetes.client.RbacAuthorizationV1Api(kube.api_client)
    rbac.create_namespaced_role("default", ROLE)
    rbac.create_namespaced_role_binding("default", BINDING)
    assert sa.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s")["metadata"]["name"] == "s"
    patched = sa.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "s", {"status": {"phase": "Succeeded"}})
    assert patched["status"]["phase"] == "Succeeded"
    message = _forbidden(lambda: sa.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "t"))
    assert message == ('profilesessions.stepscope.io "t" is forbidden: User "system:serviceaccount:default:analysis-s" '
                       'cannot get resource "profilesessions" in API group "stepscope.io" in the namespace "default"')
    _forbidden(lambda: sa.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s", {"spec": {"saveRawTrace": "none"}}))
    _forbidden(lambda: sa.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL))
    _forbidden(lambda: sa.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s"))
    core = kubernetes.client.CoreV1Api(kube.service_account_client("default", "analysis-s"))
    _forbidden(lambda: core.read_namespaced_secret("anything", "default"))


def test_cluster_role_binding_grants_every_namespace(kube):
    kube.create_namespace("team")
    admin = kubernetes.client.CoreV1Api(kube.api_client)
    admin.create_namespaced_pod("team", pod("p"))
    rbac = kubernetes.client.RbacAuthorizationV1Api(kube.api_client)
    rbac.create_cluster_role({"metadata": {"name": "pod-reader"},
                              "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": "operator"},
                                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pod-reader"},
                                      "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": "stepscope"}]})
    core = kubernetes.client.CoreV1Api(kube.service_account_client("stepscope", "operator"))
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items] == ["p"]
    assert core.read_namespaced_pod("p", "team").metadata.name == "p"
    _forbidden(lambda: core.delete_namespaced_pod("p", "team"))
    _forbidden(lambda: core.patch_namespaced_pod_status("p", "team", {"status": {"phase": "Running"}}))
    other = kubernetes.client.CoreV1Api(kube.service_account_client("stepscope", "someone-else"))
    _forbidden(lambda: other.read_namespaced_pod("p", "team"))


def test_token_request_gives_a_service_account_token(kube):
    core = kubernetes.client.CoreV1Api(kube.api_client)
    core.create_namespaced_service_account("default", {"metadata": {"name": "reader"}})
    token = core.create_namespaced_service_account_token("reader", "default", {"spec": {"expirationSeconds": 600}}).status.token
    config = kubernetes.client.Configuration(host=kube.url, api_key={"authorization": f"Bearer {token}"})
    as_reader = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))
    assert 'User "system:serviceaccount:default:reader" cannot list resource "pods"' in _forbidden(lambda: as_reader.list_namespaced_pod("default"))
    assert refused(lambda: core.create_namespaced_service_account_token("absent", "default", {"spec": {}}), 404)
