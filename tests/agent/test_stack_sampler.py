"""The agent's stack sampler where the budget dropped the tracer's stacks: what span of time each
sample stands for, and the time a pure-Python function gets from samples taken in a real thread
that has to wait for the GIL."""

from __future__ import annotations

import sys
import time

from stepscope.agent.stacks import StackSampler, sample_spans
from stepscope.contracts.wire import STACK_SAMPLE_SECONDS


def test_a_late_sample_stands_for_the_time_the_sampler_waited_for_it():
    # Samples every 2 ms while the thread sleeps (the GIL is free), then one 9 ms late: the thread
    # ran Python meanwhile, which the late sample shows; the one before keeps its 2 ms.
    spans = sample_spans([0.0, 0.002, 0.004, 0.013, 0.015], 0.002)
    assert [(round(a, 3), round(b, 3)) for a, b in spans] == [
        (0.0, 0.002),
        (0.002, 0.004),
        (0.004, 0.006),
        (0.006, 0.015),
        (0.015, 0.017),
    ]
    # On time, each sample lasts until the next.
    assert sample_spans([1.0, 1.002, 1.004], 0.002) == [(1.0, 1.002), (1.002, 1.004), (1.004, 1.006)]


def _compute(milliseconds: float) -> int:
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        for i in range(200):
            acc = (acc * 31 + i) % 1_000_003
    return acc


def test_a_pure_python_function_gets_its_time_from_the_samples():
    # Each step sleeps 20 ms (the GIL free) and then computes 15 ms in pure Python: the sampler
    # thread waits for the GIL there. The function's sampled time is its own, not the sleep's.
    switch = sys.getswitchinterval()
    sampler = StackSampler(0, 10_000_000)
    sampler.start(1)
    steps = []
    for step in range(1, 9):
        sampler.anchor(step)
        started = time.monotonic()
        time.sleep(0.020)
        _compute(15.0)
        steps.append(
            {
                "name": f"ProfilerStep#{step}",
                "ts": started * 1e6,
                "dur": (time.monotonic() - started) * 1e6,
                "pid": 1,
                "tid": 1,
            }
        )
    sampler.stop()
    sampler._thread.join(2.0)
    assert sys.getswitchinterval() == switch  # the interpreter's own again once sampling ends
    events = sampler.events(steps)
    computed = sum(e["dur"] for e in events if e["name"].endswith(": _compute")) / 8 / 1000
    slept = (
        sum(
            e["dur"]
            for e in events
            if e["name"].endswith(": test_a_pure_python_function_gets_its_time_from_the_samples")
        )
        / 8
        / 1000
    )
    # Within about a sample of the 15 ms at either end (on a loaded machine the sampler thread is
    # late too, and its late sample stands for the time it waited); the 20-ms sleep is not in it.
    assert 12.0 <= computed <= 15.0 + 2.5 * STACK_SAMPLE_SECONDS * 1000, (computed, slept, STACK_SAMPLE_SECONDS)
