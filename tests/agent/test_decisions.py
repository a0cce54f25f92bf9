"""The agent's capture decisions, on its pure functions (stepscope.agent.decisions.decide and the
watchdog's predicates): each row a session snapshot and a moment, and the actions that must come
of them. No torch here; the shell (Agent) is covered by the real-process tests beside this file."""
from __future__ import annotations

from typing import Any

import pytest

from stepscope.agent.decisions import CANCEL_UNSTARTED, FIRST_STEP_GRACE_SECONDS, HEARTBEAT_SECONDS, PROBE, RESUME, START, STEP, STOP, CaptureView, Tick, decide, hangs, starts_stepless, watchdog_wait
from stepscope.contracts.wire import CANCELLED, CAPTURING, DONE, FAILED, HUNG, WAITING

T = 1000.0
WAITING_VIEW = CaptureView(state=WAITING, profiling=False, on_watchdog=False, all_threads=False, cancel=False, hung=False, hung_step=0,
                           start_at=15, start_step=None, steps=4, duration=None, started_mono=0.0, triggered_mono=T - 5, with_stack=False,
                           probed=False, probing=False, max_memory_mb=512.0, hang_timeout=300.0)
CAPTURING_VIEW = WAITING_VIEW._replace(state=CAPTURING, profiling=True, start_step=15, started_mono=T - 2)
DURATION_VIEW = CAPTURING_VIEW._replace(steps=None, duration=3.0, all_threads=True)


def _tick(step: int, *, since_step: float = 0.1, grown_mb: float = 0.0, at: float = T) -> Tick:
    return Tick(step, at, at - since_step, grown_mb)


@pytest.mark.parametrize("view, tick, expected", [
    # Waiting: nothing before startStep, the profiler starts at it.
    (WAITING_VIEW, _tick(14), []),
    (WAITING_VIEW, _tick(15), [(START,)]),
    (WAITING_VIEW, _tick(40), [(START,)]),  # a rank already past it starts at once
    # withStack: the last wait step is the budget's probe; it ends at the start step, which then starts.
    (WAITING_VIEW._replace(with_stack=True), _tick(13), []),
    (WAITING_VIEW._replace(with_stack=True), _tick(14), [(PROBE,)]),
    (WAITING_VIEW._replace(with_stack=True, probing=True), _tick(15), [(PROBE,), (START,)]),
    (WAITING_VIEW._replace(with_stack=True, probed=True), _tick(15), [(START,)]),
    # A request read at or past its start step (waitSteps 0) probes one step more.
    (WAITING_VIEW._replace(with_stack=True), _tick(15), [(PROBE,), (START,)]),
    # Cancelled before the profiler started: at once.
    (WAITING_VIEW._replace(cancel=True), _tick(3), [(CANCEL_UNSTARTED,)]),
    # Capturing a number of steps: step the profiler until they are recorded, then stop.
    (CAPTURING_VIEW, _tick(16), [(STEP,)]),
    (CAPTURING_VIEW, _tick(19), [(STOP, DONE, False, False)]),
    (CAPTURING_VIEW._replace(cancel=True), _tick(16), [(STOP, CANCELLED, False, False)]),
    # The memory budget cuts the capture short; the cancel comes first.
    (CAPTURING_VIEW, _tick(16, grown_mb=513), [(STOP, DONE, True, False)]),
    (CAPTURING_VIEW._replace(cancel=True), _tick(16, grown_mb=513), [(STOP, CANCELLED, False, False)]),
    # A duration capture on the training thread ends at the first boundary past its time.
    (DURATION_VIEW, _tick(16), [(STEP,)]),
    (DURATION_VIEW, _tick(16, at=T + 1), [(STOP, DONE, False, False)]),
    # A hung rank whose steps resume goes back to what it did, and goes on from there.
    (CAPTURING_VIEW._replace(state=HUNG, hung=True, hung_step=16), _tick(16), []),
    (CAPTURING_VIEW._replace(state=HUNG, hung=True, hung_step=16), _tick(17), [(RESUME, CAPTURING), (STEP,)]),
    (WAITING_VIEW._replace(state=HUNG, hung=True, hung_step=3), _tick(15), [(RESUME, WAITING), (START,)]),
    (WAITING_VIEW._replace(state=HUNG, hung=True, hung_step=3, cancel=True), _tick(3), [(CANCEL_UNSTARTED,)]),
    # Final or exporting sessions get nothing more.
    (CAPTURING_VIEW._replace(state=FAILED, profiling=False), _tick(16), []),
    (CAPTURING_VIEW._replace(state="writing", profiling=False), _tick(16), []),
])
def test_at_a_step_boundary(view: CaptureView, tick: Tick, expected: list[tuple[Any, ...]]) -> None:
    assert decide(view, tick, on_watchdog=False) == expected


