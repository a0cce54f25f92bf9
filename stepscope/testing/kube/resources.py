"""The resource types the test API server serves and the discovery documents that list them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    subresources: tuple[str, ...] = ()
    # Built-in types get strategic merge patch; custom resources refuse it (415) like the real server.
    builtin: bool = True
    schema: dict[str, Any] | None = None  # openAPIV3Schema of a CRD version
    printer_columns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """`pods` or `profilesessions.stepscope.io`, as API server messages name a resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_resources(self) -> list[dict[str, Any]]:
        main = {"name": self.plural, "singularName": self.singular or self.kind.lower(),
                "namespaced": self.namespaced, "kind": self.kind, "verbs": VERBS}
        if self.short_names:
            main["shortNames"] = self.short_names
        subs = [{"name": f"{self.plural}/{sub}", "singularName": "", "namespaced": self.namespaced,
                 "kind": self.kind, "verbs": ["get", "patch", "update"]} for sub in self.subresources]
        return [main, *subs]


def builtin_types() -> list[ResourceType]:
    return [
        ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, short_names=["ns"], subresources=("status",)),
        ResourceType("", "v1", "nodes", "Node", namespaced=False, short_names=["no"], subresources=("status",)),
        ResourceType("", "v1", "pods", "Pod", short_names=["po"], subresources=("status",)),
        ResourceType("", "v1", "services", "Service", short_names=["svc"], subresources=("status",)),
        ResourceType("", "v1", "secrets", "Secret"),
        ResourceType("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
        ResourceType("", "v1", "serviceaccounts", "ServiceAccount", short_names=["sa"], subresources=("token",)),
        ResourceType("", "v1", "events", "Event", short_names=["ev"]),
        ResourceType("events.k8s.io", "v1", "events", "Event", short_names=["ev"]),
        ResourceType("batch", "v1", "jobs", "Job", subresources=("status",)),
        ResourceType("apps", "v1", "deployments", "Deployment", short_names=["deploy"], subresources=("status",)),
        ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
        ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role"),
        ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
        ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
        ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
        ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role"),
        ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
        ResourceType("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                     "MutatingWebhookConfiguration", namespaced=False),
        ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
                     "ValidatingAdmissionPolicy", namespaced=False, subresources=("status",)),
        ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                     "ValidatingAdmissionPolicyBinding", namespaced=False),
        ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                     namespaced=False, short_names=["crd", "crds"], subresources=("status",)),
    ]


def crd_types(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CustomResourceDefinition."""
    spec = crd["spec"]
    names = spec["names"]
    types = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        subresources = tuple(sorted((version.get("subresources") or {}).keys()))
        types.append(ResourceType(
            spec["group"], version["name"], names["plural"], names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            singular=names.get("singular", ""), short_names=list(names.get("shortNames", [])),
            subresources=subresources, builtin=False,
            schema=(version.get("schema") or {}).get("openAPIV3Schema"),
            printer_columns=list(version.get("additionalPrinterColumns", []))))
    return types


def group_list(types: list[ResourceType]) -> dict[str, Any]:
    """GET /apis: every non-core group with its versions."""
    versions: dict[str, list[str]] = {}
    for t in types:
        if t.group and t.version not in versions.setdefault(t.group, []):
            versions[t.group].append(t.version)
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [group_document(group, vs) for group, vs in versions.items()]}


def group_document(group: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
            "preferredVersion": entries[0]}


def resource_list(group_version: str, types: list[ResourceType]) -> dict[str, Any]:
    """GET /api/v1 or /apis/<group>/<version>: the resources and their subresources."""
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [r for t in types for r in t.api_resources()]}
