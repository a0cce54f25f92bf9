"""Every phase, state and condition name that crosses a process: a ProfileSession's phase and
conditions, a sidecar session's phase, a rank's state (docs/wire.md), a ProfileTrigger's state.
StrEnums, so a value is its JSON string and compares equal to it. Standard library only (enum is
loaded with re and json anyway, so the agent pays nothing for it).
"""

from __future__ import annotations

from enum import StrEnum

from . import wire


class SessionPhase(StrEnum):
    """status.phase of a ProfileSession."""

    PENDING = "Pending"
    CAPTURING = "Capturing"
    ANALYZING = "Analyzing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


SESSION_FINAL = frozenset({SessionPhase.SUCCEEDED, SessionPhase.FAILED})


class SidecarPhase(StrEnum):
    """A session's phase on one sidecar (GET /v1/sessions/{id})."""

    PENDING = "Pending"  # no rank capturing yet
    CAPTURING = "Capturing"
    UPLOADING = "Uploading"  # every rank finished or hung, uploads outstanding
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


SIDECAR_FINAL = frozenset({SidecarPhase.SUCCEEDED, SidecarPhase.FAILED, SidecarPhase.CANCELLED})


class RankState(StrEnum):
    """A rank's state in its state file (the words are wire's, which the agent imports alone at
    start). `hung` is not final: a rank whose steps resume goes back to `waiting` or `capturing`
    and may still end `done` with a trace. `pending` is the sidecar's word for a rank with no
    state file yet (its agent has not seen the request)."""
    PENDING = "pending"
    WAITING = wire.WAITING
    CAPTURING = wire.CAPTURING
    WRITING = wire.WRITING
    HUNG = wire.HUNG
    DONE = wire.DONE
    FAILED = wire.FAILED
    CANCELLED = wire.CANCELLED
    REFUSED = wire.REFUSED


class ConditionType(StrEnum):
    """status.conditions[].type of a ProfileSession (Ready also of a ProfileTrigger)."""

    TRIGGERED = "Triggered"
    CAPTURED = "Captured"
    ANALYZED = "Analyzed"
    READY = "Ready"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class TriggerState(StrEnum):
    """status.state of a ProfileTrigger."""

    LEARNING = "Learning"  # no baseline yet
    WATCHING = "Watching"
    COOLING_DOWN = "CoolingDown"
    CAPPED = "Capped"
    SUSPENDED = "Suspended"
    INVALID = "Invalid"


class Severity(StrEnum):
    """status.diagnosis.findings[].severity."""

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"
