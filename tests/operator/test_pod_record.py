"""The status of a session over thousands of pods stays under the 32 KiB of docs/design.md, because the
pod names live in the session's pod record (a ConfigMap it owns), which an operator restart reads."""
from __future__ import annotations

import json
import random
from typing import Any

import kubernetes
import pytest

from stepscope.analysis.diagnosis import diagnose
from stepscope.analysis.model import Diagnosis, Finding, SlowWorker, StepTime
from stepscope.operator import kube as operator_kube
from stepscope.operator.sessions import pod_record
from stepscope.operator.sessions.pod_record import PodRecord
from stepscope.operator.sessions.status import MAX_MESSAGE, STATUS_BUDGET, PodProgress, aggregate, diagnosed_status, now_iso, pod_counts, set_condition
from stepscope.testing.kube.fixtures import Kube
from tests.chart.conftest import RELEASE_NAMESPACE, apply_rbac, helm, render  # noqa: F401 (helm is a fixture)

PODS = 3000
UID = "0123456789abcdef-0123-4567-89ab"


def pod_names(n: int) -> list[str]:
    # The longest pod names there are (253 characters), so the record's size is a worst case too.
    return [f"{i:05d}-" + "p" * 247 for i in range(n)]


def worst_case_status(name: str, pods: PodRecord, record: str) -> dict[str, Any]:
    """The status after every write of the operator and the analysis Job, each field as large as
    they let it grow: long names and messages, every pod failed, a diagnosis far over budget."""
    progress = {pod: PodProgress(lost="sidecar lost the session: " + "x" * 300) for pod in pods.triggered}
    progress.update({pod: PodProgress(lost="trigger refused by the sidecar") for pod in pods.refused})
    agg = aggregate(progress)
    conditions: list[dict[str, Any]] = []
    for kind in ("Triggered", "Captured"):
        conditions = set_condition(conditions, kind, True, kind, "m" * 5000, 1)
    status = {"phase": "Analyzing", "message": "m" * MAX_MESSAGE, "observedGeneration": 1, "startTime": now_iso(),
              "pods": pod_counts(record, pods), "workers": agg.workers, "failedWorkers": agg.failed_workers,
              "workersReady": f"{agg.workers['captured']}/{agg.workers['total']}", "conditions": conditions, "analysisJob": "j" * 63}
    # The analysis bounds its diagnosis like the CRD's schema does; it comes at those bounds here.
    findings = [Finding("warning", "kernel", list(range(diagnose.MAX_RANKS)), "y" * diagnose.MAX_MESSAGE) for _ in range(diagnose.MAX_FINDINGS)]
    slow = [SlowWorker(r, 20.0, 1.8, pod=p, node=p) for r, p in enumerate(sorted(pods.triggered)[:diagnose.MAX_SLOW_WORKERS])]
    diagnosis = Diagnosis("z" * diagnose.MAX_MESSAGE, StepTime(10, 11, 20), slow, None, findings)
    status.update(diagnosed_status(status, diagnosis, "s3://" + "b" * 63 + "/" + "prefix/" * 30 + name, 1))
    summary = status["diagnosis"]["summary"]  # the operator's last write (lifecycle's _finish)
    status.update({"phase": "Succeeded", "message": summary[:MAX_MESSAGE], "completionTime": now_iso(),
                   "conditions": set_condition(status["conditions"], "Ready", True, "Analyzed", summary, 1)})
    return status


def test_status_of_a_3000_pod_session_stays_under_32_kib() -> None:
    names = pod_names(PODS)
    pods = PodRecord(frozenset(names[:-100]), frozenset(names[-100:]))
    status = worst_case_status("s" * 253, pods, pod_record.record_name("s" * 253, UID))
    size = len(json.dumps(status).encode())
    assert size < STATUS_BUDGET, f"{size} bytes"
    assert status["pods"] == {"triggered": PODS - 100, "refused": 100, "record": pod_record.record_name("s" * 253, UID)}
    assert len(status["failedWorkers"]) == 20 and status["workers"]["total"] == PODS
    assert status["diagnosis"]["findings"], "the diagnosis keeps what fits"


