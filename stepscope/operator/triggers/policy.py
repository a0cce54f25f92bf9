"""A ProfileTrigger as a pure function: `step(state, observation, policy) -> (state, actions)`.

stepscope.detection judges the conditions on the ranks' telemetry; this module adds what the
trigger resource promises on top: which conditions are on, alerts fired from Alertmanager, the
cooldown and the hourly cap, the name and body of each ProfileSession it creates, and the status
that says why. No I/O and no clock: stepscope.operator.triggers.daemon polls and writes.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stepscope import detection
from stepscope.contracts import trigger as trigger_contract
from stepscope.contracts.states import TriggerState
from stepscope.contracts.trigger import TriggerSpec
from stepscope.operator.settings import GROUP, KIND, VERSION

TRIGGER_KIND, TRIGGER_PLURAL = trigger_contract.KIND, trigger_contract.PLURAL
# The label every session a trigger created carries (its value: the trigger's name, when it fits).
TRIGGER_LABEL = "stepscope.io/trigger"
REASON_ANNOTATION = "stepscope.io/trigger-reason"
ALERT = "Alert"  # a fire from an Alertmanager webhook, beside detection's conditions
HOUR_S = 3600.0
MAX_RECENT = trigger_contract.MAX_RECENT
MAX_TEXT = 1024

LEARNING, WATCHING, COOLING_DOWN, CAPPED, SUSPENDED, INVALID = TriggerState

@dataclass(frozen=True)
class Policy:
    """What the trigger's spec asks for, in the units detection works in."""
    name: str
    conditions: detection.Conditions = detection.Conditions()
    enabled: frozenset[str] = frozenset({detection.SLOWDOWN, detection.DIVERGENCE, detection.HANG})
    cooldown_s: float = TriggerSpec.default_of("cooldownSeconds")
    max_per_hour: int = TriggerSpec.default_of("maxSessionsPerHour")
    suspended: bool = False

    @classmethod
    def from_spec(cls, name: str, spec: Mapping[str, Any]) -> Policy:
        """The policy of a trigger's spec, read as the contract's TriggerSpec: the schema's defaults
        for what a spec leaves out, a SpecError (a ValueError) naming what the schema refuses."""
        c = (trigger := TriggerSpec.from_dict(dict(spec), "spec")).conditions
        conditions = detection.Conditions(
            slowdown_factor=c.stepTime.factor, sustained_s=c.stepTime.sustainedSeconds, baseline_window_s=60.0 * c.stepTime.baselineMinutes,
            divergence_factor=c.rankDivergence.factor, divergence_sustained_s=c.rankDivergence.sustainedSeconds,
            hang_after_s=c.hang.noStepSeconds)
        on = {detection.SLOWDOWN: c.stepTime.enabled, detection.DIVERGENCE: c.rankDivergence.enabled, detection.HANG: c.hang.enabled}
        return cls(name, conditions, frozenset(k for k, v in on.items() if v), float(trigger.cooldownSeconds), trigger.maxSessionsPerHour,
                   trigger.suspend)


@dataclass(frozen=True)
class Fired:
    """A fire of the trigger (status.lastFired); one that created a session is also a
    status.recentSessions entry."""
    time: float
    condition: str
    reason: str
    ranks: tuple[int, ...]
    session: str | None  # None: the cooldown, the cap or suspend held it back


@dataclass(frozen=True)
class State:
    detection: detection.State = field(default_factory=detection.State)
    recent: tuple[Fired, ...] = ()  # the fires that created a session, newest first, at most MAX_RECENT
    sessions_created: int = 0
    last_fired: Fired | None = None


@dataclass(frozen=True)
class Observation:
    time: float  # Unix seconds
    telemetry: detection.Observation | None  # None when no selected pod's sidecar could be polled
    alerts: tuple[str, ...] = ()  # Alertmanager alerts received since the last step (their summaries)


@dataclass(frozen=True)
class CreateSession:
    name: str
    condition: str
    reason: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class HoldBack:
    """A fire that created no session, and why (an Event; the status' lastFired)."""
    condition: str
    reason: str
    why: str


Action = CreateSession | HoldBack


def session_name(trigger: str, time: float) -> str:
    """`<trigger>-<yyyymmddhhmmss>` (UTC): sorted by time in `kubectl get ps`, and a person finds
    the trigger in it. Cut to the 253 characters of an object name."""
    stamp = dt.datetime.fromtimestamp(time, dt.UTC).strftime("%Y%m%d%H%M%S")
    return f"{trigger[:253 - len(stamp) - 1].rstrip('-.')}-{stamp}"


def _held_by(state: State, policy: Policy, now: float) -> str | None:
    if policy.suspended:
        return "the trigger is suspended (spec.suspend)"
    if state.recent and now - state.recent[0].time < policy.cooldown_s:
        return (f"cooling down: {state.recent[0].session} was created {now - state.recent[0].time:.0f} s ago "
                f"(spec.cooldownSeconds={policy.cooldown_s:g})")
    in_hour = sum(1 for c in state.recent if now - c.time < HOUR_S)
    if in_hour >= policy.max_per_hour:
        return f"capped: {in_hour} session(s) created in the last hour (spec.maxSessionsPerHour={policy.max_per_hour})"
    return None


