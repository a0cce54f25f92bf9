"""The analysis Job of a session.

It runs as the chart's analysis ServiceAccount of the namespace (settings.analysis_account: get
ProfileSessions, nothing else; helm/stepscope/templates/rbac.yaml), so the operator
creates no identity; the chart's ValidatingAdmissionPolicy refuses any other Job of the operator's
(image, account, privilege). The pod spec passes Pod Security `restricted`. The Job is owned by
the session, so deleting the session garbage-collects it."""

from __future__ import annotations

import copy
import math
from typing import Any

from kubernetes.client.rest import ApiException

from stepscope.operator import kube
from stepscope.operator.credentials import ENV_OF_FIELD
from stepscope.operator.settings import GROUP, IMAGE_UID, KIND, SESSION_LABEL, VERSION, OperatorSettings

# Pod Security "restricted" (the image's USER is named, so runAsNonRoot holds before it is pulled).
POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": IMAGE_UID,
    "runAsGroup": IMAGE_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_name(name: str, uid: str) -> str:
    # Job names become a pod label value (63 characters at most); the uid part keeps two sessions
    # whose long names share a prefix apart.
    return f"{name[:40].rstrip('-.')}-analysis-{uid[:5]}"


def _meta(name: str, namespace: str, session: str, uid: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {SESSION_LABEL: session, "app.kubernetes.io/managed-by": "stepscope"},
        "ownerReferences": [owner_reference(session, uid)],
    }


def job(
    namespace: str, session: str, uid: str, settings: OperatorSettings, secret: str | None, secret_keys: dict[str, str]
) -> dict[str, Any]:
    """The Job running `stepscope analyze --session NS/NAME`; store credentials come in as env
    from the session's Secret (secret_keys: wire field -> the Secret's data key)."""
    env = (
        [
            {"name": ENV_OF_FIELD[field], "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
            for field, key in sorted(secret_keys.items())
        ]
        if secret
        else []
    )
    container = {
        "name": "analysis",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["stepscope", "analyze", "--session", f"{namespace}/{session}"],
        "env": env,
        "resources": {
            "requests": {"cpu": settings.analysis_cpu, "memory": settings.analysis_memory},
            "limits": {"memory": settings.analysis_memory},
        },
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(job_name(session, uid), namespace, session, uid),
        "spec": {
            "backoffLimit": 1,
            "template": {
                "metadata": {"labels": {SESSION_LABEL: session}},
                "spec": {
                    "serviceAccountName": settings.analysis_account,
                    "restartPolicy": "Never",
                    "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
                    "containers": [container],
                },
            },
        },
    }


# A shard of at most this many raw ranks (about 2 s of CPU each): a retried shard redoes little.
RANKS_PER_SHARD = 8
# Tries of one shard beyond its first (spec.backoffLimitPerIndex, Kubernetes 1.29+; an API server
# without it drops the field and the Job's default backoffLimit of 6 counts every shard's failures).
SHARD_RETRIES = 2


def shard_name(name: str, uid: str) -> str:
    # The analysis Job's name with "-shards" (63 characters at most, as job_name's).
    return f"{name[:40].rstrip('-.')}-shards-{uid[:5]}"


def shard_plan(unsummarised: int, requested: int, limit: int) -> tuple[int, int] | None:
    """(completions, parallelism) of the shard Job for `unsummarised` raw ranks, with
    spec.analysis.parallelism `requested` and the chart's analysis.maxParallelism `limit`; None
    when the analysis Job alone summarises them (none to do, or one pod at a time anyway). At
    least one shard per pod that may run, each of at most RANKS_PER_SHARD ranks, never more
    shards than ranks."""
    parallelism = min(requested, limit, unsummarised)
    if parallelism < 2:
        return None
    return min(unsummarised, max(parallelism, math.ceil(unsummarised / RANKS_PER_SHARD))), parallelism


def shard_job(
    namespace: str,
    session: str,
    uid: str,
    settings: OperatorSettings,
    secret: str | None,
    secret_keys: dict[str, str],
    completions: int,
    parallelism: int,
) -> dict[str, Any]:
    """The Indexed Job whose pod of completion index i runs `stepscope analyze --session NS/NAME
    --shards <completions>`: it summarises shard i of the session's raw traces into its store. The
    Job controller runs, retries (per index) and counts the shards; the same pod as the analysis Job's."""
    manifest = job(namespace, session, uid, settings, secret, secret_keys)
    manifest["metadata"]["name"] = shard_name(session, uid)
    spec = manifest["spec"]
    del spec["backoffLimit"]  # with backoffLimitPerIndex, the Job controller's default: every index runs
    spec.update(
        {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": parallelism,
            "backoffLimitPerIndex": SHARD_RETRIES,
        }
    )
    spec["template"]["spec"]["containers"][0]["command"] += ["--shards", str(completions)]
    return manifest


def create_shards(
    namespace: str,
    session: str,
    uid: str,
    settings: OperatorSettings,
    secret: str | None,
    secret_keys: dict[str, str],
    completions: int,
    parallelism: int,
) -> str:
    """Create (or find, after a restart) the shard Job; returns its name."""
    manifest = shard_job(namespace, session, uid, settings, secret, secret_keys, completions, parallelism)
    batch = kube.batch()
    kube.create_or_get(batch.create_namespaced_job, batch.read_namespaced_job, namespace, manifest)
    return manifest["metadata"]["name"]


def create_analysis(
    namespace: str, session: str, uid: str, settings: OperatorSettings, secret: str | None, secret_keys: dict[str, str]
) -> str:
    """Create (or find, after a restart) the Job; returns its name."""
    manifest = job(namespace, session, uid, settings, secret, secret_keys)
    batch = kube.batch()
    kube.create_or_get(batch.create_namespaced_job, batch.read_namespaced_job, namespace, manifest)
    return manifest["metadata"]["name"]


def failed_indexes(job_obj: Any) -> str:
    """The shards the Job gave up on ("1,4-5"), "" when none or unknown."""
    status = job_obj.status if job_obj is not None else None
    return str(getattr(status, "failed_indexes", None) or "")


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


def pod_presence(job_obj: Any) -> tuple[float | None, int]:
    """(creation time as epoch seconds, pods the Job has or had) of a Job read through the client."""
    created = job_obj.metadata.creation_timestamp if job_obj is not None and job_obj.metadata else None
    status = job_obj.status if job_obj is not None else None
    pods = (
        sum((getattr(status, f, None) or 0) for f in ("active", "ready", "succeeded", "failed", "terminating"))
        if status
        else 0
    )
    return (created.timestamp() if created else None), pods


def failed_create(namespace: str, job_name: str) -> str:
    """The message of the Job controller's latest FailedCreate event on the Job ("Error creating:
    pods ... is forbidden: violates PodSecurity ..."), or "" when there is none or it cannot be read."""
    try:
        events = (
            kube.core()
            .list_namespaced_event(namespace, field_selector=f"involvedObject.name={job_name},reason=FailedCreate")
            .items
        )
    except ApiException:
        return ""  # an operator without `list events` fails the session at spec.timeoutSeconds, as before
    latest = max(events, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp, default=None)
    return (latest.message or "the Job controller could not create its pod") if latest is not None else ""
