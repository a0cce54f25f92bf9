"""Whole sessions through the real operator, real sidecars and a real 2-rank gloo training, with
moto's S3 server as the store. The tests share one training and its sidecar (a sidecar runs one
session at a time), so each leaves its session finished."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import kubernetes
import pytest

from stepscope.cli import main
from stepscope.contracts import layout
from stepscope.operator import metrics
from stepscope.operator.sessions import cancellation, fanout
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient
from stepscope.testing.kube.helpers import wait_for
from tests.operator.conftest import CREDENTIALS
from tests.operator.harness import BUCKET, KEY, NAMESPACE, OperatorHarness, Pods, port_of, session_spec

SELECTOR = {"job": "ddp"}


def s3_objects(endpoint: str, prefix: str) -> dict[str, bytes]:
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["accessKeyId"],
        aws_secret_access_key=CREDENTIALS["secretAccessKey"],
    )
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents") or []
    return {o["Key"][len(prefix) :]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def store_prefix(session: dict) -> str:
    meta = session["metadata"]
    return f"sessions/{layout.session_prefix(NAMESPACE, meta['name'], meta['uid'])}/"


def triggered_pods(operator: OperatorHarness, status: dict) -> list[str]:
    """The names in the session's pod record (a ConfigMap), checked against the counts in status."""
    record = kubernetes.client.CoreV1Api(operator.kube.api_client).read_namespaced_config_map(
        status["pods"]["record"], NAMESPACE
    )
    names = gzip.decompress(base64.b64decode(record.binary_data["triggered.gz"])).decode().split("\n")
    assert status["pods"]["triggered"] == len(names)
    return names


def session_events(operator: OperatorHarness, name: str) -> list[tuple[str, str]]:
    items = kubernetes.client.CoreV1Api(operator.kube.api_client).list_namespaced_event(NAMESPACE).items
    return [(e.reason, e.message) for e in items if e.involved_object.name == name]


@pytest.fixture
def sidecar_b(tmp_path: Path) -> Iterator[Sidecar]:
    """A second pod's sidecar whose training never started (so it would wait until the timeout)."""
    sidecar = Sidecar(tmp_path / "pod-b", KEY, host="127.0.0.1", port=0, pod="train-b", poll_interval_s=0.2).start()
    yield sidecar
    sidecar.shutdown(grace_s=1)


