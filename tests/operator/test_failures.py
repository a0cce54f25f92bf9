"""Sessions the operator must end Failed, with a reason that says what to change; no sidecar runs."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import kubernetes
import pytest

from stepscope.local.launch import free_port
from stepscope.operator import metrics
from stepscope.operator.sessions import pod_record
from stepscope.operator.sessions.pod_record import PodRecord
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient, SidecarError
from stepscope.testing.kube.fixtures import Kube
from stepscope.testing.kube.helpers import wait_for
from tests.operator.conftest import CREDENTIALS
from tests.operator.harness import BUCKET, KEY, NAMESPACE, OperatorHarness, Pods, port_of, session_spec, stop_before_capturing


def _condition(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def _events(operator: OperatorHarness, name: str) -> list[str]:
    items = kubernetes.client.CoreV1Api(operator.kube.api_client).list_namespaced_event(NAMESPACE).items
    return [f"{e.reason}: {e.message}" for e in items if e.involved_object.name == name]


def test_selector_without_ready_pods_fails_after_the_grace(operator: OperatorHarness, pods: Pods, s3_endpoint: str) -> None:
    pods.create("no-sidecar", {"job": "train"}, port=None)  # matches, but has no stepscope port
    pods.create("starting", {"job": "train"}, port=7470, running=False)
    operator.create_session("bad-selector", session_spec({"job": "train"}, s3_endpoint))
    status = operator.wait_phase("bad-selector", ("Failed",))
    ready = _condition(status, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "NoPodsSelected"
    assert "selects no Running pod with a stepscope sidecar in namespace default" in ready["message"]
    assert "2 pod(s) match" in ready["message"] and "stepscope.io/inject" in ready["message"]
    assert _condition(status, "Triggered")["status"] == "False"
    assert status["observedGeneration"] == 1 and status["completionTime"]
    assert wait_for(lambda: any("Failed" in e for e in _events(operator, "bad-selector")), 10, "a Failed event")


def test_missing_secret_fails_naming_it(operator: OperatorHarness, pods: Pods, s3_endpoint: str) -> None:
    spec = session_spec({"job": "train"}, s3_endpoint)
    spec["storage"]["credentialsSecret"] = "nope"
    operator.create_session("no-secret", spec)
    status = operator.wait_phase("no-secret", ("Failed",))
    assert status["message"] == "Secret nope not found in namespace default"
    assert _condition(status, "Ready")["reason"] == "SecretNotFound"


def test_unusable_bucket_fails_with_the_store_error(operator: OperatorHarness, pods: Pods, s3_endpoint: str) -> None:
    spec = session_spec({"job": "train"}, s3_endpoint)
    spec["storage"]["uri"] = "s3://no-such-bucket/sessions"
    operator.create_session("bad-store", spec)
    status = operator.wait_phase("bad-store", ("Failed",))
    assert _condition(status, "Ready")["reason"] == "StorageUnreachable"
    assert "s3://no-such-bucket/sessions is not usable" in status["message"] and "does not exist" in status["message"]
    assert "testing-secret" not in str(status) and "testing-key-id" not in str(status)


def test_finished_session_is_deleted_after_its_ttl(operator: OperatorHarness, s3_endpoint: str) -> None:
    operator.create_session("short-lived", session_spec({"job": "none"}, s3_endpoint, ttlSecondsAfterFinished=1))
    assert operator.wait_phase("short-lived", ("Failed",))["phase"] == "Failed"
    wait_for(lambda: operator.gone("short-lived"), 15, "the TTL to delete the session")


def test_capture_that_never_ends_times_out_keeping_what_was_captured(operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str) -> None:
    pods.create("idle", {"job": "idle"}, port=port_of(idle))
    operator.create_session("too-slow", session_spec({"job": "idle"}, s3_endpoint, timeoutSeconds=3, hangTimeoutSeconds=2))
    status = operator.wait_phase("too-slow", ("Failed",), timeout=20)
    assert _condition(status, "Ready")["reason"] == "Timeout"
    assert status["message"].startswith("capture did not finish within spec.timeoutSeconds=3s; 0 of 1 worker(s) uploaded, kept in s3://")
    assert status["pods"]["triggered"] == 1


def test_a_sidecar_timing_out_before_the_operator_looks_is_still_the_sessions_timeout(
        cluster: Kube, pods: Pods, idle: Sidecar, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar runs the same spec.timeoutSeconds; when it reports its workers failed by it
    before the operator's own check comes round, the session still fails as Timeout."""
    monkeypatch.setenv("STEPSCOPE_POLL_INTERVAL_S", "2.5")  # the operator looks after the sidecar gave up
    operator = OperatorHarness(cluster)
    operator.start()
    try:
        pods.create("idle", {"job": "idle"}, port=port_of(idle))
        operator.create_session("raced", session_spec({"job": "idle"}, s3_endpoint, timeoutSeconds=3, hangTimeoutSeconds=2))
        status = operator.wait_phase("raced", ("Failed",), timeout=30)
    finally:
        operator.stop()
    assert _condition(status, "Ready")["reason"] == "Timeout", status["message"]
    assert status["message"].startswith("capture did not finish within spec.timeoutSeconds=3s; 0 of 1 worker(s) uploaded")


