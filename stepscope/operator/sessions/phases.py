"""The decisions of a ProfileSession's life as one pure function, `step(state, observation) ->
(state, actions)`: which phase comes next, when to wait, give up on a pod, or fail and with what
message. stepscope.operator.sessions.lifecycle is the shell: it observes (lists pods, polls sidecars,
reads the analysis Job), calls `step`, and applies the actions (status writes, events, the pod
record, cancellations, the Job). The clock is the observation's `now`, so tests drive every
transition directly (tests/operator/test_phases.py), as operator/sessions/status.py's `aggregate`."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from stepscope.operator.sessions.pod_record import PodRecord
from stepscope.operator.sessions.selection import Target
from stepscope.operator.sessions.status import MAX_FAILED_WORKERS, MAX_MESSAGE, WAITING, PodProgress, aggregate, failed_worker, registration_wait, unregistered, unregistered_reason
from stepscope.operator.settings import INJECT_LABEL

# What a refused pod list means for the user: the answer is final, retrying cannot help.
LIST_REFUSALS = {
    400: "fix spec.selector",
    403: "the operator's ServiceAccount may not list pods here: add the namespace to the chart's operator.namespaces (docs/security.md)",
    422: "fix spec.selector",
}


@dataclass(frozen=True)
class RunState:
    """What the decisions need of a session: its spec's bounds and what happened so far."""
    phase: str  # status.phase ("" before the first write)
    namespace: str
    selector: str  # spec.selector as a label selector
    dest: str  # where the captures go
    timeout_seconds: int  # spec.timeoutSeconds
    selection_grace_s: float
    registration_timeout_s: float  # spec.registrationTimeoutSeconds
    analysis_enabled: bool
    start: float | None = None  # status.startTime, epoch seconds
    triggered: float | None = None  # the Triggered condition's lastTransitionTime: registration counts from it
    unregistered: tuple[str, ...] = ()  # pods given up for want of a registered training process
    analysis_start_grace_s: float = 60.0  # OperatorSettings.analysis_start_grace_s


# -- observations -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Listed:
    """One listing of the selected pods while Pending."""
    now: float
    matched: int  # pods the selector matches
    targets: tuple[Target, ...]  # those Running with a sidecar
    uninjected: tuple[str, ...]  # those that asked for the sidecar and started without it


@dataclass(frozen=True)
class ListFailed:
    """Listing the selected pods raised; `status` is the HTTP status, None for any other error."""
    now: float
    status: int | None
    error: str  # in words, "HTTP <status> <the API server's message>" for an API error


@dataclass(frozen=True)
class TriggerAnswers:
    """The sidecars' answers to the session's PUT (fanout.trigger)."""
    already: frozenset[str]  # pods an earlier operator process triggered
    accepted: frozenset[str]
    refused: Mapping[str, str]  # pod -> the sidecar's error
    uninjected: tuple[str, ...]


@dataclass(frozen=True)
class Polled:
    """One round of the capture: every triggered pod's latest sidecar answer, or why it is lost."""
    now: float
    progress: Mapping[str, PodProgress]


@dataclass(frozen=True)
class JobSeen:
    """The analysis Job's outcome (jobs.job_outcome), or "Gone" when it was deleted; while it has
    no pod past the grace (podless_too_long), why the Job controller could not create one."""
    now: float
    name: str
    outcome: str
    message: str
    failed_create: str = ""  # the latest FailedCreate event's message


@dataclass(frozen=True)
class AnalysisStatus:
    """What the finished analysis Job wrote into the session's status."""
    outcome: str  # Succeeded or Failed (jobs.job_outcome)
    message: str  # the Job's own words
    analyzed: Mapping[str, Any]  # the Analyzed condition, {} when the Job wrote none
    summary: str  # status.diagnosis.summary


Observation = Listed | ListFailed | TriggerAnswers | Polled | JobSeen | AnalysisStatus


# -- actions ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Wait:
    """Sleep (the poll interval, or up to a second while selecting) and observe again."""


@dataclass(frozen=True)
class Retry:
    """Raise the observed error: kopf restarts the daemon, which resumes from the status."""


@dataclass(frozen=True)
class Failure:
    """End the session Failed; `reason` is a CamelCase word, the message says what to change."""
    reason: str
    message: str


