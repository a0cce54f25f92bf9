"""One rank's identity and progress, and the files it writes to the shared directory: its state in
each session, its heartbeat (with the step ring it publishes) and the stacks of a hang."""
from __future__ import annotations

import os
import sys
import threading
import time

from . import environment
from .files import write_json
from .log import log
from .stacks import thread_stacks
from .step_ring import StepRing
from .torch_hooks import cuda_device
from .vocabulary import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .session import Session


class Rank:
    """The state the agent's parts share: steps counted, the active session, the lock that orders
    the training thread and the watchdog, and who this process is."""

    def __init__(self, directory: str, *, forked: bool = False) -> None:
        self.directory = directory
        self.step_count = 0
        self.last_step_mono = time.monotonic()
        self.ring = StepRing()
        self._ring_refused = False
        self.collective_wait: dict[str, float] | None = None  # the heartbeat's collectiveWait
        self.started_at = time.time()
        self.pid = os.getpid()
        # multiprocessing's spawn replaces sys.argv before it says a process is its child; at
        # interpreter start, a spawned child still has the marker on its command line.
        self._spawned_child = "--multiprocessing-fork" in getattr(sys, "argv", ())
        # A forked child inherits RANK and even an initialized torch.distributed from its parent, so
        # only its own steps show that it trains; it starts its watchdog at its first step.
        self._forked = forked
        self.host = os.uname().nodename
        self._session: Session | None = None
        self._lock = threading.RLock()
        self._torch_ready = False
        self._identity: tuple[int, int, int] | None = None
        self._identity_certain = False

    def identity(self) -> tuple[int, int, int]:
        """(rank, local rank, world size): torchrun's environment, else torch.distributed, else 0/0/1."""
        if self._identity_certain and self._identity is not None:
            return self._identity
        launched = environment.launcher_identity()
        if launched is not None:
            self._identity, self._identity_certain = launched, True
            return launched
        dist = sys.modules.get("torch.distributed")
        if dist is not None and self._torch_ready:
            try:
                if dist.is_available() and dist.is_initialized():
                    rank = dist.get_rank()
                    self._identity = (rank, environment.local_rank(rank), dist.get_world_size())
                    self._identity_certain = True
                    return self._identity
            except Exception:  # noqa: BLE001 - torch.distributed in any state: the rank falls back to the environment's
                pass
        self._identity = (0, 0, 1)
        return self._identity

    def _known_training_process(self) -> bool:
        """Only training processes register and answer requests: one that stepped or set up
        torch.distributed, or one with torchrun's RANK that is no multiprocessing child (data loader
        workers inherit RANK). A launcher such as torchrun imports torch too, without RANK."""
        if self.step_count > 0:
            return True
        self.identity()
        if not self._identity_certain:
            return False
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return True
        mp = sys.modules.get("multiprocessing.process")
        return not self._spawned_child and not self._forked and (mp is None or mp.parent_process() is None)

    def _state_path(self, folder: str) -> str:
        return os.path.join(folder, wire.state_file(self.identity()[0]))

    def _write_state(self, s: Session, *, message: str) -> None:
        rank, local_rank, world = self.identity()
        captured = (s.end_step if s.end_step is not None else self.step_count) - s.start_step if s.start_step is not None else 0
        notes = "; ".join([*s.degraded, *s.notes])
        if s.gpu[0] < 0:
            s.gpu = cuda_device()
        state = {
            "version": wire.WIRE_VERSION, "session": s.id, "rank": rank, "localRank": local_rank, "worldSize": world,
            "pid": os.getpid(), "host": self.host, "state": s.state, "step": self.step_count,
            "triggerStep": s.trigger_step, "startStep": s.start_step, "endStep": s.end_step, "capturedSteps": captured,
            "startTime": s.start_time, "endTime": s.end_time, "updatedAt": time.time(),
            "trace": s.trace, "stacks": s.stacks, "error": s.error, "message": f"{message}; {notes}" if notes else message,
            "gpu": s.gpu[0], "gpuUuid": s.gpu[1], "degraded": s.degraded, "withStack": s.with_stack,
        }
        try:
            os.makedirs(s.folder, exist_ok=True)
            write_json(self._state_path(s.folder), state)
        except OSError as e:
            log.error("stepscope agent: cannot write the state of session %s (%s): %s", s.id, s.state, e)

    def _heartbeat(self) -> None:
        rank, local_rank, world = self.identity()
        folder = os.path.join(self.directory, wire.AGENTS_FOLDER)
        os.makedirs(folder, exist_ok=True)
        write_json(os.path.join(folder, wire.agent_file(rank)), {
            "rank": rank, "localRank": local_rank, "worldSize": world, "pid": os.getpid(), "host": self.host,
            "step": self.step_count, "heartbeat": time.time(), "startedAt": self.started_at, "collectiveWait": self.collective_wait,
        })
        ring_path = os.path.join(self.directory, wire.TELEMETRY_FOLDER, wire.telemetry_file(rank))
        if self.ring.path != ring_path and not self._ring_refused:
            try:
                self.ring.publish(ring_path, rank, local_rank, world)
            except (OSError, ValueError) as e:
                # Once: the rest of the watchdog's round (requests, hangs) must not fail with it.
                self._ring_refused = True
                log.warning("stepscope agent: no step telemetry: cannot map %s: %s", ring_path, e)

    def _write_stacks(self, s: Session, since_step: float) -> None:
        rank = self.identity()[0]
        name = wire.stacks_file(rank)
        os.makedirs(s.folder, exist_ok=True)
        write_json(os.path.join(s.folder, name), {
            "version": wire.WIRE_VERSION, "rank": rank, "pid": os.getpid(), "host": self.host, "session": s.id,
            "step": self.step_count, "secondsSinceStep": round(since_step, 3), "time": time.time(), "threads": thread_stacks(),
        })
        s.stacks = name