def test_selection_too_large_for_the_pod_record_fails_before_any_trigger(operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_record, "MAX_BYTES", 64)  # three names fill it here, as ~300,000 fill the real 1 MiB
    for i in range(3):
        pods.create(f"idle-{i}", {"job": "many"}, port=port_of(idle))
    triggers = metrics.value("stepscope_sidecar_triggers_total")
    uid = operator.create_session("too-many", session_spec({"job": "many"}, s3_endpoint))["metadata"]["uid"]
    status = operator.wait_phase("too-many", ("Failed", "Capturing"))
    assert status["phase"] == "Failed", status
    ready = _condition(status, "Ready")
    assert ready["reason"] == "PodRecordTooLarge" and _condition(status, "Triggered")["status"] == "False"
    assert re.fullmatch(r"the names of the 3 selected pods take \d+ bytes gzipped, more than the 60 a pod record \(a ConfigMap\) holds; "
                        r"narrow spec.selector or split the pods over several ProfileSessions; no sidecar was triggered", status["message"]), status["message"]
    assert metrics.value("stepscope_sidecar_triggers_total") == triggers
    with pytest.raises(SidecarError) as unknown:
        SidecarClient(idle.url, KEY).get_session(uid)
    assert unknown.value.status == 404, "the sidecar never saw the session"
    assert pod_record.read(NAMESPACE, "too-many", uid) is None