@dataclass(frozen=True)
class Trigger:
    """PUT the session on these sidecars."""
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class RecordPods:
    """Write the pod record, then go Capturing with this message and these failedWorkers."""
    pods: PodRecord
    message: str
    failed_workers: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class GiveUp:
    """These pods' training never registered: count them lost and cancel them on their sidecars."""
    pods: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Report:
    """The capture's progress for status (the shell writes it when it changed: `progress_patch`)."""
    workers: dict[str, int]
    failed_workers: list[dict[str, Any]]
    waiting: str | None  # why the session waits for registrations, None when none waits


@dataclass(frozen=True)
class Captured:
    """The capture ended with something to analyse: create the analysis Job, or, with analysis
    disabled, end Succeeded."""
    message: str
    analyze: bool


@dataclass(frozen=True)
class ReadAnalysis:
    """The Job ended: read what it wrote into the session's status."""
    outcome: str
    message: str


@dataclass(frozen=True)
class Finish:
    """End the session Succeeded."""
    reason: str
    message: str


Action = Wait | Retry | Failure | Trigger | RecordPods | GiveUp | Report | Captured | ReadAnalysis | Finish


# -- the transitions --------------------------------------------------------------------------

def timed_out(state: RunState, now: float) -> bool:
    """spec.timeoutSeconds has passed since status.startTime."""
    return state.start is not None and now - state.start > state.timeout_seconds


def uninjected_message(pods: tuple[str, ...] | list[str]) -> str:
    more = f" and {len(pods) - 3} more" if len(pods) > 3 else ""
    return (f"not profiled: pod(s) {', '.join(pods[:3])}{more} asked for the sidecar ({INJECT_LABEL}=true) but started without it "
            "(see their SidecarNotInjected events); recreate them to profile them")


def step(state: RunState, obs: Observation) -> tuple[RunState, list[Action]]:
    """The next state and what to do, for one observation."""
    if isinstance(obs, Listed):
        return state, _select(state, obs)
    if isinstance(obs, ListFailed):
        return state, [_list_failed(state, obs)]
    if isinstance(obs, TriggerAnswers):
        return _triggered(state, obs)
    if isinstance(obs, Polled):
        return _capture_round(state, obs)
    if isinstance(obs, JobSeen):
        return state, [_job_seen(state, obs)]
    return state, [_analysed(obs)]


def _select(state: RunState, obs: Listed) -> list[Action]:
    if obs.targets:
        return [Trigger(obs.targets)]
    since = state.start if state.start is not None else obs.now
    if obs.now - since < state.selection_grace_s:
        return [Wait()]
    seen = f"{obs.matched} pod(s) match but none is Running with a container port named 'stepscope'" if obs.matched else "no pod matches"
    if obs.uninjected:
        seen += f"; {uninjected_message(obs.uninjected)}"
    return [Failure("NoPodsSelected", f"spec.selector ({state.selector}) selects no Running pod with a stepscope sidecar in namespace {state.namespace}: "
                                      f"{seen}; label the training pods with stepscope.io/inject=\"true\" or fix spec.selector")]


def _list_failed(state: RunState, obs: ListFailed) -> Action:
    """A refusal the user must fix fails the session at once; any other error is retried until
    spec.timeoutSeconds, then fails it with that error."""
    if obs.status in LIST_REFUSALS:
        return Failure("PodsUnlistable", f"listing pods in namespace {state.namespace} with spec.selector ({state.selector}) was refused: "
                                         f"{obs.error}; {LIST_REFUSALS[obs.status]}")
    if timed_out(state, obs.now):
        return Failure("PodsUnlistable", f"pods in namespace {state.namespace} could not be listed within spec.timeoutSeconds: {obs.error}")
    return Retry()


def _triggered(state: RunState, obs: TriggerAnswers) -> tuple[RunState, list[Action]]:
    accepted = obs.already | obs.accepted
    refused = {pod: f"trigger refused: {error}" for pod, error in obs.refused.items()}
    if not accepted:
        first = next(iter(refused.values()), "no sidecar answered")
        return state, [Failure("TriggerFailed", f"no sidecar accepted the session ({len(refused)} tried); first error: {first}")]
    message = (f"{len(accepted)} sidecar(s) triggered" + (f", {len(refused)} refused" if refused else "")
               + (f"; {uninjected_message(obs.uninjected)}" if obs.uninjected else ""))
    failed = tuple(failed_worker(pod, None, reason) for pod, reason in sorted(refused.items()))[:MAX_FAILED_WORKERS]
    return state, [RecordPods(PodRecord(accepted, frozenset(refused)), message, failed)]


