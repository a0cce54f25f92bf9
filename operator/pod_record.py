"""Which pods a session triggered and which refused, kept in a ConfigMap the session owns.

The status holds only their counts, so it stays under its 32 KiB budget whatever the pod count;
the names live here so that an operator restart follows the same pods and never triggers a
sidecar twice. The lists are gzipped (binaryData, one name a line): pod names of a job share
long prefixes, so the 1 MiB a ConfigMap holds takes hundreds of thousands of them rather than
the ~4,000 of 253-character names it would take as plain text.

    kubectl get cm NAME -o jsonpath='{.binaryData.triggered\\.gz}' | base64 -d | gunzip"""
from __future__ import annotations

import base64
import gzip
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


def _pack(names: frozenset[str]) -> str:
    return base64.b64encode(gzip.compress("\n".join(sorted(names)).encode(), mtime=0)).decode()


def _unpack(data: str | None) -> frozenset[str]:
    text = gzip.decompress(base64.b64decode(data)).decode() if data else ""
    return frozenset(n for n in text.split("\n") if n)


def read(namespace: str, session: str, uid: str) -> PodRecord | None:
    """The record, or None when there is none yet (or it was deleted)."""
    try:
        cm = kube.core().read_namespaced_config_map(record_name(session, uid), namespace)
    except ApiException as exc:
        if kube.is_not_found(exc):
            return None
        raise
    data = cm.binary_data or {}
    return PodRecord(_unpack(data.get("triggered.gz")), _unpack(data.get("refused.gz")))


def write(namespace: str, session: str, uid: str, record: PodRecord) -> str:
    """Create the record, or overwrite the one an earlier operator process left; returns its name."""
    name = record_name(session, uid)
    data = {"triggered.gz": _pack(record.triggered), "refused.gz": _pack(record.refused)}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "binaryData": data, "metadata": {
        "name": name, "namespace": namespace, "ownerReferences": [owner_reference(session, uid)],
        "labels": {SESSION_LABEL: session, "app.kubernetes.io/managed-by": "stepscope"}}}
    core = kube.core()
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core.patch_namespaced_config_map(name, namespace, {"binaryData": data})
    return name