def test_record_that_outgrows_the_check_in_the_fanout_fails_and_cancels_what_was_triggered(
        operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two names sharing a long part: one gzip stream of both is smaller than two of one each.
    accepted, refused = "w-" + "x" * 100 + "-0", "w-" + "x" * 100 + "-1"
    together = pod_record.size(PodRecord(frozenset({accepted, refused}), frozenset()))
    assert pod_record.size(PodRecord(frozenset({accepted}), frozenset({refused}))) > together
    monkeypatch.setattr(pod_record, "SPLIT_HEADROOM", 0.0)
    monkeypatch.setattr(pod_record, "MAX_BYTES", together)
    pods.create(accepted, {"job": "split"}, port=port_of(idle))
    pods.create(refused, {"job": "split"}, port=free_port())  # nothing listens there: the trigger is refused
    uid = operator.create_session("outgrown", session_spec({"job": "split"}, s3_endpoint))["metadata"]["uid"]
    status = operator.wait_phase("outgrown", ("Failed", "Capturing"))
    assert status["phase"] == "Failed", status
    assert _condition(status, "Ready")["reason"] == "PodRecordTooLarge"
    assert status["message"].startswith("the names of the 2 selected pods take ") and status["message"].endswith("; the 1 triggered sidecar(s) are cancelled")
    wait_for(lambda: SidecarClient(idle.url, KEY).get_session(uid)["phase"] == "Cancelled", 10, "the sidecar to cancel")
    assert pod_record.read(NAMESPACE, "outgrown", uid) is None


def test_session_a_restarted_operator_fails_in_pending_is_cancelled_on_the_sidecars_its_record_lists(
        operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    restore = stop_before_capturing(monkeypatch)
    pods.create("idle", {"job": "idle"}, port=port_of(idle))
    uid = operator.create_session("orphaned", session_spec({"job": "idle"}, s3_endpoint))["metadata"]["uid"]
    wait_for(lambda: pod_record.read(NAMESPACE, "orphaned", uid), 30, "the pod record")
    operator.stop()
    assert operator.status("orphaned")["phase"] == "Pending" and SidecarClient(idle.url, KEY).get_session(uid)["phase"] == "Pending"
    restore()
    kubernetes.client.CoreV1Api(operator.kube.api_client).delete_namespaced_secret("s3-credentials", NAMESPACE)

    operator.start()
    status = operator.wait_phase("orphaned", ("Failed", "Capturing"))
    assert (status["phase"], _condition(status, "Ready")["reason"]) == ("Failed", "SecretNotFound")
    wait_for(lambda: SidecarClient(idle.url, KEY).get_session(uid)["phase"] == "Cancelled", 10, "the sidecar to cancel")


def test_secret_with_other_binary_data_still_gives_its_credentials(cluster: Kube) -> None:
    from stepscope.operator import credentials

    kubernetes.client.CoreV1Api(cluster.api_client).create_namespaced_secret(NAMESPACE, {"metadata": {"name": "mixed"}, "data": {
        "AWS_ACCESS_KEY_ID": "QUtJRA==", "AWS_SECRET_ACCESS_KEY": "U0VDUkVU", "ca.der": "MIIB/w=="}})  # AKID, SECRET, DER bytes
    assert credentials.from_secret(NAMESPACE, "mixed") == {"accessKeyId": "AKID", "secretAccessKey": "SECRET", "sessionToken": None}
    kubernetes.client.CoreV1Api(cluster.api_client).create_namespaced_secret(NAMESPACE, {"metadata": {"name": "binary-key"}, "data": {
        "accessKeyId": "QUtJRA==", "secretAccessKey": "/w=="}})
    with pytest.raises(credentials.CredentialsError, match="^Secret binary-key in namespace default: key secretAccessKey is not UTF-8 text$"):
        credentials.from_secret(NAMESPACE, "binary-key")


def test_invalid_selector_fails_at_once_naming_the_label(operator: OperatorHarness, s3_endpoint: str) -> None:
    """`a b` passes the schema (matchLabels keys cannot be checked there) but the API server
    answers 400 to a pod list with it: the session says so instead of retrying for ever."""
    operator.create_session("bad-label", session_spec({"a b": "x"}, s3_endpoint))
    status = operator.wait_phase("bad-label", ("Failed",), timeout=15)
    assert _condition(status, "Ready")["reason"] == "InvalidSpec"
    assert status["message"].startswith("spec.selector.matchLabels: label key 'a b' must be at most 63 characters")


def test_no_registered_training_process_fails_the_pod_after_the_registration_timeout(
        operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str) -> None:
    pods.create("idle", {"job": "idle"}, port=port_of(idle))
    operator.create_session("no-training", session_spec({"job": "idle"}, s3_endpoint, registrationTimeoutSeconds=4))
    operator.wait_phase("no-training", ("Capturing",))
    waiting = wait_for(lambda: (s := operator.status("no-training"))["message"].startswith("waiting") and s, 4, "the waiting message")
    assert waiting["message"] == ("waiting for the training processes of 1 pod(s) to register with their sidecar (first: idle); "
                                  "a pod without any fails after spec.registrationTimeoutSeconds=4s")
    status = operator.wait_phase("no-training", ("Failed",), timeout=20)
    assert _condition(status, "Ready")["reason"] == "NoTrainingProcess"
    assert status["message"] == ("pod idle: no training process registered with the sidecar within 4s: is PYTHONPATH set to the "
                                 'bootstrap dir? does the pod carry the label stepscope.io/inject="true"?')
    assert status["failedWorkers"] == [{"pod": "idle", "reason": status["message"].removeprefix("pod idle: ")}]
    # cancelled on the sidecar, which ends the session there rather than at spec.timeoutSeconds
    assert wait_for(lambda: (idle.manager.get(operator.get("no-training")["metadata"]["uid"]) or {}).get("phase") == "Cancelled", 10, "the sidecar's cancel")


def test_a_secret_created_just_after_the_session_is_waited_for(operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str) -> None:
    """`kubectl apply` of a file with the session before its Secret: the operator retries the
    read within the selection grace instead of failing at once (without the retry, 1 apply in 5 failed)."""
    pods.create("idle", {"job": "idle"}, port=port_of(idle))
    spec = session_spec({"job": "idle"}, s3_endpoint, registrationTimeoutSeconds=1)
    spec["storage"]["credentialsSecret"] = "late"
    operator.create_session("late-secret", spec)
    core = kubernetes.client.CoreV1Api(operator.kube.api_client)
    secret = core.read_namespaced_secret("s3-credentials", NAMESPACE)
    time.sleep(0.5)
    core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "late"}, "data": secret.data})
    status = operator.wait_phase("late-secret", ("Failed",), timeout=20)
    assert _condition(status, "Ready")["reason"] == "NoTrainingProcess"  # it got as far as the sidecar
    assert _condition(status, "Triggered")["status"] == "True"


