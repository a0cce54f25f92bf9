"""Which pods a session triggered and which refused, kept in a ConfigMap the session owns.

The status holds only their counts, so it stays under its 32 KiB budget whatever the pod count;
the names live here so that an operator restart follows the same pods and never triggers a
sidecar twice. A ConfigMap holds up to 1 MiB: some 15,000 pods with 63-character names."""
from __future__ import annotations

from dataclasses import dataclass

from kubernetes.client.rest import ApiException

from stepscope.operator import kube
from stepscope.operator.jobs import owner_reference
from stepscope.operator.settings import SESSION_LABEL


@dataclass(frozen=True)
class PodRecord:
    triggered: frozenset[str]
    refused: frozenset[str]


def record_name(session: str, uid: str) -> str:
    # ConfigMap names are DNS subdomains (253 characters); the uid part keeps two sessions whose
    # long names share a prefix apart.
    return f"{session[:200].rstrip('-.')}-pods-{uid[:5]}"


def _lines(names: frozenset[str]) -> str:
    return "\n".join(sorted(names))


def _names(text: str | None) -> frozenset[str]:
    return frozenset(n for n in (text or "").split("\n") if n)


def read(namespace: str, session: str, uid: str) -> PodRecord | None:
    """The record, or None when there is none yet (or it was deleted)."""
    try:
        cm = kube.core().read_namespaced_config_map(record_name(session, uid), namespace)
    except ApiException as exc:
        if kube.is_not_found(exc):
            return None
        raise
    data = cm.data or {}
    return PodRecord(_names(data.get("triggered")), _names(data.get("refused")))


def write(namespace: str, session: str, uid: str, record: PodRecord) -> str:
    """Create the record, or overwrite the one an earlier operator process left; returns its name."""
    name = record_name(session, uid)
    data = {"triggered": _lines(record.triggered), "refused": _lines(record.refused)}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "data": data, "metadata": {
        "name": name, "namespace": namespace, "ownerReferences": [owner_reference(session, uid)],
        "labels": {SESSION_LABEL: session, "app.kubernetes.io/managed-by": "stepscope"}}}
    core = kube.core()
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core.patch_namespaced_config_map(name, namespace, {"data": data})
    return name
