"""The sidecar's upload worker: one background thread that runs upload jobs in order, retrying
each with exponential backoff, so that a slow or failing store never blocks the control endpoint
or the training processes."""
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
    exactly once, with None on success or the last error's message."""
    description: str
    run: Callable[[], None]
    done: Callable[[str | None], None]


class Uploader:
    def __init__(self, *, attempts: int = 6, base_delay_s: float = 2.0, max_delay_s: float = 60.0) -> None:
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._attempts = attempts
        self._base_delay_s = base_delay_s
        self._max_delay_s = max_delay_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._work, name="stepscope-uploader", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def close(self, timeout_s: float) -> bool:
        """Finish queued jobs for up to `timeout_s`, then give up waiting; True when all finished.
        Unfinished jobs leave their local files in place for a later run to find."""
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._stopping.set()
        return not self._thread.is_alive()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                job.done(self._attempt(job))
            except Exception:  # noqa: BLE001 - the worker must outlive any one job's bug
                log.exception("upload job %s crashed", job and job.description)
            finally:
                self._queue.task_done()

    def _attempt(self, job: Job) -> str | None:
        delay, attempt = self._base_delay_s, 0
        while True:
            attempt += 1
            try:
                job.run()
                return None
            except Exception as exc:  # noqa: BLE001 - reported through job.done
                error = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
                if attempt >= self._attempts or self._stopping.is_set():
                    log.error("%s failed after %d attempt(s): %s", job.description, attempt, error)
                    return error
                log.warning("%s failed (attempt %d/%d), retrying in %g s: %s", job.description, attempt, self._attempts, delay, error)
                if self._stopping.wait(delay):
                    return error
                delay = min(delay * 2, self._max_delay_s)