def test_a_finished_sessions_ttl_can_be_extended(operator: OperatorHarness, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ttlSecondsAfterFinished is the one spec field that may change after the trigger:
    the operator reads it again before deleting."""
    from stepscope.operator.sessions import lifecycle
    monkeypatch.setattr(lifecycle, "TTL_RECHECK_S", 0.5)
    operator.create_session("extended", session_spec({"job": "none"}, s3_endpoint, ttlSecondsAfterFinished=3))
    operator.wait_phase("extended", ("Failed",))
    operator.custom.patch_namespaced_custom_object("stepscope.io", "v1alpha1", NAMESPACE, "profilesessions", "extended", {"spec": {"ttlSecondsAfterFinished": 3600}})
    time.sleep(5)
    assert not operator.gone("extended")
    operator.custom.patch_namespaced_custom_object("stepscope.io", "v1alpha1", NAMESPACE, "profilesessions", "extended", {"spec": {"ttlSecondsAfterFinished": 0}})
    wait_for(lambda: operator.gone("extended"), 10, "the shortened TTL to delete the session")


def test_an_analysis_job_that_cannot_create_its_pod_fails_the_session_with_the_reason(
        cluster: Kube, pods: Pods, sidecar_a: Sidecar, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Job controller cannot create the analysis pod (here a quota; Pod Security, a missing
    ServiceAccount alike): it says so only in FailedCreate events, and the session fails with that
    reason once the grace has passed, not at spec.timeoutSeconds."""
    monkeypatch.setenv("STEPSCOPE_ANALYSIS_START_GRACE_S", "1")
    operator = OperatorHarness(cluster)
    operator.start()
    try:
        pods.create("train-a", {"job": "train"}, port=port_of(sidecar_a))
        operator.create_session("no-room", session_spec({"job": "train"}, s3_endpoint))
        job = operator.wait_phase("no-room", ("Analyzing", "Failed"), timeout=60)["analysisJob"]
        reason = 'Error creating: pods "no-room-analysis-x" is forbidden: exceeded quota: compute, requested: requests.cpu=2, limited: requests.cpu=1'
        kubernetes.client.CoreV1Api(cluster.api_client).create_namespaced_event(NAMESPACE, {
            "metadata": {"name": f"{job}.failedcreate"}, "type": "Warning", "reason": "FailedCreate", "message": reason,
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": job, "namespace": NAMESPACE},
            "source": {"component": "job-controller"}})
        status = operator.wait_phase("no-room", ("Failed", "Succeeded"), timeout=20)
    finally:
        operator.stop()
    assert _condition(status, "Ready")["reason"] == "AnalysisNotStarted"
    assert status["message"].startswith(f"analysis Job {job} could not create its pod for 1s: {reason}; captures are kept in s3://")


def test_a_given_up_pod_is_cancelled_on_its_sidecar_while_the_others_capture(
        operator: OperatorHarness, pods: Pods, idle: Sidecar, s3_endpoint: str, tmp_path: Path) -> None:
    """The cancel of a pod whose training never registered goes out signed with the namespace's
    key (its sidecar refuses any other), so that sidecar is free for the next ProfileSession at once."""
    from tests.sidecar.conftest import SimulatedRanks

    registered = Sidecar(tmp_path / "busy", KEY, host="127.0.0.1", port=0, pod="busy", poll_interval_s=0.2).start()
    ranks = SimulatedRanks(tmp_path / "busy", 1)  # registers and never captures: the session stays Capturing
    try:
        pods.create("idle", {"job": "mixed"}, port=port_of(idle))
        pods.create("busy", {"job": "mixed"}, port=port_of(registered))
        operator.create_session("mixed", session_spec({"job": "mixed"}, s3_endpoint, registrationTimeoutSeconds=2, timeoutSeconds=120))
        operator.wait_phase("mixed", ("Capturing",))
        uid = operator.get("mixed")["metadata"]["uid"]
        wait_for(lambda: (idle.manager.get(uid) or {}).get("phase") == "Cancelled", 15, "the given-up pod's cancel")
        assert operator.status("mixed")["phase"] == "Capturing"
        assert (registered.manager.get(uid) or {}).get("phase") != "Cancelled"
    finally:
        ranks.close()
        registered.shutdown(1)


def test_the_analysis_job_writes_its_result_to_the_store_never_the_status(cluster: Kube, s3_endpoint: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator alone writes a session's status: the analysis Job only reads the session and
    leaves its result, here a failure with its reason, in the session's store folder."""
    import boto3

    from stepscope.contracts.layout import REPORT_RESULT, session_prefix
    from stepscope.operator.sessions.analysis_job import run_session_analysis
    from stepscope.operator.settings import GROUP, PLURAL, VERSION

    custom = kubernetes.client.CustomObjectsApi(cluster.api_client)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileSession", "metadata": {"name": "nothing-captured"},
            "spec": session_spec({"job": "none"}, s3_endpoint)}
    created = custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["accessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS["secretAccessKey"])
    assert run_session_analysis(NAMESPACE, "nothing-captured") == 1  # nothing to analyse there: the failure is the result
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id=CREDENTIALS["accessKeyId"],
                      aws_secret_access_key=CREDENTIALS["secretAccessKey"])
    key = f"sessions/{session_prefix(NAMESPACE, 'nothing-captured', created['metadata']['uid'])}/{REPORT_RESULT}"
    result = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    assert result["analyzed"] is False and result["reason"] == "AnalysisFailed"
    assert result["message"].startswith("analysis failed: AnalysisError: nothing to analyse at s3://"), result
    assert [m for m, p in cluster.server.requests() if p.split("?")[0].endswith("/profilesessions/nothing-captured")] == ["GET"]
    assert "status" not in custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "nothing-captured")