def test_session_captures_analyses_and_succeeds(
    operator: OperatorHarness,
    pods: Pods,
    sidecar_a: Sidecar,
    s3_endpoint: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pods.create("train-a", SELECTOR, port=port_of(sidecar_a))
    pods.create("unrelated", {"job": "other"}, port=port_of(sidecar_a))
    created = operator.create_session("happy", session_spec(SELECTOR, s3_endpoint))
    status = operator.wait_phase("happy", ("Analyzing", "Failed"), timeout=60)
    assert status["phase"] == "Analyzing", status
    assert triggered_pods(operator, status) == ["train-a"] and status["pods"]["refused"] == 0
    assert status["workers"] == {"total": 2, "triggered": 2, "capturing": 0, "captured": 2, "uploaded": 2, "failed": 0}
    assert status["workersReady"] == "2/2" and status["failedWorkers"] == []

    code, job = operator.run_analysis_job("happy")
    assert code == 0
    owner = job["metadata"]["owner_references"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("ProfileSession", created["metadata"]["uid"], True)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "stepscope",
        "analyze",
        "--session",
        "default/happy",
    ]
    # The chart's analysis account: the operator makes no identity of its own.
    assert job["spec"]["template"]["spec"]["service_account_name"] == "stepscope-analysis"
    assert (
        kubernetes.client.RbacAuthorizationV1Api(operator.kube.api_client).list_namespaced_role(NAMESPACE).items == []
    )
    assert kubernetes.client.CoreV1Api(operator.kube.api_client).list_namespaced_service_account(NAMESPACE).items == []

    status = operator.wait_phase("happy", ("Succeeded", "Failed"))
    assert status["phase"] == "Succeeded", status
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Triggered": "True",
        "Captured": "True",
        "Analyzed": "True",
        "Ready": "True",
    }
    assert all(c["observedGeneration"] == 1 and c["lastTransitionTime"] for c in status["conditions"])
    assert status["diagnosis"]["summary"] and status["diagnosis"]["stepTimeMs"]["median"] > 0
    assert len(json.dumps(status)) < 32 * 1024
    prefix = store_prefix(created)
    assert status["artifacts"]["report"] == f"s3://{BUCKET}/{prefix}report/index.html"
    objects = s3_objects(s3_endpoint, prefix)
    assert {
        "session.json",
        "ranks/rank-0.summary.arrow",
        "ranks/rank-1.summary.arrow",
        "report/index.html",
        "report/diagnosis.json",
    } <= set(objects)
    record = json.loads(objects["session.json"])
    assert [t["phase"] for t in record["timeline"]] == ["Pending", "Capturing", "Analyzing", "Succeeded"]
    assert record["spec"]["capture"]["steps"] == 2 and "credentials" not in record
    assert CREDENTIALS["secretAccessKey"].encode() not in objects["session.json"]

    capsys.readouterr()
    assert main(["report", "happy", "-o", str(tmp_path / "report")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(status["diagnosis"]["summary"])
    assert (tmp_path / "report" / "index.html").read_bytes() == objects["report/index.html"]
    assert json.loads((tmp_path / "report" / "diagnosis.json").read_text()) == json.loads(
        objects["report/diagnosis.json"]
    )
    assert main(["get"]) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "PHASE", "WORKERS", "SLOWEST", "RANK", "SUMMARY", "AGE"]
    assert line.split()[:3] == ["happy", "Succeeded", "2/2"]

    events = wait_for(
        lambda: (e := session_events(operator, "happy")) and len(e) >= 4 and e, 10, "the transition events"
    )
    assert {"Created", "Triggered", "Captured", "Analyzed"} <= {reason for reason, _ in events}
    assert not any(
        CREDENTIALS["secretAccessKey"] in message or CREDENTIALS["accessKeyId"] in message for _, message in events
    )

    # Its pod record outlives the end: deleting the session must not cancel it all over again.
    cancels: list[tuple[Any, ...]] = []
    monkeypatch.setattr(cancellation, "cancel", lambda *args, **kwargs: cancels.append(args) or [])
    operator.delete("happy")
    wait_for(lambda: operator.gone("happy"), 30, "the finalizer to be released")
    assert cancels == []


def test_operator_restart_mid_capture_resumes_without_a_second_trigger(
    operator: OperatorHarness,
    pods: Pods,
    sidecar_a: Sidecar,
    training: Path,
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bodies: list[dict[str, Any]] = []
    trigger = fanout.trigger
    monkeypatch.setattr(
        fanout,
        "trigger",
        lambda targets, request, *args, **kwargs: (
            bodies.append(request.to_dict()) or trigger(targets, request, *args, **kwargs)
        ),
    )
    pods.create("train-a", SELECTOR, port=port_of(sidecar_a))
    spec = session_spec(SELECTOR, s3_endpoint, analysis={"enabled": False})
    spec["capture"]["waitSteps"] = 60  # a few seconds of capture for the restart to land in
    operator.create_session("restart", spec)
    operator.wait_phase("restart", ("Capturing",), timeout=30)
    request = training / "request.json"
    issued = json.loads(request.read_text())["issuedAt"]
    # The start step the operator read from the pods' telemetry reached the ranks: 60 steps after the furthest one.
    assert bodies[0]["startStep"] >= 60 and json.loads(request.read_text())["startStep"] == bodies[0]["startStep"]
    triggers = metrics.value("stepscope_sidecar_triggers_total")
    operator.stop()
    assert operator.status("restart")["phase"] == "Capturing", "the restart must land mid-capture"

    operator.start()
    status = operator.wait_phase("restart", ("Succeeded", "Failed"), timeout=60)
    assert status["phase"] == "Succeeded", status
    assert metrics.value("stepscope_sidecar_triggers_total") == triggers, (
        "a sidecar was triggered again after the restart"
    )
    assert json.loads(request.read_text())["issuedAt"] == issued
    assert triggered_pods(operator, status) == ["train-a"] and status["workers"]["uploaded"] == 2
    assert status["message"].endswith("analysis disabled")


def test_pod_deleted_mid_capture_is_a_failed_worker(
    operator: OperatorHarness, pods: Pods, sidecar_a: Sidecar, sidecar_b: Sidecar, s3_endpoint: str
) -> None:
    pods.create("train-a", SELECTOR, port=port_of(sidecar_a))
    pods.create("train-b", SELECTOR, port=port_of(sidecar_b))
    spec = session_spec(SELECTOR, s3_endpoint, analysis={"enabled": False})
    spec["capture"]["waitSteps"] = 20
    operator.create_session("lost-pod", spec)
    status = operator.wait_phase("lost-pod", ("Capturing",), timeout=30)
    assert triggered_pods(operator, status) == ["train-a", "train-b"]
    pods.delete("train-b")
    status = operator.wait_phase("lost-pod", ("Succeeded", "Failed"), timeout=60)
    assert status["phase"] == "Succeeded", status
    assert status["failedWorkers"] == [{"pod": "train-b", "reason": "pod deleted during capture"}]
    assert status["workers"]["uploaded"] == 2 and status["workers"]["failed"] == 1 and status["workersReady"] == "2/3"


def test_failed_analysis_fails_the_session_with_its_reason(
    operator: OperatorHarness, pods: Pods, sidecar_a: Sidecar, s3_endpoint: str
) -> None:
    pods.create("train-a", SELECTOR, port=port_of(sidecar_a))
    created = operator.create_session("unanalysable", session_spec(SELECTOR, s3_endpoint, saveRawTrace="none"))
    operator.wait_phase("unanalysable", ("Analyzing",), timeout=60)
    operator.stop()  # a restart while the Job runs resumes following it, without a second Job
    operator.start()
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["accessKeyId"],
        aws_secret_access_key=CREDENTIALS["secretAccessKey"],
    )
    for key in s3_objects(s3_endpoint, store_prefix(created)):
        if key.startswith("ranks/"):
            s3.delete_object(
                Bucket=BUCKET, Key=store_prefix(created) + key
            )  # the captures are lost before the Job runs
    code, _ = operator.run_analysis_job("unanalysable")
    assert code == 1
    assert len(operator.batch.list_namespaced_job(NAMESPACE).items) == 1
    status = operator.wait_phase("unanalysable", ("Succeeded", "Failed"))
    assert status["phase"] == "Failed"
    assert status["message"].startswith("analysis failed: AnalysisError: nothing to analyse at s3://"), status[
        "message"
    ]
    assert {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]} == {
        "Triggered": ("True", "Triggered"),
        "Captured": ("True", "Captured"),
        "Analyzed": ("False", "AnalysisFailed"),
        "Ready": ("False", "AnalysisFailed"),
    }


def test_deleting_a_session_cancels_it_on_the_sidecar(
    operator: OperatorHarness, pods: Pods, sidecar_a: Sidecar, training: Path, s3_endpoint: str
) -> None:
    pods.create("train-a", SELECTOR, port=port_of(sidecar_a))
    spec = session_spec(SELECTOR, s3_endpoint)
    spec["capture"]["waitSteps"] = 400
    created = operator.create_session("cancelled", spec)
    operator.wait_phase("cancelled", ("Capturing",), timeout=30)
    operator.delete("cancelled")
    wait_for(lambda: operator.gone("cancelled"), 30, "the finalizer to be released")
    uid = created["metadata"]["uid"]
    assert {"session": uid, "action": "cancel"}.items() <= json.loads((training / "request.json").read_text()).items()
    answer = wait_for(
        lambda: (a := SidecarClient(sidecar_a.url, KEY).get_session(uid))["phase"] == "Cancelled" and a,
        20,
        "the sidecar to cancel",
    )
    assert answer["session"] == uid
