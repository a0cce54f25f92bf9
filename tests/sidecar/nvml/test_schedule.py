"""The NVML sampler's schedule, on its pure functions (stepscope.sidecar.nvml.recorder): which
tiers a round runs, where the next deadline lies, what an overrun drops, how long to sleep. Each
row a schedule and a clock reading; the thread that applies them is covered by test_recorder.py."""
from __future__ import annotations

import pytest

from stepscope.sidecar.nvml.recorder import BUFFER_PERIOD_US, MAX_LATE_WAKE_NS, SLOW_PERIOD_US, Schedule, after_round, refine_late_wake, tiers_due, wake_plan

MS = 1_000_000  # ns
SLOW, BUFFERS = SLOW_PERIOD_US * 1000, BUFFER_PERIOD_US * 1000


@pytest.mark.parametrize("schedule, expected", [
    (Schedule(0, 0, 0, MS), (True, True)),  # the first round runs every tier
    (Schedule(MS, SLOW, BUFFERS, MS), (False, False)),
    (Schedule(SLOW, SLOW, BUFFERS, MS), (True, False)),
    (Schedule(BUFFERS, BUFFERS, BUFFERS, MS), (True, True)),
    (Schedule(BUFFERS, BUFFERS + 1, BUFFERS, MS), (False, False)),  # the buffers wait for a slow round
])
def test_tiers_due(schedule: Schedule, expected: tuple[bool, bool]) -> None:
    assert tiers_due(schedule) == expected


@pytest.mark.parametrize("schedule, now, slow, buffers, poll, expected", [
    # On time: the next deadline one interval on, absolute (a late finish does not shift it).
    (Schedule(0, 0, 0, MS), 300_000, True, True, False, Schedule(MS, SLOW, BUFFERS, MS, 1, 0)),
    (Schedule(MS, SLOW, BUFFERS, MS, 1, 0), MS + 999_999, False, False, False, Schedule(2 * MS, SLOW, BUFFERS, MS, 2, 0)),
    # An overrun of a whole interval or more skips (and counts) the deadlines it cannot meet.
    (Schedule(MS, SLOW, BUFFERS, MS, 1, 0), 3 * MS - 1, False, False, False, Schedule(2 * MS, SLOW, BUFFERS, MS, 2, 0)),
    (Schedule(MS, SLOW, BUFFERS, MS, 1, 0), 3 * MS, False, False, False, Schedule(3 * MS, SLOW, BUFFERS, MS, 2, 1)),
    (Schedule(MS, SLOW, BUFFERS, MS, 1, 5), 4 * MS + MS // 2, False, False, False, Schedule(4 * MS, SLOW, BUFFERS, MS, 2, 7)),
    # A slow round that came late moves the next slow round to a full period after the next due time, not after now.
    (Schedule(12 * MS, SLOW, BUFFERS, MS, 9, 3), 12 * MS, True, False, False, Schedule(13 * MS, 2 * SLOW, BUFFERS, MS, 10, 3)),
    (Schedule(25 * MS, SLOW, BUFFERS, MS, 9, 3), 25 * MS, True, False, False, Schedule(26 * MS, 25 * MS, BUFFERS, MS, 10, 3)),
    # With the native tier, a utilization the driver keeps no buffer of is polled every slow period.
    (Schedule(0, 0, 0, BUFFERS), 0, True, True, True, Schedule(SLOW, SLOW, BUFFERS, SLOW, 1, 0)),
])
def test_after_round(schedule: Schedule, now: int, slow: bool, buffers: bool, poll: bool, expected: Schedule) -> None:
    assert after_round(schedule, now, slow, buffers, poll) == expected


@pytest.mark.parametrize("remaining, estimate, interval, sleep_only, expected", [
    (800_000, 60_000.0, MS, True, 800_000),  # from 1 ms on: sleep it all
    (-5, 60_000.0, MS, True, 0.0),  # late already: run the round now
    (80_000, 60_000.0, 100_000, False, 20_000.0),  # below 1 ms: wake early by the oversleep estimate, spin the rest
    (50_000, 60_000.0, 100_000, False, 0.0),  # too close to sleep at all
    (90_000, 500_000.0, 100_000, False, 0.0),  # the lead never exceeds an interval
])
def test_wake_plan(remaining: int, estimate: float, interval: int, sleep_only: bool, expected: float) -> None:
    assert wake_plan(remaining, estimate, interval, sleep_only) == expected


def test_the_oversleep_estimate_follows_slowly_and_clips_a_preempted_sleep() -> None:
    assert refine_late_wake(60_000.0, 100_000, 170_000) == pytest.approx(61_000.0)
    assert refine_late_wake(60_000.0, 100_000, 90_000) == pytest.approx(54_000.0)  # woke early: no lateness
    assert refine_late_wake(0.0, 100_000, 100_000 + 10 * MS) == pytest.approx(0.1 * MAX_LATE_WAKE_NS)