def _crd_before_storage_rules(kube: Kube) -> None:
    """The ProfileSession CRD as it was before it required credentialsSecret and refused file://
    (a cluster that has not upgraded its CRDs yet): the operator must refuse such sessions itself."""
    api = kubernetes.client.ApiextensionsV1Api(kube.api_client)
    crd = api.read_custom_resource_definition("profilesessions.stepscope.io").to_dict()
    storage = crd["spec"]["versions"][0]["schema"]["open_apiv3_schema"]["properties"]["spec"]["properties"]["storage"]
    storage["x_kubernetes_validations"] = []
    api.replace_custom_resource_definition("profilesessions.stepscope.io", kube.api_client.sanitize_for_serialization(
        kubernetes.client.V1CustomResourceDefinition(**{k: crd[k] for k in ("api_version", "kind", "metadata", "spec")})))


@pytest.mark.parametrize("storage, said", [
    ({"uri": "file:///var/lib/stepscope"}, "spec.storage.uri must be s3://bucket/prefix or oss://bucket/prefix on the cluster, got "
                                           "'file:///var/lib/stepscope'; file:// is for the local CLI only"),
    ({"uri": "s3://bucket/sessions"}, "spec.storage.credentialsSecret is required on the cluster: name a Secret in the session's "
                                      "namespace with accessKeyId and secretAccessKey; the operator's, nodes' and pods' own cloud "
                                      "identities are never used"),
], ids=["file-uri", "no-secret"])
def test_storage_the_cluster_must_not_use_fails_naming_what_to_change(operator: OperatorHarness, s3_endpoint: str,
                                                                       storage: dict, said: str) -> None:
    _crd_before_storage_rules(operator.kube)
    operator.create_session("ambient", session_spec({"job": "train"}, s3_endpoint, storage={**storage, "endpoint": s3_endpoint}))
    status = operator.wait_phase("ambient", ("Failed",), timeout=15)
    assert _condition(status, "Ready")["reason"] == "InvalidSpec"
    assert status["message"] == said
    assert _condition(status, "Triggered")["status"] == "False"
