"""One capture request on this rank, read from request.json with the spec's defaults for what a
hand-written request leaves out, and its progress from trigger to a final state."""

from __future__ import annotations

import time

from .decisions import CaptureView
from .vocabulary import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stepscope.contracts.sidecar_api import CaptureRequest

    from .budget import CallCounter
    from .schedstat import SchedClock
    from .stacks import StackSampler

# How many steps past its own waitSteps a rank follows a request's startStep: room for the steps a
# job makes while the fan-out reaches every pod (10 s of 100-ms steps; a faster loop falls back to
# unaligned starts, as without startStep), far less than a restarted rank is behind.
ALIGN_SLACK_STEPS = 100


class Session:
    """One capture request on this rank, from trigger to a final state."""

    def __init__(self, parsed: CaptureRequest, trigger_step: int, folder: str) -> None:
        self.id: str = parsed.session
        self.folder = folder
        self.capture = parsed.capture  # the spec's own type, its defaults filled in (stepscope.contracts.session)
        self.hang_timeout = float(parsed.hangTimeoutSeconds)
        self.with_stack = self.capture.withStack  # the capture budget may drop the stacks
        self.probe: CallCounter | None = None  # counts one step's Python calls before a withStack capture
        self.probed = False
        self.sampler: StackSampler | None = None  # samples the training thread where the budget dropped its stacks
        self.sched: SchedClock | None = None  # the training thread's scheduler times at its step boundaries
        self.rss_start_mb = 0.0
        self.state = wire.WAITING
        self.trigger_step = trigger_step
        # The step the capture begins at: the request's absolute startStep, which the sidecar and
        # operator set alike for every rank of a job so that all ranks capture the same steps
        # (DDP ranks step in lockstep); a rank already past it begins at its next step.
        # A startStep far beyond this rank's own count (its process restarted, or it counts steps
        # differently) would never come within the session: then it waits as if none were given.
        start = parsed.startStep
        start_at = trigger_step + self.wait_steps
        if start is not None and start <= start_at + ALIGN_SLACK_STEPS:
            start_at = max(start, trigger_step)
        self.start_at = start_at
        self.start_step: int | None = None
        self.end_step: int | None = None
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.started_mono = 0.0
        self.triggered_mono = time.monotonic()
        self.prof: Any = None
        self.on_watchdog = False  # started outside step boundaries, by the watchdog thread
        self.all_threads = False  # the profiler records every thread, and any thread may stop it
        self.cancel = False
        self.hung = False
        self.hung_step = 0
        self.trace: str | None = None
        self.stacks: str | None = None
        self.error: str | None = None
        self.notes: list[str] = []
        self.degraded: list[str] = []  # what the capture budget dropped or cut, and why
        self.gpu: tuple[int, str] = (-1, "")  # (CUDA index, UUID) once the program has initialised CUDA

    @property
    def wait_steps(self) -> int:
        return self.capture.waitSteps

    @property
    def steps(self) -> int | None:
        return self.capture.steps

    @property
    def duration(self) -> float | None:
        return self.capture.durationSeconds

    @property
    def max_memory_mb(self) -> float:
        return float(self.capture.limits.maxMemoryMB)

    def view(self) -> CaptureView:
        return CaptureView(
            self.state,
            self.prof is not None,
            self.on_watchdog,
            self.all_threads,
            self.cancel,
            self.hung,
            self.hung_step,
            self.start_at,
            self.start_step,
            self.steps,
            self.duration,
            self.started_mono,
            self.triggered_mono,
            self.with_stack,
            self.probed,
            self.probe is not None,
            self.max_memory_mb,
            self.hang_timeout,
        )
