"""The sidecar's upload worker: one run and one outcome per job, bounded shutdown."""

from __future__ import annotations

import threading

from stepscope.sidecar.uploads import Job, Uploader
from stepscope.storage import StoreError


def _flaky(failures: int) -> tuple[list[int], object]:
    calls: list[int] = []

    def run() -> None:
        calls.append(1)
        if len(calls) <= failures:
            raise StoreError(f"cannot write: attempt {len(calls)} failed")

    return calls, run


def test_a_failing_job_runs_once_and_reports_its_reason() -> None:
    """The store retries what it knows to be transient; a permanent error (access denied) must not
    be retried again here, nor anything else a job raises."""
    uploader = Uploader()
    calls, run = _flaky(100)
    outcomes: list[str | None] = []
    uploader.submit(Job("denied", run, outcomes.append))
    ok_calls, ok = _flaky(0)
    uploader.submit(Job("fine", ok, outcomes.append))
    assert uploader.close(5)
    assert len(calls) == 1 and outcomes == ["cannot write: attempt 1 failed", None] and len(ok_calls) == 1


def test_close_gives_up_waiting_after_its_grace() -> None:
    release = threading.Event()
    outcomes: list[str | None] = []
    uploader = Uploader()
    uploader.submit(Job("slow", lambda: release.wait(5) and None, outcomes.append))
    assert not uploader.close(0.2)
    release.set()
