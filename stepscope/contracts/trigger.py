"""The ProfileTrigger resource: watch the training pods' step telemetry and create a ProfileSession
by itself when the job slows down, one rank drifts or the job hangs (stepscope.detection judges the
conditions, the operator's triggers wing drives the trigger). Its sessionTemplate is a
ProfileSession spec without the selector, the same type (stepscope.contracts.session.SessionSpec):
a bad template is refused when the trigger is applied, not when it fires hours later.

Every condition is on by default (`conditions: {}` watches all three); each has `enabled`. The
detection state (the learned baseline) lives in the operator's memory: after an operator restart
the baseline is learned again. The cooldown and the hourly cap read status.recentSessions, so a
restart never lets a trigger fire past them.
"""

from __future__ import annotations

from .schema import Record, array, boolean, integer, number, record, string
from .session import Condition, LabelSelector, SessionSpec
from .states import TriggerState

KIND = "ProfileTrigger"
PLURAL = "profiletriggers"
MAX_RECENT = 20  # status.recentSessions; maxSessionsPerHour is at most as many


class StepTimeCondition(Record):
    enabled: bool = boolean("Watch for a slower job; false turns this condition off.", default=True)
    factor: float = number(
        "How many times the baseline the step time must exceed (above 1).",
        default=1.5,
        minimum=1,
        maximum=1000,
        exclusive_minimum=True,
    )
    baselineMinutes: float = number(
        "The baseline is the median step time of the last baselineMinutes (learned only while the job is not "
        "slow; fractions are allowed, e.g. 0.5).",
        default=10,
        minimum=0,
        maximum=1440,
        exclusive_minimum=True,
    )
    sustainedSeconds: float = number(
        "How long the step time must stay over factor x baseline before it fires.",
        default=60,
        minimum=0,
        maximum=86400,
        exclusive_minimum=True,
    )


class RankDivergenceCondition(Record):
    enabled: bool = boolean("Watch for one rank drifting from its peers; false turns this condition off.", default=True)
    factor: float = number(
        "How many times its peers' median the rank's step time must exceed (above 1).",
        default=1.5,
        minimum=1,
        maximum=1000,
        exclusive_minimum=True,
    )
    sustainedSeconds: float = number(
        "How long the rank must stay over it before it fires.",
        default=60,
        minimum=0,
        maximum=86400,
        exclusive_minimum=True,
    )


class HangCondition(Record):
    enabled: bool = boolean("Watch for a hung job; false turns this condition off.", default=True)
    noStepSeconds: float = number(
        "Seconds without a step on any rank that count as a hang.",
        default=300,
        minimum=0,
        maximum=86400,
        exclusive_minimum=True,
    )


class TriggerConditions(Record):
    stepTime: StepTimeCondition = record(
        StepTimeCondition,
        "The job's step time (the median over the ranks) above factor x a baseline the trigger learns from "
        "the job itself, for sustainedSeconds without a break.",
        default={},
    )
    rankDivergence: RankDivergenceCondition = record(
        RankDivergenceCondition,
        "One rank's step time over factor x the median of its peers', for sustainedSeconds. Ranks that "
        "synchronise every step (data parallel) share one step time; this catches ranks that do not step in "
        "lockstep (pipeline stages, independent groups).",
        default={},
    )
    hang: HangCondition = record(
        HangCondition,
        "No step on any rank for noStepSeconds (judged once every rank made a first step): the session then "
        "shows where each rank's Python stacks are.",
        default={},
    )