def _capture_timeout(state: RunState, workers: dict[str, int]) -> Failure:
    return Failure("Timeout", f"capture did not finish within spec.timeoutSeconds={state.timeout_seconds}s; "
                              f"{workers['uploaded']} of {workers['total']} worker(s) uploaded, kept in {state.dest}")


def _capture_round(state: RunState, obs: Polled) -> tuple[RunState, list[Action]]:
    """Give up pods whose training never registered (rather than keep the session Capturing until
    spec.timeoutSeconds), report the progress, then wait, time out or end the capture."""
    actions: list[Action] = []
    progress = dict(obs.progress)
    since = next((t for t in (state.triggered, state.start) if t is not None), obs.now)
    lost = unregistered(progress, obs.now - since, state.registration_timeout_s)
    if lost:
        reason = unregistered_reason(state.registration_timeout_s)
        progress.update({pod: replace(progress[pod], lost=reason) for pod in lost})
        state = replace(state, unregistered=state.unregistered + tuple(lost))
        actions.append(GiveUp(tuple(lost), reason))
    agg = aggregate(progress)
    actions.append(Report(agg.workers, agg.failed_workers, registration_wait(progress, state.registration_timeout_s)))
    if not agg.done:
        return state, actions + [_capture_timeout(state, agg.workers) if timed_out(state, obs.now) else Wait()]
    uploaded, total = agg.workers["uploaded"], agg.workers["total"]
    # A hung job makes no step to capture, but its hung ranks' stacks are the diagnosis.
    if uploaded == 0 and not agg.hung:
        # The sidecars keep the same timeout: one that ran out first ended its workers, which is
        # the session's timeout too, not a capture failure of its own.
        if timed_out(state, obs.now):
            return state, actions + [_capture_timeout(state, agg.workers)]
        if state.unregistered:
            more = f" (and {len(state.unregistered) - 1} more pod(s))" if len(state.unregistered) > 1 else ""
            return state, actions + [Failure("NoTrainingProcess", f"pod {state.unregistered[0]}{more}: {unregistered_reason(state.registration_timeout_s)}")]
        first = agg.failed_workers[0]["reason"] if agg.failed_workers else "unknown"
        return state, actions + [Failure("CaptureFailed", f"no worker uploaded a capture ({agg.workers['failed']} of {total} failed); first: {first}")]
    message = f"{uploaded} of {total} worker(s) captured and uploaded" + (f"; {agg.hung} hung, their Python stacks uploaded" if agg.hung else "")
    return state, actions + [Captured(message, state.analysis_enabled)]


def podless_too_long(state: RunState, now: float, created: float | None, pods: int) -> bool:
    """Whether a running analysis Job has had no pod for longer than its grace, so that the shell
    looks for the Job controller's FailedCreate events."""
    return pods == 0 and created is not None and now - created >= state.analysis_start_grace_s


def _job_seen(state: RunState, obs: JobSeen) -> Action:
    if obs.outcome == "Gone":
        return Failure("AnalysisFailed", f"analysis Job {obs.name} disappeared")
    if obs.outcome != "Running":
        return ReadAnalysis(obs.outcome, obs.message)
    if obs.failed_create:
        return Failure("AnalysisNotStarted", f"analysis Job {obs.name} could not create its pod for {state.analysis_start_grace_s:.0f}s: "
                                             f"{obs.failed_create[:400]}; captures are kept in {state.dest}")
    if timed_out(state, obs.now):
        return Failure("Timeout", f"analysis did not finish within spec.timeoutSeconds; captures are kept in {state.dest}")
    return Wait()


def _analysed(obs: AnalysisStatus) -> Action:
    if obs.outcome == "Failed":
        return Failure("AnalysisFailed", str(obs.analyzed.get("message") or obs.message) if obs.analyzed.get("status") == "False" else obs.message)
    return Finish("Analyzed", obs.summary)


def progress_patch(status: Mapping[str, Any], report: Report) -> dict[str, Any] | None:
    """The status patch for a capture's progress, or None when status already says it. A message
    that said the session waits for registrations is replaced once none waits."""
    message = status.get("message") or ""
    waiting = report.waiting
    if waiting is None and message.startswith(WAITING):
        waiting = "every selected pod's training processes registered; capturing"
    if report.workers == status.get("workers") and report.failed_workers == status.get("failedWorkers") and waiting in (None, message):
        return None
    patch = {"workers": report.workers, "failedWorkers": report.failed_workers,
             "workersReady": f"{report.workers['captured']}/{report.workers['total']}"}
    return {**patch, "message": waiting[:MAX_MESSAGE]} if waiting else patch