def step(state: State, observation: Observation, policy: Policy) -> tuple[State, list[Action]]:
    """Fold one poll (and the alerts received since the last) into the trigger's state; what to do.
    At most one session per step: conditions that fire together share it (their reasons joined)."""
    now = observation.time
    det = state.detection
    fires: list[detection.Fire] = []
    if observation.telemetry is not None and not policy.suspended:
        det, judged = detection.detect(det, observation.telemetry, policy.conditions)
        fires = [f for f in judged if f.condition in policy.enabled]
    fires += [detection.Fire(ALERT, f"Alertmanager: {summary}", ()) for summary in observation.alerts]
    state = replace(state, detection=det)
    if not fires:
        return state, []
    condition = ", ".join(dict.fromkeys(f.condition for f in fires))
    reason = "; ".join(f.reason for f in fires)[:MAX_TEXT]
    ranks = tuple(sorted({r for f in fires for r in f.ranks}))
    why = _held_by(state, policy, now)
    if why is not None:
        return replace(state, last_fired=Fired(now, condition, reason, ranks, None)), [HoldBack(condition, reason, why)]
    name = session_name(policy.name, now)
    fired = Fired(now, condition, reason, ranks, name)
    return replace(state, recent=(fired, *state.recent)[:MAX_RECENT], sessions_created=state.sessions_created + 1,
                   last_fired=fired), [CreateSession(name, condition, reason, ranks)]


def phase(state: State, policy: Policy, now: float) -> str:
    """status.state: what the trigger does now."""
    if policy.suspended:
        return SUSPENDED
    if state.recent and now - state.recent[0].time < policy.cooldown_s:
        return COOLING_DOWN
    if sum(1 for c in state.recent if now - c.time < HOUR_S) >= policy.max_per_hour:
        return CAPPED
    if detection.SLOWDOWN in policy.enabled and state.detection.baseline is None:
        return LEARNING
    return WATCHING


def _iso(time: float) -> str:
    return dt.datetime.fromtimestamp(time, dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _unix(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def status_fields(state: State, policy: Policy, now: float) -> dict[str, Any]:
    """The status fields this module owns (the daemon adds pods, conditions, message and
    observedGeneration). A reading that is absent is written as None, which a merge patch deletes."""
    current = state.detection.current
    fields: dict[str, Any] = {
        "state": phase(state, policy, now),
        "baseline": {"stepTimeSeconds": state.detection.baseline},
        "current": {"stepTimeRatio": current.get(detection.SLOWDOWN), "rankDivergenceRatio": current.get(detection.DIVERGENCE),
                    "secondsSinceStep": current.get(detection.HANG)},
        "sessionsCreated": state.sessions_created,
        "recentSessions": [{"name": f.session, "time": _iso(f.time), "condition": f.condition, "reason": f.reason} for f in state.recent],
    }
    if state.last_fired is not None:
        f = state.last_fired
        fields["lastFired"] = {"time": _iso(f.time), "condition": f.condition, "reason": f.reason, "ranks": list(f.ranks), "session": f.session}
    return fields


def restored(status: Mapping[str, Any]) -> State:
    """The state an operator (re)starting finds in a trigger's status: the sessions it created (so
    the cooldown and the cap hold across restarts), not the baseline, which it learns again."""
    recent = tuple(Fired(_unix(c["time"]), str(c.get("condition", "")), str(c.get("reason", "")), (), str(c.get("name", "")))
                   for c in status.get("recentSessions") or () if c.get("time"))
    last = status.get("lastFired") or {}
    last_fired = Fired(_unix(last["time"]), str(last.get("condition", "")), str(last.get("reason", "")),
                           tuple(int(r) for r in last.get("ranks") or ()), last.get("session")) if last.get("time") else None
    return State(recent=recent, sessions_created=int(status.get("sessionsCreated") or 0), last_fired=last_fired)


def session_body(trigger: Mapping[str, Any], action: CreateSession) -> dict[str, Any]:
    """The ProfileSession to create: the trigger's template with the trigger's selector, owned by
    the trigger (deleting the trigger deletes its sessions), labelled and annotated with why."""
    meta = trigger["metadata"]
    spec = trigger["spec"]
    labels = {"app.kubernetes.io/managed-by": "stepscope"}
    if len(meta["name"]) <= 63:  # a label value's limit; longer trigger names are found by the session's name
        labels[TRIGGER_LABEL] = meta["name"]
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": TRIGGER_KIND, "name": meta["name"], "uid": meta["uid"],
             "controller": True, "blockOwnerDeletion": True}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": action.name, "labels": labels, "ownerReferences": [owner],
                         "annotations": {REASON_ANNOTATION: f"{action.condition}: {action.reason}"[:MAX_TEXT]}},
            "spec": {**_template(spec), "selector": dict(spec["selector"])}}


def _template(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The trigger's sessionTemplate read as the ProfileSession spec it is (the same type), with
    every default filled in."""
    template = TriggerSpec.from_dict(dict(spec), "spec").sessionTemplate
    return template.to_dict() if template is not None else {}