class TriggerSpec(Record):
    selector: LabelSelector | None = record(
        LabelSelector,
        "Pods in the trigger's namespace to watch (a standard label selector); every session it creates "
        "profiles the same pods.",
        required=True,
    )
    conditions: TriggerConditions = record(
        TriggerConditions,
        "When to capture. Each condition is on by default; one that holds fires a ProfileSession (within the "
        "cooldown and the cap). The operator judges them on every rank's step telemetry, read from the "
        "sidecars every poll.",
        default={},
    )
    sessionTemplate: SessionSpec | None = record(
        SessionSpec,
        "The spec of each ProfileSession the trigger creates, as in a ProfileSession (kubectl explain "
        "profilesession.spec) without the selector: the session selects the trigger's pods. Keep capture "
        "short (a few steps) and set ttlSecondsAfterFinished so that automatic sessions do not pile up.",
        required=True,
        omit=("selector",),
    )
    cooldownSeconds: int = integer(
        "Seconds after a session was created during which the trigger creates no other (the capture itself "
        "slows the steps it measures).",
        default=900,
        minimum=0,
        maximum=604800,
    )
    maxSessionsPerHour: int = integer(
        "At most this many sessions in any hour, whatever fires (an alert that flaps, a job that keeps slowing).",
        default=4,
        minimum=1,
        maximum=MAX_RECENT,
    )
    suspend: bool = boolean("true stops watching (and alerts fire nothing) until set back to false.", default=False)


class TriggerPods(Record):
    selected: int | None = integer("Running pods with a sidecar the selector matches.", minimum=0)
    answered: int | None = integer("Sidecars that answered the latest poll.", minimum=0)
    ranks: int | None = integer("Live ranks they reported.", minimum=0)


class Baseline(Record):
    stepTimeSeconds: float | None = number(
        "Median step time of the last spec.conditions.stepTime.baselineMinutes (absent while learning)."
    )


class Current(Record):
    stepTimeRatio: float | None = number("The job's step time over its baseline (stepTime fires over its factor).")
    rankDivergenceRatio: float | None = number(
        "The slowest rank's step time over its peers' median (rankDivergence fires over its factor)."
    )
    secondsSinceStep: float | None = number("Seconds since the latest step of any rank (hang fires at noStepSeconds).")


class LastFired(Record):
    time: str | None = string("When.", format="date-time")
    condition: str | None = string(
        "Slowdown, RankDivergence, Hang or Alert (comma-separated when several fired together).", max_length=64
    )
    reason: str | None = string("Why, in words (the readings that held).", max_length=1024)
    ranks: tuple[int, ...] | None = array("The ranks it points at.", integer(None), max_items=64)
    session: str | None = string(
        "The ProfileSession it created (absent when the cooldown or the cap held it back).", max_length=253
    )


class RecentSession(Record):
    name: str | None = string("The ProfileSession's name.", max_length=253)
    time: str | None = string("When it was created.", format="date-time")
    condition: str | None = string("What fired it.", max_length=64)
    reason: str | None = string("Why, in words.", max_length=1024)


class TriggerCondition(Condition):
    type: str | None = string("Ready.", required=True, max_length=64)
    reason: str | None = string(
        "One CamelCase word, Watching, InvalidSpec, NoPodsSelected or SidecarsUnreachable.", max_length=1024
    )


class TriggerStatus(Record):
    observedGeneration: int | None = integer("The metadata.generation this status describes.", format="int64")
    state: str | None = string(
        "Learning (no baseline yet), Watching, CoolingDown (a session was created less than cooldownSeconds "
        "ago), Capped (maxSessionsPerHour reached), Suspended, or Invalid (see the Ready condition).",
        enum=tuple(TriggerState),
    )
    message: str | None = string("The latest change, in words.", max_length=1024)
    pods: TriggerPods | None = record(TriggerPods, "The latest poll of the selected pods' sidecars.")
    baseline: Baseline | None = record(Baseline, "What the job's normal is, learned from the job itself.")
    current: Current | None = record(
        Current, "The latest reading of each condition (absent when there was nothing to judge it by)."
    )
    lastFired: LastFired | None = record(
        LastFired, "The latest time a condition or an alert fired, created session or not."
    )
    sessionsCreated: int | None = integer("ProfileSessions this trigger created in all.", minimum=0, format="int64")
    recentSessions: tuple[RecentSession, ...] | None = array(
        "The latest sessions it created, newest first (at most 20).",
        record(RecentSession, "One session."),
        max_items=MAX_RECENT,
    )
    conditions: tuple[TriggerCondition, ...] | None = array(
        "Ready: True while the trigger watches its pods; False says why not (InvalidSpec, NoPodsSelected, "
        "SidecarsUnreachable).",
        record(TriggerCondition, "One condition."),
        max_items=16,
        list_type="map",
        map_keys=("type",),
    )
