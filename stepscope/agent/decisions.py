"""The capture's decisions, pure: what to do with the active session at a step boundary or a
watchdog tick, decided over a snapshot of it (CaptureView) and of the moment (Tick); the agent
applies the actions (profiler, state file, stacks). tests/agent/test_decisions.py drives each one.
namedtuples and plain tuples, not dataclasses: every Python process of the pod imports this
package, and dataclasses would cost each ~9 ms at start."""
from __future__ import annotations

import collections

from .environment import first_step_grace_seconds
from .vocabulary import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HEARTBEAT_SECONDS = 1.0
# A loop that has not reached a step boundary for this long gets its requests read by the
# watchdog thread instead, so durationSeconds captures work without steps. Before its first step
# a process may still be starting (rendezvous, model setup), so it gets longer to show it steps.
STEPLESS_AFTER_SECONDS = 1.0
FIRST_STEP_GRACE_SECONDS = first_step_grace_seconds()

# and dataclasses would cost each ~9 ms at start.

CaptureView = collections.namedtuple("CaptureView", (
    "state", "profiling", "on_watchdog", "all_threads", "cancel", "hung", "hung_step", "start_at", "start_step", "steps", "duration",
    "started_mono", "triggered_mono", "with_stack", "probed", "probing", "max_memory_mb", "hang_timeout"))
# The moment: steps completed, CLOCK_MONOTONIC now and at the last step boundary, and how much the
# process grew since the profiler started (MB; 0 while none runs).
Tick = collections.namedtuple("Tick", ("step", "mono", "last_step_mono", "grown_mb"))

# Actions, as tuples led by their name:
RESUME = "resume"  # (RESUME, state): steps came again after a hang; back to `state`
CANCEL_UNSTARTED = "cancel-unstarted"  # (CANCEL_UNSTARTED,): cancelled before the profiler started
PROBE = "probe"  # (PROBE,): run or end the capture budget's probe step; nothing more while it runs
START = "start"  # (START,): start the profiler
STEP = "step"  # (STEP,): one profiler step
STOP = "stop"  # (STOP, final state, over the memory budget, stopped off a step boundary)


def cancels_unstarted(v: CaptureView, state: str | None = None) -> bool:
    """A cancelled session whose profiler never started ends at once, from any thread."""
    return bool(v.cancel) and not v.profiling and (state or v.state) in (wire.WAITING, wire.HUNG)


def decide(v: CaptureView, t: Tick, on_watchdog: bool) -> list[tuple[Any, ...]]:
    """The session's next move, at a step boundary (on_watchdog False) or a watchdog tick. A
    profiler is stepped and stopped by the thread that started it, except that the watchdog ends
    an all-threads capture that no step boundary ends."""
    if v.on_watchdog != on_watchdog:
        return _end_without_a_step(v, t) if on_watchdog and v.all_threads else []
    actions: list[tuple[Any, ...]] = []
    state = v.state
    if v.hung and t.step != v.hung_step:
        state = wire.CAPTURING if v.profiling else wire.WAITING
        actions.append((RESUME, state))
    if cancels_unstarted(v, state):
        return actions + [(CANCEL_UNSTARTED,)]
    if state == wire.WAITING:
        # The budget's probe counts the last wait step's Python calls (one more step where none is left).
        if v.with_stack and not v.probed and (v.probing or t.step + 1 >= v.start_at):
            actions.append((PROBE,))
        if t.step >= v.start_at:
            actions.append((START,))
        return actions
    if state != wire.CAPTURING or not v.profiling:
        return actions
    if v.cancel:
        return actions + [(STOP, wire.CANCELLED, False, False)]
    if t.grown_mb > v.max_memory_mb:
        return actions + [(STOP, wire.DONE, True, False)]
    if on_watchdog:
        over = t.mono - v.started_mono >= (v.duration or 0)
    elif v.steps is not None:
        over = t.step - (v.start_step or 0) >= v.steps
    else:
        over = v.duration is not None and t.mono - v.started_mono >= v.duration
    return actions + [(STOP, wire.DONE, False, False) if over else (STEP,)]


def _end_without_a_step(v: CaptureView, t: Tick) -> list[tuple[Any, ...]]:
    """Stop, from the watchdog, an all-threads capture of the training thread whose duration is
    over (or that was cancelled) while the loop makes no step: it blocks in data loading or sits
    between epochs. A loop that still steps gets STEPLESS_AFTER_SECONDS more to end it on a step
    boundary, so the sidecar sees the end at most that long after the duration."""
    if v.state != wire.CAPTURING or not v.profiling or v.duration is None:
        return []
    stalled = t.mono - t.last_step_mono >= STEPLESS_AFTER_SECONDS
    late = t.mono - v.started_mono - v.duration
    if v.cancel and stalled:
        return [(STOP, wire.CANCELLED, False, True)]
    if late >= 0 and (stalled or late >= STEPLESS_AFTER_SECONDS):
        return [(STOP, wire.DONE, False, True)]
    if stalled and t.grown_mb > v.max_memory_mb:
        return [(STOP, wire.DONE, True, True)]
    return []


def starts_stepless(v: CaptureView, t: Tick) -> bool:
    """A durationSeconds capture of a process that reaches no step boundary: the watchdog starts
    it (before a first step, once the first-step grace is over)."""
    stepless_after = STEPLESS_AFTER_SECONDS if t.step else FIRST_STEP_GRACE_SECONDS
    return v.state == wire.WAITING and v.duration is not None and t.mono - max(t.last_step_mono, v.triggered_mono) >= stepless_after


def hangs(v: CaptureView, t: Tick) -> bool:
    """No step for hangTimeoutSeconds, counted from the trigger at the earliest: a request may
    reach a rank that was already stuck, or one still starting up."""
    return v.state in (wire.WAITING, wire.CAPTURING) and not v.hung and t.mono - max(t.last_step_mono, v.triggered_mono) >= v.hang_timeout


def watchdog_wait(v: CaptureView, t: Tick) -> float:
    """How long the watchdog sleeps: a heartbeat, or less to end a duration when it runs out."""
    left = v.duration - (t.mono - v.started_mono) if v.profiling and v.duration is not None else 0.0
    return max(0.01, min(HEARTBEAT_SECONDS, left)) if left > 0 else HEARTBEAT_SECONDS

