"""The sidecar's upload worker: retries with growing delays, one outcome per job, bounded shutdown."""
from __future__ import annotations

import logging
import re
import threading

import pytest

from stepscope.sidecar.uploads import Job, Uploader
from stepscope.storage import StoreError


def _flaky(failures: int) -> tuple[list[int], object]:
    calls: list[int] = []

    def run() -> None:
        calls.append(1)
        if len(calls) <= failures:
            raise StoreError(f"cannot write: attempt {len(calls)} failed")

    return calls, run


def test_a_job_is_retried_with_doubling_delays_until_it_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="stepscope.sidecar.uploads")
    uploader = Uploader(attempts=4, base_delay_s=0.01, max_delay_s=1.0)
    calls, run = _flaky(3)
    outcomes: list[str | None] = []
    finished = threading.Event()
    uploader.submit(Job("flaky", run, lambda error: (outcomes.append(error), finished.set())))
    assert finished.wait(10)
    assert uploader.close(5)
    assert len(calls) == 4 and outcomes == [None]
    delays = [float(d) for d in re.findall(r"retrying in ([0-9.]+) s", caplog.text)]
    assert delays == [0.01, 0.02, 0.04]


def test_a_job_that_keeps_failing_reports_its_last_error_once() -> None:
    uploader = Uploader(attempts=3, base_delay_s=0.01)
    calls, run = _flaky(100)
    outcomes: list[str | None] = []
    uploader.submit(Job("broken", run, outcomes.append))
    assert uploader.close(5)
    assert len(calls) == 3 and outcomes == ["cannot write: attempt 3 failed"]


def test_close_gives_up_waiting_after_its_grace_and_stops_retrying() -> None:
    uploader = Uploader(attempts=100, base_delay_s=30.0)
    calls, run = _flaky(100)
    outcomes: list[str | None] = []
    done = threading.Event()
    uploader.submit(Job("slow", run, lambda error: (outcomes.append(error), done.set())))
    assert not uploader.close(0.2)
    # Waiting out its backoff, the job hears of the shutdown and reports instead of retrying.
    assert done.wait(5) and len(calls) == 1 and outcomes[0].startswith("cannot write")
