"""The sidecar's upload worker: one background thread that runs upload jobs in order, so that a
slow or failing store never blocks the control endpoint or the training processes. It does not
retry: the store retries what it classifies as transient (stepscope.retry, one layer), and a job
that still fails reports its reason at once."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from stepscope.storage import StoreError

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One unit of upload work. `run` does it (raising on failure); `done` hears the outcome
    exactly once, with None on success or the error's message."""

    description: str
    run: Callable[[], None]
    done: Callable[[str | None], None]


class Uploader:
    def __init__(self) -> None:
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="stepscope-uploader", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def close(self, timeout_s: float) -> bool:
        """Finish queued jobs for up to `timeout_s`, then give up waiting; True when all finished.
        Unfinished jobs leave their local files in place for a later run to find."""
        self._queue.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                job.done(self._attempt(job))
            except Exception:  # the worker must outlive any one job's bug (logged with its traceback)
                log.exception("upload job %s crashed", job and job.description)
            finally:
                self._queue.task_done()

    @staticmethod
    def _attempt(job: Job) -> str | None:
        try:
            job.run()
            return None
        except Exception as exc:  # noqa: BLE001 - reported through job.done
            error = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
            log.error("%s failed: %s", job.description, error)
            return error
