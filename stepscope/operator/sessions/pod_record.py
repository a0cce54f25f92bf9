"""Which pods a session triggered and which refused, kept in a ConfigMap the session owns.

The status holds only their counts, so it stays under its 32 KiB budget whatever the pod count;
the names live here so that an operator restart follows the same pods and never triggers a
sidecar twice, and so that a deletion knows whom to cancel. The lists are gzipped (binaryData,
one name a line): pod names of a job share long prefixes, so the 1 MiB a ConfigMap holds takes
hundreds of thousands of them rather than the ~4,000 of 253-character names it would take as
plain text.

    kubectl get cm NAME -o jsonpath='{.binaryData.triggered\\.gz}' | base64 -d | gunzip"""
from __future__ import annotations

import base64
import gzip
import zlib
from dataclasses import dataclass

from kubernetes.client.rest import ApiException

from stepscope.operator import kube
from stepscope.operator.sessions.jobs import owner_reference
from stepscope.operator.settings import SESSION_LABEL

# The API server refuses a ConfigMap whose data and binaryData (decoded) exceed 1 MiB in all.
MAX_BYTES = 1024 * 1024
# The room left when the selection is checked before the fan-out: only the fan-out splits the
# names into triggered and refused, and two gzip streams took up to 2.4% more than one of all
# the names (random splits of 100,000 job pod names).
SPLIT_HEADROOM = 0.05


class PodRecordTooLarge(Exception):
    """The names do not fit in one ConfigMap; the message says what to change."""

    def __init__(self, pods: int, size: int, room: int) -> None:
        super().__init__(f"the names of the {pods} selected pods take {size:,} bytes gzipped, more than the {room:,} a pod record "
                         "(a ConfigMap) holds; narrow spec.selector or split the pods over several ProfileSessions")


class PodRecordUnreadable(Exception):
    """The ConfigMap is there but does not hold the lists the operator wrote (edited by hand?)."""


@dataclass(frozen=True)
class PodRecord:
    triggered: frozenset[str]
    refused: frozenset[str]


def record_name(session: str, uid: str) -> str:
    # ConfigMap names are DNS subdomains (253 characters); the uid part keeps two sessions whose
    # long names share a prefix apart.
    return f"{session[:200].rstrip('-.')}-pods-{uid[:5]}"


def _packed(record: PodRecord) -> dict[str, bytes]:
    return {key: gzip.compress("\n".join(sorted(names)).encode(), mtime=0)
            for key, names in (("triggered.gz", record.triggered), ("refused.gz", record.refused))}


def _unpack(data: str) -> frozenset[str]:
    return frozenset(n for n in gzip.decompress(base64.b64decode(data)).decode().split("\n") if n)


def _taken(packed: dict[str, bytes]) -> int:
    return sum(len(key) + len(value) for key, value in packed.items())  # keys too, to be safe


def size(record: PodRecord) -> int:
    """The bytes the record takes against the ConfigMap limit."""
    return _taken(_packed(record))


def check_room(names: frozenset[str]) -> None:
    """Raise PodRecordTooLarge, before any of `names` is triggered, when their record might not fit."""
    room = int(MAX_BYTES * (1 - SPLIT_HEADROOM))
    taken = size(PodRecord(names, frozenset()))
    if taken > room:
        raise PodRecordTooLarge(len(names), taken, room)


def read(namespace: str, session: str, uid: str) -> PodRecord | None:
    """The record, or None when there is none yet (or it was deleted); PodRecordUnreadable when
    it does not hold the gzipped lists (the operator never writes one without a triggered pod)."""
    name = record_name(session, uid)
    try:
        cm = kube.core().read_namespaced_config_map(name, namespace)
    except ApiException as exc:
        if kube.is_not_found(exc):
            return None
        raise
    data = cm.binary_data or {}
    try:
        record = PodRecord(_unpack(data["triggered.gz"]), _unpack(data.get("refused.gz") or ""))
    except KeyError:
        raise PodRecordUnreadable(f"ConfigMap {name}, the list of pods this session triggered, has no binaryData triggered.gz") from None
    except (OSError, EOFError, zlib.error, ValueError) as exc:  # not gzip, truncated, not UTF-8
        raise PodRecordUnreadable(f"ConfigMap {name}, the list of pods this session triggered, is unreadable: {exc}") from None
    if not record.triggered:
        raise PodRecordUnreadable(f"ConfigMap {name}, the list of pods this session triggered, lists none")
    return record


def write(namespace: str, session: str, uid: str, record: PodRecord) -> str:
    """Create the record, or overwrite the one an earlier operator process left; returns its name.
    PodRecordTooLarge, before any request, when it would not fit in a ConfigMap."""
    name = record_name(session, uid)
    packed = _packed(record)
    taken = _taken(packed)
    if taken > MAX_BYTES:
        raise PodRecordTooLarge(len(record.triggered | record.refused), taken, MAX_BYTES)
    data = {key: base64.b64encode(value).decode() for key, value in packed.items()}
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