@pytest.mark.parametrize("view, tick, expected", [
    # A session the watchdog started is the watchdog's: it ends when its duration is over.
    (DURATION_VIEW._replace(on_watchdog=True), _tick(0, since_step=9), [(STEP,)]),
    (DURATION_VIEW._replace(on_watchdog=True), _tick(0, since_step=9, at=T + 1), [(STOP, DONE, False, False)]),
    # The boundary leaves it alone, and the watchdog leaves a training thread's capture alone ...
    (CAPTURING_VIEW, _tick(16, since_step=99), []),
    # ... except an all-threads duration capture that no step boundary ends: once the duration is
    # over and no step came for a second, or a second after the duration at the latest.
    (DURATION_VIEW, _tick(16, since_step=0.5, at=T + 1), []),  # a loop that still steps gets a second to end it
    (DURATION_VIEW, _tick(16, since_step=0.5, at=T + 0.5), []),
    (DURATION_VIEW, _tick(16, since_step=2, at=T + 0.5), []),
    (DURATION_VIEW, _tick(16, since_step=2, at=T + 1), [(STOP, DONE, False, True)]),
    (DURATION_VIEW, _tick(16, since_step=0.5, at=T + 2), [(STOP, DONE, False, True)]),
    (DURATION_VIEW._replace(cancel=True), _tick(16, since_step=2), [(STOP, CANCELLED, False, True)]),
    (DURATION_VIEW._replace(cancel=True), _tick(16, since_step=0.5), []),  # the next boundary stops it
    (DURATION_VIEW, _tick(16, since_step=2, grown_mb=600), [(STOP, DONE, True, True)]),
    (DURATION_VIEW._replace(state=WAITING, profiling=False), _tick(16, since_step=2), []),
])
def test_on_a_watchdog_tick(view: CaptureView, tick: Tick, expected: list[tuple[Any, ...]]) -> None:
    assert decide(view, tick, on_watchdog=True) == expected


@pytest.mark.parametrize("view, tick, expected", [
    (WAITING_VIEW._replace(steps=None, duration=3.0), _tick(10, since_step=0.5), False),
    (WAITING_VIEW._replace(steps=None, duration=3.0), _tick(10, since_step=1.0), True),
    (WAITING_VIEW, _tick(10, since_step=9), False),  # a steps capture needs steps
    # Before a first step the process may still be starting: it gets the first-step grace,
    # counted from the trigger at the earliest.
    (WAITING_VIEW._replace(steps=None, duration=3.0, triggered_mono=T - FIRST_STEP_GRACE_SECONDS + 1), _tick(0, since_step=99), False),
    (WAITING_VIEW._replace(steps=None, duration=3.0, triggered_mono=T - FIRST_STEP_GRACE_SECONDS), _tick(0, since_step=99), True),
])
def test_the_watchdog_starts_a_stepless_duration_capture(view: CaptureView, tick: Tick, expected: bool) -> None:
    assert starts_stepless(view, tick) is expected


@pytest.mark.parametrize("view, tick, expected", [
    (CAPTURING_VIEW._replace(triggered_mono=T - 999), _tick(16, since_step=299), False),
    (CAPTURING_VIEW._replace(triggered_mono=T - 999), _tick(16, since_step=300), True),
    (WAITING_VIEW, _tick(3, since_step=400), False),  # counted from the trigger, 5 s ago
    (WAITING_VIEW._replace(triggered_mono=T - 300), _tick(3, since_step=400), True),
    (CAPTURING_VIEW._replace(state=HUNG, hung=True), _tick(16, since_step=900), False),  # once
    (CAPTURING_VIEW._replace(state=DONE), _tick(16, since_step=900), False),
])
def test_a_hang(view: CaptureView, tick: Tick, expected: bool) -> None:
    assert hangs(view, tick) is expected


@pytest.mark.parametrize("view, tick, expected", [
    (WAITING_VIEW, _tick(3), HEARTBEAT_SECONDS),
    (DURATION_VIEW, _tick(16, at=T + 0.5), 0.5),  # wakes when the duration runs out
    (DURATION_VIEW, _tick(16, at=T - 5), HEARTBEAT_SECONDS),
    (DURATION_VIEW, _tick(16, at=T + 0.999), 0.01),
    (DURATION_VIEW, _tick(16, at=T + 2), HEARTBEAT_SECONDS),
])
def test_the_watchdog_wait(view: CaptureView, tick: Tick, expected: float) -> None:
    assert watchdog_wait(view, tick) == pytest.approx(expected)
