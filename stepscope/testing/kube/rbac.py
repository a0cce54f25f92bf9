"""RBAC authorization of ServiceAccount tokens against the stored Roles, ClusterRoles and their
bindings, so tests can check that an identity can do what it needs and nothing more.
The admin token (group system:masters) is never checked, as in a real cluster."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import errors

RBAC = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        return "system:masters" in self.groups

    @classmethod
    def service_account(cls, namespace: str, name: str) -> User:
        return cls(f"system:serviceaccount:{namespace}:{name}",
                   ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


@dataclass(frozen=True)
class Attributes:
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str | None
    name: str | None


def _subject_matches(subject: dict[str, Any], user: User, binding_namespace: str | None) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{namespace}:{subject.get('name')}"
    if kind == "Group":
        return subject.get("name") in user.groups
    return kind == "User" and subject.get("name") == user.name


def _rule_allows(rule: dict[str, Any], a: Attributes) -> bool:
    resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    names = rule.get("resourceNames") or []
    return (any(g in ("*", a.group) for g in rule.get("apiGroups", []))
            and any(r in ("*", resource) for r in rule.get("resources", []))
            and any(v in ("*", a.verb) for v in rule.get("verbs", []))
            and (not names or a.name in names))


def allowed(rbac_objects: dict[str, list[dict[str, Any]]], user: User, a: Attributes) -> bool:
    """rbac_objects: stored objects by kind (Role, RoleBinding, ClusterRole, ClusterRoleBinding)."""
    roles = {(r["metadata"].get("namespace"), r["metadata"]["name"]): r for r in rbac_objects["Role"]}
    cluster_roles = {r["metadata"]["name"]: r for r in rbac_objects["ClusterRole"]}
    bindings = list(rbac_objects["ClusterRoleBinding"])
    bindings += [b for b in rbac_objects["RoleBinding"] if a.namespace and b["metadata"].get("namespace") == a.namespace]
    for binding in bindings:
        namespace = binding["metadata"].get("namespace")
        if not any(_subject_matches(s, user, namespace) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        role = cluster_roles.get(ref.get("name")) if ref.get("kind") == "ClusterRole" else roles.get((namespace, ref.get("name")))
        if role and any(_rule_allows(rule, a) for rule in role.get("rules") or []):
            return True
    return False


def not_held(rbac_objects: dict[str, list[dict[str, Any]]], user: User, rules: list[dict[str, Any]], namespace: str | None) -> list[str]:
    """The rules (one line per group/resource/verb/name, the API server's wording) that `user` does
    not hold itself in `namespace`: what the RBAC escalation check refuses to let it grant."""
    missing = []
    for rule in rules:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                plural, _, sub = resource.partition("/")
                for verb in rule.get("verbs") or []:
                    for name in rule.get("resourceNames") or [None]:
                        if not allowed(rbac_objects, user, Attributes(verb, group, plural, sub, namespace, name)):
                            names = f', ResourceNames:["{name}"]' if name else ""
                            missing.append(f'{{APIGroups:["{group}"], Resources:["{resource}"]{names}, Verbs:["{verb}"]}}')
    return missing


def forbidden(user: User, a: Attributes) -> errors.ApiError:
    qualified = f"{a.resource}.{a.group}" if a.group else a.resource
    target = f'{qualified} "{a.name}"' if a.name else qualified
    resource = f'resource "{a.resource}"' + (f' in subresource "{a.subresource}"' if a.subresource else "")
    where = f' in the namespace "{a.namespace}"' if a.namespace else " at the cluster scope"
    return errors.ApiError(403, "Forbidden",
                           f'{target} is forbidden: User "{user.name}" cannot {a.verb} {resource} in API group "{a.group}"{where}',
                           {"name": a.name or "", "group": a.group, "kind": a.resource})
