"""RBAC for ServiceAccount tokens: what a Role grants is allowed, everything else is 403."""
from __future__ import annotations

import kubernetes

from stepscope.testing.kube.helpers import GROUP, PLURAL, VERSION, pod, refused, session

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


def _operator_with(kube, rules: list[dict]) -> kubernetes.client.ApiClient:
    rbac = kubernetes.client.RbacAuthorizationV1Api(kube.api_client)
    rbac.create_namespaced_role("default", {"metadata": {"name": "op"}, "rules": rules})
    rbac.create_namespaced_role_binding("default", {"metadata": {"name": "op"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "op"},
                                                    "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "default"}]})
    return kube.service_account_client("default", "op")


CAN_CREATE_ROLES = {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["create"]}


def test_a_role_may_grant_only_what_its_creator_holds(kube):
    """kube-apiserver's RBAC escalation check (no `escalate` or `bind` verb held)."""
    client = _operator_with(kube, [CAN_CREATE_ROLES, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}])
    rbac = kubernetes.client.RbacAuthorizationV1Api(client)
    rbac.create_namespaced_role("default", {"metadata": {"name": "narrow"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["one"], "verbs": ["get"]}]})
    message = _forbidden(lambda: rbac.create_namespaced_role("default", {"metadata": {"name": "wide"}, "rules": [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}))
    assert message == ('roles.rbac.authorization.k8s.io "wide" is forbidden: user "system:serviceaccount:default:op" is attempting to grant '
                       'RBAC permissions not currently held:\n{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}')
    admin = kubernetes.client.RbacAuthorizationV1Api(kube.api_client)
    admin.create_namespaced_role("default", {"metadata": {"name": "secret-reader"}, "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]})
    binding = lambda role: {"metadata": {"name": f"to-{role}"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},  # noqa: E731 (a one-line helper local to the test)
                            "subjects": [{"kind": "ServiceAccount", "name": "x", "namespace": "default"}]}
    rbac.create_namespaced_role_binding("default", binding("narrow"))
    assert "not currently held" in _forbidden(lambda: rbac.create_namespaced_role_binding("default", binding("secret-reader")))


def test_block_owner_deletion_needs_update_on_the_owners_finalizers(kube):
    """The admission plugin OwnerReferencesPermissionEnforcement, on here."""
    kube.apply_crd()
    owner = kubernetes.client.CustomObjectsApi(kube.api_client).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, session("s"))
    ref = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileSession", "name": "s", "uid": owner["metadata"]["uid"], "blockOwnerDeletion": True}
    client = _operator_with(kube, [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}])
    core = kubernetes.client.CoreV1Api(client)
    message = _forbidden(lambda: core.create_namespaced_config_map("default", {"metadata": {"name": "a", "ownerReferences": [ref]}}))
    assert "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on" in message
    assert 'cannot update resource "profilesessions" in subresource "finalizers"' in message
    core.create_namespaced_config_map("default", {"metadata": {"name": "b", "ownerReferences": [{**ref, "blockOwnerDeletion": False}]}})
    kubernetes.client.RbacAuthorizationV1Api(kube.api_client).patch_namespaced_role("op", "default", {"rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/finalizers"], "verbs": ["update"]}]})
    core.create_namespaced_config_map("default", {"metadata": {"name": "c", "ownerReferences": [ref]}})


def test_a_subject_access_review_answers_from_the_stored_rbac(kube):
    """What `kubectl auth can-i --as=system:serviceaccount:default:analysis-s` asks."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(kube.api_client)
    rbac.create_namespaced_role("default", ROLE)
    rbac.create_namespaced_role_binding("default", BINDING)
    reviews = kubernetes.client.AuthorizationV1Api(kube.api_client)

    def can(verb: str, subresource: str = "", name: str = "s", namespace: str = "default") -> bool:
        return reviews.create_subject_access_review({"spec": {
            "user": "system:serviceaccount:default:analysis-s", "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": GROUP, "resource": PLURAL, "subresource": subresource,
                                   "namespace": namespace, "name": name}}}).status.allowed
    assert can("get") and can("patch", "status")
    assert not can("patch") and not can("get", name="t") and not can("get", namespace="other") and not can("delete")