def test_pod_record_of_3000_pods_through_the_api_server(cluster: Kube) -> None:
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client)
    session = custom.create_namespaced_custom_object("stepscope.io", "v1alpha1", "default", "profilesessions", {
        "apiVersion": "stepscope.io/v1alpha1", "kind": "ProfileSession", "metadata": {"name": "big"},
        "spec": {"selector": {"matchLabels": {"job": "big"}}, "storage": {"uri": "s3://bucket/sessions", "credentialsSecret": "store-credentials"}}})
    uid = session["metadata"]["uid"]
    names = [f"train-{i}" for i in range(PODS)]
    assert pod_record.read("default", "big", uid) is None

    # A first operator process recorded part of the fan-out; a restarted one overwrites the record.
    pod_record.write("default", "big", uid, PodRecord(frozenset(names[:10]), frozenset()))
    complete = PodRecord(frozenset(names[:-3]), frozenset(names[-3:]))
    record = pod_record.write("default", "big", uid, complete)
    assert pod_record.read("default", "big", uid) == complete
    cm = kubernetes.client.CoreV1Api(cluster.api_client).read_namespaced_config_map(record, "default")
    owner = cm.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.uid, owner.controller) == ("ProfileSession", "big", uid, True)

    status = worst_case_status("big", complete, record)
    custom.patch_namespaced_custom_object_status("stepscope.io", "v1alpha1", "default", "profilesessions", "big", {"status": status})
    stored = custom.get_namespaced_custom_object("stepscope.io", "v1alpha1", "default", "profilesessions", "big")["status"]
    assert stored["pods"] == {"triggered": PODS - 3, "refused": 3, "record": record}, "the schema keeps the counts"
    assert len(json.dumps(stored).encode()) < STATUS_BUDGET


def test_pod_record_works_with_exactly_the_charts_operator_rbac(cluster: Kube, helm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.create_namespace(RELEASE_NAMESPACE)
    apply_rbac(cluster.api_client, render(helm, "operator.namespaces={default}"))
    monkeypatch.setenv("KUBECONFIG", str(cluster.service_account_kubeconfig(RELEASE_NAMESPACE, "stepscope-operator")))
    operator_kube.reset()
    try:
        record = PodRecord(frozenset({"train-0"}), frozenset())
        pod_record.write("default", "s", UID, record)
        pod_record.write("default", "s", UID, PodRecord(frozenset({"train-0", "train-1"}), frozenset()))  # the patch path
        assert pod_record.read("default", "s", UID) == PodRecord(frozenset({"train-0", "train-1"}), frozenset())
        with pytest.raises(kubernetes.client.ApiException) as denied:
            operator_kube.core().delete_namespaced_config_map(pod_record.record_name("s", UID), "default")
        assert denied.value.status == 403, "configmaps: get, create and patch only"
    finally:
        operator_kube.reset()


def job_names(n: int, seed: int) -> list[str]:
    """Pod names as a job controller makes them: a run id, the index, a random 5-character suffix."""
    rng = random.Random(seed)
    alphabet = "bcdfghjklmnpqrstvwxz2456789"  # what Kubernetes draws generated name suffixes from
    run = "".join(rng.choices(alphabet, k=5))
    return [f"train-{run}-worker-{i}-{''.join(rng.choices(alphabet, k=5))}" for i in range(n)]


def test_record_over_the_configmap_limit_is_refused_before_the_api_server(cluster: Kube) -> None:
    rng = random.Random(1)
    names = frozenset(f"{rng.getrandbits(128):032x}" for _ in range(70_000))  # gzip cannot shrink these much: 1.2 MB
    with pytest.raises(pod_record.PodRecordTooLarge, match=r"^the names of the 70000 selected pods take [\d,]+ bytes gzipped, more than the "
                                                          r"996,147 a pod record \(a ConfigMap\) holds; narrow spec.selector or split the pods over several ProfileSessions$"):
        pod_record.check_room(names)
    with pytest.raises(pod_record.PodRecordTooLarge, match=r"more than the 1,048,576 a pod record"):
        pod_record.write("default", "huge", UID, PodRecord(names, frozenset()))
    with pytest.raises(kubernetes.client.ApiException) as absent:
        kubernetes.client.CoreV1Api(cluster.api_client).read_namespaced_config_map(pod_record.record_name("huge", UID), "default")
    assert absent.value.status == 404, "nothing half-written"


def test_a_selection_that_passed_the_check_fits_however_the_fanout_splits_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two gzip streams (triggered, refused) of a split take a little more than one of all names;
    # the check before the fan-out leaves room for that. A 128 KiB limit keeps the test quick.
    monkeypatch.setattr(pod_record, "MAX_BYTES", 128 * 1024)
    names = job_names(20_000, 2)

    def fits(n: int) -> bool:
        try:
            pod_record.check_room(frozenset(names[:n]))
        except pod_record.PodRecordTooLarge:
            return False
        return True

    lo, hi = 0, len(names)
    assert not fits(hi)
    while hi - lo > 1:
        lo, hi = ((lo + hi) // 2, hi) if fits((lo + hi) // 2) else (lo, (lo + hi) // 2)
    fitting = names[:lo]
    rng = random.Random(3)
    for share in (0.01, 0.1, 0.5, 0.9, 0.99):
        refused = frozenset(rng.sample(fitting, int(len(fitting) * share)))
        assert pod_record.size(PodRecord(frozenset(fitting) - refused, refused)) <= pod_record.MAX_BYTES, share
