"""The analysis Job of a session and the least-privilege identity it runs as.

Per session: a ServiceAccount, a Role that can only read this one ProfileSession and patch its
status (resourceNames), a RoleBinding, and the batch/v1 Job. All are owned by the session, so
deleting the session garbage-collects them."""
from __future__ import annotations

from typing import Any

from stepscope.operator import kube
from stepscope.operator.credentials import ENV_OF_FIELD
from stepscope.operator.settings import GROUP, KIND, PLURAL, SESSION_LABEL, VERSION, OperatorSettings


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": name, "uid": uid, "controller": True, "blockOwnerDeletion": True}


def job_name(name: str, uid: str) -> str:
    # Job names become a pod label value (63 characters at most); the uid part keeps two sessions
    # whose long names share a prefix apart.
    return f"{name[:40].rstrip('-.')}-analysis-{uid[:5]}"


def account_name(name: str, uid: str) -> str:
    return f"stepscope-analysis-{job_name(name, uid)}"


def _meta(name: str, namespace: str, session: str, uid: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": {SESSION_LABEL: session, "app.kubernetes.io/managed-by": "stepscope"}, "ownerReferences": [owner_reference(session, uid)]}


def identity(namespace: str, session: str, uid: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding of one session's analysis Job."""
    account = account_name(session, uid)
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(account, namespace, session, uid)}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(account, namespace, session, uid),
        "rules": [
            {"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [session], "verbs": ["get"]},
            {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": [session], "verbs": ["get", "patch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(account, namespace, session, uid),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    return sa, role, binding


def job(namespace: str, session: str, uid: str, settings: OperatorSettings, secret: str | None, secret_keys: dict[str, str]) -> dict[str, Any]:
    """The Job running `stepscope analyze --session NS/NAME`; store credentials come in as env
    from the session's Secret (secret_keys: wire field -> the Secret's data key)."""
    env = [{"name": ENV_OF_FIELD[field], "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for field, key in sorted(secret_keys.items())] if secret else []
    container = {
        "name": "analysis",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["stepscope", "analyze", "--session", f"{namespace}/{session}"],
        "env": env,
        "resources": {"requests": {"cpu": settings.analysis_cpu, "memory": settings.analysis_memory}, "limits": {"memory": settings.analysis_memory}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(job_name(session, uid), namespace, session, uid),
        "spec": {
            "backoffLimit": 1,
            "template": {
                "metadata": {"labels": {SESSION_LABEL: session}},
                "spec": {"serviceAccountName": account_name(session, uid), "restartPolicy": "Never", "containers": [container]},
            },
        },
    }


def create_analysis(namespace: str, session: str, uid: str, settings: OperatorSettings, secret: str | None, secret_keys: dict[str, str]) -> str:
    """Create (or find, after a restart) the identity and the Job; returns the Job's name."""
    sa, role, binding = identity(namespace, session, uid)
    core, rbac, batch = kube.core(), kube.rbac(), kube.batch()
    kube.create_or_get(core.create_namespaced_service_account, core.read_namespaced_service_account, namespace, sa)
    kube.create_or_get(rbac.create_namespaced_role, rbac.read_namespaced_role, namespace, role)
    kube.create_or_get(rbac.create_namespaced_role_binding, rbac.read_namespaced_role_binding, namespace, binding)
    manifest = job(namespace, session, uid, settings, secret, secret_keys)
    kube.create_or_get(batch.create_namespaced_job, batch.read_namespaced_job, namespace, manifest)
    return manifest["metadata"]["name"]


def job_outcome(job_obj: Any) -> tuple[str, str]:
    """('Running' | 'Succeeded' | 'Failed', message) of a Job read through the client."""
    status = job_obj.status
    for cond in (status.conditions if status else None) or []:
        if cond.status == "True" and cond.type in ("Complete", "SuccessCriteriaMet"):
            return "Succeeded", cond.message or "analysis Job completed"
        if cond.status == "True" and cond.type in ("Failed", "FailureTarget"):
            return "Failed", f"analysis Job failed: {cond.reason or ''} {cond.message or ''}".strip()
    if status and (status.succeeded or 0) >= 1:
        return "Succeeded", "analysis Job completed"
    return "Running", ""
