"""The operator's pure pieces: label selectors, worker aggregation, conditions, the compact
diagnosis, the analysis Job's manifest and outcome, the kubectl-like table."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from stepscope.analysis.model import Diagnosis, Finding, SlowWorker, StepTime
from stepscope.contracts.session import SpecError
from stepscope.operator import kube
from stepscope.operator.sessions import jobs
from stepscope.operator.sessions.report_command import age, format_table, missing_report_reason, row
from stepscope.operator.sessions.selection import label_selector
from stepscope.operator.sessions.status import MAX_DIAGNOSIS_BYTES, MAX_FAILED_WORKERS, PodProgress, StatusWriter, aggregate, compact_diagnosis, set_condition
from stepscope.operator.settings import OperatorSettings
from stepscope.testing.kube import pod_security


def test_label_selector_takes_every_valid_label() -> None:
    selector = {"matchLabels": {"stepscope.io/inject": "true", "app.kubernetes.io/name": "", "A_b.c-9": "Z_9.x-y"}}
    assert label_selector(selector) == "A_b.c-9=Z_9.x-y,app.kubernetes.io/name=,stepscope.io/inject=true"


def test_label_selector_translates_every_operator() -> None:
    selector = {"matchLabels": {"b": "2", "a": "1"}, "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["x", "y"]}, {"key": "env", "operator": "NotIn", "values": ["dev"]},
        {"key": "gpu", "operator": "Exists"}, {"key": "spot", "operator": "DoesNotExist"}]}
    assert label_selector(selector) == "a=1,b=2,tier in (x,y),env notin (dev),gpu,!spot"


@pytest.mark.parametrize("selector, message", [
    ({}, "spec.selector is empty"),
    ({"matchExpressions": [{"key": "k", "operator": "Near"}]}, "unknown operator 'Near'"),
    ({"matchExpressions": [{"key": "k", "operator": "In", "values": []}]}, "needs values"),
    # What the API server answers 400 to (apimachinery's IsQualifiedName / IsValidLabelValue):
    ({"matchLabels": {"a b": "x"}}, r"spec.selector.matchLabels: label key 'a b' must be at most 63"),
    ({"matchLabels": {"-a": "x"}}, "label key '-a' must be"),
    ({"matchLabels": {"x" * 64: "x"}}, "must be at most 63"),
    ({"matchLabels": {"Example.com/a": "x"}}, "invalid prefix"),
    ({"matchLabels": {"a/b/c": "x"}}, "invalid prefix"),
    ({"matchLabels": {"/a": "x"}}, "invalid prefix"),
    ({"matchLabels": {"app": "x y"}}, "label value 'x y' of 'app'"),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["ok", "not ok"]}]}, r"matchExpressions\[0\]: label value 'not ok'"),
])
def test_label_selector_refuses_what_would_select_wrongly(selector: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        label_selector(selector)


def _answer(phase: str, ranks: list[dict], **workers: int) -> dict:
    return {"phase": phase, "ranks": ranks, "workers": {"total": len(ranks), "triggered": len(ranks), **workers}}


def test_aggregate_sums_sidecars_and_counts_lost_pods() -> None:
    progress = {
        "a": PodProgress(_answer("Succeeded", [{"rank": 0, "state": "done"}, {"rank": 1, "state": "done"}], captured=2, uploaded=2)),
        "b": PodProgress(_answer("Failed", [{"rank": 2, "state": "hung", "error": None}, {"rank": 3, "state": "done"}], captured=1, uploaded=1, failed=1)),
        "c": PodProgress(_answer("Capturing", [{"rank": 4, "state": "capturing"}], capturing=1), lost="pod deleted during capture"),
        "d": PodProgress(lost="trigger refused by the sidecar"),
    }
    result = aggregate(progress)
    assert result.workers == {"total": 6, "triggered": 5, "capturing": 0, "captured": 3, "uploaded": 3, "failed": 3}
    assert result.failed_workers == [{"pod": "b", "rank": 2, "reason": "hung"}, {"pod": "c", "rank": 4, "reason": "pod deleted during capture"},
                                     {"pod": "d", "reason": "trigger refused by the sidecar"}]
    assert result.done and result.hung == 1  # the lost pod's last word does not count: its stacks may never come


def test_aggregate_waits_for_running_sidecars_and_bounds_failed_workers() -> None:
    progress = {f"p{i:03d}": PodProgress(lost="gone") for i in range(50)}
    progress["live"] = PodProgress(_answer("Capturing", [{"rank": 0, "state": "capturing"}], capturing=1))
    result = aggregate(progress)
    assert len(result.failed_workers) == MAX_FAILED_WORKERS and not result.done


def test_condition_keeps_its_transition_time_until_the_status_flips() -> None:
    first = set_condition([], "Captured", False, "Waiting", "not yet", 1)
    first[0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    same = set_condition(first, "Captured", False, "Waiting", "still not", 2)
    assert same[0]["lastTransitionTime"] == "2020-01-01T00:00:00Z" and same[0]["observedGeneration"] == 2
    flipped = set_condition(same, "Captured", True, "Captured", "done", 2)
    assert flipped[0]["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    ordered = set_condition(set_condition(flipped, "Ready", True, "R", "", 2), "Triggered", True, "T", "", 2)
    assert [c["type"] for c in ordered] == ["Triggered", "Captured", "Ready"]


def test_compact_diagnosis_drops_findings_to_fit() -> None:
    findings = [Finding("warning", "kernel", list(range(64)), "x" * 1000) for _ in range(60)]
    diagnosis = Diagnosis("rank 3 is slow", StepTime(10, 11, 20), [SlowWorker(3, 20.0, 1.8, pod="p3")], None, findings)
    compact = compact_diagnosis(diagnosis)
    assert len(json.dumps(compact)) <= MAX_DIAGNOSIS_BYTES
    assert compact["summary"] == "rank 3 is slow" and compact["slowWorkers"][0]["rank"] == 3
    assert 0 < len(compact["findings"]) < 60


def test_analysis_job_runs_as_the_charts_analysis_account_with_env_credentials() -> None:
    job = jobs.job("ml", "s1", "0123456789abcdef", OperatorSettings(analysis_account="rel-analysis"), "store", {"accessKeyId": "AK", "secretAccessKey": "SK"})
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "rel-analysis"
    assert pod["containers"][0]["env"] == [
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "store", "key": "AK"}}},
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "store", "key": "SK"}}}]
    assert len(jobs.job_name("x" * 200, "0123456789")) <= 63


def _job(conditions: list[tuple[str, str, str]], succeeded: int = 0) -> SimpleNamespace:
    return SimpleNamespace(status=SimpleNamespace(succeeded=succeeded, conditions=[
        SimpleNamespace(type=t, status=s, reason=r, message="m") for t, s, r in conditions]))


def test_job_outcome() -> None:
    assert jobs.job_outcome(_job([])) == ("Running", "")
    assert jobs.job_outcome(_job([("Complete", "True", "")]))[0] == "Succeeded"
    assert jobs.job_outcome(_job([("Failed", "True", "BackoffLimitExceeded")])) == ("Failed", "analysis Job failed: BackoffLimitExceeded m")


def test_get_table_reads_like_kubectl() -> None:
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    obj = {"metadata": {"name": "s", "creationTimestamp": "2026-01-02T01:00:00Z"},
           "status": {"phase": "Succeeded", "workersReady": "4/4", "diagnosis": {"summary": "rank 1 is slow", "slowWorkers": [{"rank": 1}]}}}
    pending = {"metadata": {"name": "new-one", "creationTimestamp": "2026-01-02T03:04:00Z"}}
    table = format_table([row(obj, now), row(pending, now)]).splitlines()
    assert table[0].split() == ["NAME", "PHASE", "WORKERS", "SLOWEST", "RANK", "SUMMARY", "AGE"]
    assert table[1].split() == ["s", "Succeeded", "4/4", "1", "rank", "1", "is", "slow", "2h"]
    assert table[2].split() == ["new-one", "Pending", "-", "-", "5s"]
    assert age("2025-12-30T03:04:05Z", now) == "3d"


@pytest.mark.parametrize("status, expected", [
    ({}, "is Pending; its report comes when it has Succeeded"),
    ({"phase": "Failed", "message": "Secret x not found in namespace y"}, "failed: Secret x not found in namespace y"),
    ({"phase": "Succeeded", "artifacts": {"prefix": "s3://b/p"}}, "has no report (spec.analysis.enabled is false); its captures are in s3://b/p"),
    ({"phase": "Succeeded", "artifacts": {"prefix": "s3://b/p", "report": "s3://b/p/report/index.html"}}, ""),
])
def test_report_says_why_there_is_none(status: dict, expected: str) -> None:
    assert missing_report_reason(status).startswith(expected) and bool(missing_report_reason(status)) == bool(expected)


def test_operator_never_imports_torch() -> None:
    modules = ["sessions.handlers", "injection.webhook", "triggers.daemon", "command", "sessions.report_command", "sessions.analysis_job"]
    code = "import sys\n" + "".join(f"import stepscope.operator.{m}\n" for m in modules) + "print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_status_writer_spaces_writes_by_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fake clock: a write that comes too soon waits out the rest of the interval."""
    clock = [100.0]
    written: list[float] = []

    async def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(kube, "patch_session_status", lambda ns, name, patch: written.append(clock[0]))
    writer = StatusWriter("ns", "s", interval_s=1.0, clock=lambda: clock[0], sleep=sleep)

    async def burst() -> None:
        await writer.write({"phase": "Pending"})
        clock[0] += 0.25
        await writer.write({"phase": "Capturing"})
        await writer.write({"workers": {"total": 1}})
        clock[0] += 5
        await writer.write({"phase": "Succeeded"})
    asyncio.run(burst())
    assert written == [100.0, 101.0, 102.0, 107.0] and writer.writes == 4


def test_the_analysis_pod_passes_pod_security_restricted() -> None:
    """In a namespace that enforces `restricted`, the Job controller can create it."""
    job = jobs.job("ml", "s1", "0123456789abcdef", OperatorSettings(), "store", {"accessKeyId": "AK", "secretAccessKey": "SK"})
    assert pod_security.violations({"spec": job["spec"]["template"]["spec"]}, "restricted") == []


def test_no_key_in_the_reprs_of_what_holds_one() -> None:
    """A repr ends up in logs and tracebacks: the operator's key must never be in one."""
    from stepscope.operator.injection import certs
    from stepscope.operator.sessions.lifecycle import Context
    from stepscope.operator.settings import OperatorSettings
    from stepscope.sidecar_client import SidecarClient
    from stepscope.signing import Verifier

    key = b"operator-master-key-never-shown"
    for holder in (Context(OperatorSettings(), key), SidecarClient("http://10.0.0.5:7470", key), Verifier(key)):
        assert "operator-master-key" not in repr(holder), type(holder).__name__
    serving = certs.generate(["127.0.0.1"])
    assert b"PRIVATE KEY" in serving.key_pem and "PRIVATE" not in repr(serving)
