"""Every transition of a session's life, on the pure function (stepscope.operator.sessions.phases.step):
each row a state and an observation, and the state and actions that must come of them. The shell
around it (lifecycle.SessionRunner) is covered by test_sessions.py and test_failures.py."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from stepscope.operator.sessions import phases
from stepscope.operator.sessions.phases import AnalysisStatus, Captured, Failure, Finish, GiveUp, JobSeen, Listed, ListFailed, Polled, ReadAnalysis, RecordPods, Report, Retry, RunState, Trigger, TriggerAnswers, Wait
from stepscope.operator.sessions.pod_record import PodRecord
from stepscope.operator.sessions.selection import Target
from stepscope.operator.sessions.status import WAITING, PodProgress

T0 = 1_000_000.0
STATE = RunState("Capturing", "ml", "app=train", "s3://b/ml/s", timeout_seconds=600, selection_grace_s=30.0,
                 registration_timeout_s=120.0, analysis_enabled=True, start=T0, triggered=T0 + 5)
POD = Target("train-0", "10.0.0.1", 7470)


def _pod(phase: str, *states: str, uploaded: int = 0) -> PodProgress:
    ranks = [{"rank": i, "state": s} for i, s in enumerate(states)]
    return PodProgress({"phase": phase, "ranks": ranks, "workers": {"total": len(ranks), "triggered": len(ranks), "uploaded": uploaded,
                                                                    "captured": uploaded, "failed": sum(s == "failed" for s in states)}})


def _kinds(actions: list[Any]) -> list[type]:
    return [type(a) for a in actions]


@pytest.mark.parametrize("state, obs, expected", [
    # Pending: a Running pod with a sidecar is triggered at once.
    (replace(STATE, phase="Pending"), Listed(T0 + 1, 1, (POD,), ()), [Trigger((POD,))]),
    # None yet: wait out the selection grace, counted from status.startTime ...
    (replace(STATE, phase="Pending"), Listed(T0 + 29, 0, (), ()), [Wait()]),
    # ... or from now when the status has none yet.
    (replace(STATE, phase="", start=None), Listed(T0 + 999, 0, (), ()), [Wait()]),
])
def test_selection(state: RunState, obs: Listed, expected: list[Any]) -> None:
    assert phases.step(state, obs) == (state, expected)


@pytest.mark.parametrize("matched, uninjected, words", [
    (0, (), "no pod matches; label the training pods"),
    (2, (), "2 pod(s) match but none is Running with a container port named 'stepscope'"),
    (1, ("a", "b", "c", "d"), "not profiled: pod(s) a, b, c and 1 more asked for the sidecar"),
])
def test_no_pod_after_the_grace_fails_saying_what_it_saw(matched: int, uninjected: tuple[str, ...], words: str) -> None:
    state = replace(STATE, phase="Pending")
    _, [action] = phases.step(state, Listed(T0 + 30, matched, (), uninjected))
    assert isinstance(action, Failure) and action.reason == "NoPodsSelected"
    assert action.message.startswith("spec.selector (app=train) selects no Running pod with a stepscope sidecar in namespace ml: ")
    assert words in action.message


@pytest.mark.parametrize("obs, expected", [
    (ListFailed(T0 + 1, 403, "HTTP 403 forbidden"), Failure("PodsUnlistable", "listing pods in namespace ml with spec.selector (app=train) was refused: "
                                                           "HTTP 403 forbidden; the operator's ServiceAccount may not list pods here: add the namespace "
                                                           "to the chart's operator.namespaces (docs/security.md)")),
    (ListFailed(T0 + 1, 422, "HTTP 422 bad"), Failure("PodsUnlistable", "listing pods in namespace ml with spec.selector (app=train) was refused: "
                                                     "HTTP 422 bad; fix spec.selector")),
    (ListFailed(T0 + 1, 500, "HTTP 500 oops"), Retry()),  # kopf retries
    (ListFailed(T0 + 1, None, "connection refused"), Retry()),
    (ListFailed(T0 + 601, 500, "HTTP 500 oops"), Failure("PodsUnlistable", "pods in namespace ml could not be listed within spec.timeoutSeconds: HTTP 500 oops")),
    (ListFailed(T0 + 601, None, "connection refused"), Failure("PodsUnlistable", "pods in namespace ml could not be listed within spec.timeoutSeconds: connection refused")),
])
def test_a_failed_pod_list(obs: ListFailed, expected: Any) -> None:
    assert phases.step(STATE, obs) == (STATE, [expected])


@pytest.mark.parametrize("obs, expected", [
    (TriggerAnswers(frozenset(), frozenset({"a", "b"}), {}, ()), RecordPods(PodRecord(frozenset({"a", "b"}), frozenset()), "2 sidecar(s) triggered", ())),
    # A restarted operator counts the pods an earlier process triggered.
    (TriggerAnswers(frozenset({"a"}), frozenset({"b"}), {"c": "HTTP 409 busy"}, ("d",)),
     RecordPods(PodRecord(frozenset({"a", "b"}), frozenset({"c"})), "2 sidecar(s) triggered, 1 refused; not profiled: pod(s) d asked for the sidecar "
                "(stepscope.io/inject=true) but started without it (see their SidecarNotInjected events); recreate them to profile them",
                ({"pod": "c", "reason": "trigger refused: HTTP 409 busy"},))),
    (TriggerAnswers(frozenset(), frozenset(), {"b": "HTTP 401 bad signature", "a": "x"}, ()),
     Failure("TriggerFailed", "no sidecar accepted the session (2 tried); first error: trigger refused: HTTP 401 bad signature")),
    (TriggerAnswers(frozenset(), frozenset(), {}, ()), Failure("TriggerFailed", "no sidecar accepted the session (0 tried); first error: no sidecar answered")),
])
def test_trigger_answers(obs: TriggerAnswers, expected: Any) -> None:
    assert phases.step(replace(STATE, phase="Pending"), obs)[1] == [expected]


@pytest.mark.parametrize("now, progress, tail", [
    # Still capturing: report and wait; past spec.timeoutSeconds: fail, saying how far it got.
    (T0 + 10, {"a": _pod("Capturing", "capturing")}, [Wait()]),
    (T0 + 601, {"a": _pod("Capturing", "capturing")},
     [Failure("Timeout", "capture did not finish within spec.timeoutSeconds=600s; 0 of 1 worker(s) uploaded, kept in s3://b/ml/s")]),
    # Done with an upload: analyse it.
    (T0 + 10, {"a": _pod("Succeeded", "done", uploaded=1), "b": PodProgress(lost="pod deleted during capture")},
     [Captured("1 of 2 worker(s) captured and uploaded", analyze=True)]),
    # Hung ranks upload their stacks, which are the diagnosis.
    (T0 + 10, {"a": _pod("Succeeded", "hung")}, [Captured("0 of 1 worker(s) captured and uploaded; 1 hung, their Python stacks uploaded", analyze=True)]),
    # Done, nothing uploaded: a capture failure ...
    (T0 + 10, {"a": _pod("Failed", "failed")}, [Failure("CaptureFailed", "no worker uploaded a capture (1 of 1 failed); first: failed")]),
    # ... or the session's timeout, when the sidecars' own timeout ended the workers.
    (T0 + 601, {"a": _pod("Failed", "failed")},
     [Failure("Timeout", "capture did not finish within spec.timeoutSeconds=600s; 0 of 1 worker(s) uploaded, kept in s3://b/ml/s")]),
])
def test_capture_round(now: float, progress: dict[str, PodProgress], tail: list[Any]) -> None:
    state, actions = phases.step(STATE, Polled(now, progress))
    assert state == STATE and _kinds(actions) == [Report] + _kinds(tail) and actions[1:] == tail


def test_a_capture_with_analysis_disabled_says_so_in_its_action() -> None:
    _, actions = phases.step(replace(STATE, analysis_enabled=False), Polled(T0 + 10, {"a": _pod("Succeeded", "done", uploaded=1)}))
    assert actions[-1] == Captured("1 of 1 worker(s) captured and uploaded", analyze=False)


def test_pods_without_registered_training_are_given_up_after_the_registration_timeout() -> None:
    """Counted from the Triggered condition; the state remembers them for the final message."""
    progress = {"a": _pod("Capturing"), "b": _pod("Capturing", "capturing")}  # a: sidecar answers, no rank registered
    state, actions = phases.step(STATE, Polled(T0 + 5 + 119, progress))
    assert _kinds(actions) == [Report, Wait] and actions[0].waiting.startswith(f"{WAITING} 1 pod(s)")
    state, actions = phases.step(STATE, Polled(T0 + 5 + 120, progress))
    reason = actions[0].reason
    assert actions[0] == GiveUp(("a",), reason) and "no training process registered with the sidecar within 120s" in reason
    assert state.unregistered == ("a",) and progress["a"].lost == ""  # the observation is not changed
    assert actions[1].waiting is None and actions[1].failed_workers == [{"pod": "a", "reason": reason}] and actions[2] == Wait()
    # Every pod given up, nothing uploaded: the session fails naming the first.
    progress["b"] = _pod("Capturing")
    state, actions = phases.step(replace(STATE, unregistered=("z",)), Polled(T0 + 5 + 120, progress))
    assert state.unregistered == ("z", "a", "b")
    assert actions[-1] == Failure("NoTrainingProcess", f"pod z (and 2 more pod(s)): {reason}")


@pytest.mark.parametrize("state, obs, expected", [
    (STATE, JobSeen(T0 + 10, "job-1", "Running", ""), Wait()),
    (STATE, JobSeen(T0 + 601, "job-1", "Running", ""), Failure("Timeout", "analysis did not finish within spec.timeoutSeconds; captures are kept in s3://b/ml/s")),
    (STATE, JobSeen(T0 + 601, "job-1", "Succeeded", "done"), ReadAnalysis("Succeeded", "done")),
    (STATE, JobSeen(T0 + 10, "job-1", "Failed", "BackoffLimitExceeded"), ReadAnalysis("Failed", "BackoffLimitExceeded")),
    (STATE, JobSeen(T0 + 10, "job-1", "Gone", ""), Failure("AnalysisFailed", "analysis Job job-1 disappeared")),
    (STATE, JobSeen(T0 + 70, "job-1", "Running", "", 'Error creating: pods "p" is forbidden: violates PodSecurity "restricted:latest"'),
     Failure("AnalysisNotStarted", 'analysis Job job-1 could not create its pod for 60s: Error creating: pods "p" is forbidden: '
                                   'violates PodSecurity "restricted:latest"; captures are kept in s3://b/ml/s')),
    (STATE, AnalysisStatus("Succeeded", "done", {}, "rank 2 holds the job back"), Finish("Analyzed", "rank 2 holds the job back")),
    (STATE, AnalysisStatus("Failed", "BackoffLimitExceeded", {"status": "False", "message": "no trace readable"}, ""),
     Failure("AnalysisFailed", "no trace readable")),
    (STATE, AnalysisStatus("Failed", "BackoffLimitExceeded", {}, ""), Failure("AnalysisFailed", "BackoffLimitExceeded")),
])
def test_analysis(state: RunState, obs: Any, expected: Any) -> None:
    assert phases.step(state, obs) == (state, [expected])


@pytest.mark.parametrize("status, report, patch", [
    ({}, Report({"captured": 0, "total": 2}, [], None), {"workers": {"captured": 0, "total": 2}, "failedWorkers": [], "workersReady": "0/2"}),
    ({"workers": {"captured": 0, "total": 2}, "failedWorkers": [], "message": "2 sidecar(s) triggered"}, Report({"captured": 0, "total": 2}, [], None), None),
    ({"workers": {"captured": 1, "total": 1}, "failedWorkers": [], "message": f"{WAITING} 1 pod(s)"}, Report({"captured": 1, "total": 1}, [], None),
     {"workers": {"captured": 1, "total": 1}, "failedWorkers": [], "workersReady": "1/1",
      "message": "every selected pod's training processes registered; capturing"}),
    ({"workers": {"captured": 0, "total": 1}, "failedWorkers": [], "message": "x"}, Report({"captured": 0, "total": 1}, [], f"{WAITING} 1 pod(s)"),
     {"workers": {"captured": 0, "total": 1}, "failedWorkers": [], "workersReady": "0/1", "message": f"{WAITING} 1 pod(s)"}),
])
def test_progress_is_written_only_when_it_changed(status: dict[str, Any], report: Report, patch: dict[str, Any] | None) -> None:
    assert phases.progress_patch(status, report) == patch


@pytest.mark.parametrize("now, created, pods, looks", [
    (T0 + 59, T0, 0, False),  # the Job controller may still be creating it
    (T0 + 60, T0, 0, True),
    (T0 + 600, T0, 1, False),  # it has a pod: the Job's own outcome tells the rest
    (T0 + 600, None, 0, False),
])
def test_a_podless_analysis_job_is_looked_into_after_the_grace(now: float, created: float | None, pods: int, looks: bool) -> None:
    assert phases.podless_too_long(STATE, now, created, pods) == looks
