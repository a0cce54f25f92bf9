"""The agent of one training process: it counts steps (torch's optimizer step hook, or
stepscope.step()), reads request.json, advances the capture at each step boundary, and keeps a
watchdog thread for heartbeats, hangs and captures of a loop that makes no step."""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import weakref

from .capture import Capture
from .decisions import HEARTBEAT_SECONDS, STEPLESS_AFTER_SECONDS, hangs, starts_stepless, watchdog_wait
from .files import unlink
from .log import log
from .session import Session
from .torch_hooks import track_ddp
from .vocabulary import answer_only, capture_request, wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stepscope.contracts.sidecar_api import CaptureRequest


# An idle agent looks for request.json at most this often. On this project's VMs a system call
# between two training steps costs the step ~10 us (the kernel's mitigations leave the caches and
# TLB cold for the torch work after it) against ~1 us in a tight loop: one stat a step was most
# of the idle agent's cost. Steps longer than this still stat once a step, and a request is seen
# at most this late.
REQUEST_POLL_SECONDS = 0.01
# How often the training thread reads DDP's own timing of its gradient all-reduce (12-60 us a
# read; DDP refreshes it every 100th iteration, so a tighter bound would only re-read the same sample).
COLLECTIVE_WAIT_READ_SECONDS = 2.0
# DDP times its first 10 iterations: until a step past them, a read that found nothing is retried
# at the next step rather than in 2 s (a DDP that never times, e.g. one never trained, costs no more).
COLLECTIVE_WAIT_EAGER_STEPS = 12
# DDP's first 10 timed iterations are its warm-up (bucket rebuild, first allocations; two healthy
# ranks' shares differed by 0.26-0.31 there), not the job's: the share starts at its 100th
# iteration. One sampled iteration stands for the next 100, so the heartbeat carries the lower
# median of the latest 3: one slow iteration (a GC pause) is not a rank's wait share.
COLLECTIVE_WAIT_FIRST_ITERATION = 10
COLLECTIVE_WAIT_SAMPLES = 3

_stat = os.stat
_monotonic = time.monotonic


def _envelope(raw: bytes) -> dict[str, Any] | None:
    """What a request this agent cannot take says of itself (its session, action, version), so that
    the answer goes where the sidecar looks; None where it is no JSON object."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class Agent(Capture):
    """Step counter, request reader and watchdog of one training process."""

    def __init__(self, directory: str, *, forked: bool = False) -> None:
        super().__init__(directory, forked=forked)
        self.request_path = os.path.join(directory, wire.REQUEST_FILE)
        self._ddp_models: weakref.WeakSet[Any] = weakref.WeakSet()
        self._wait_read_mono = float("-inf")
        self._wait_sample_at = 0.0
        self._wait_samples: dict[int, float] = {}  # DDP iteration -> its all-reduce seconds, the latest COLLECTIVE_WAIT_SAMPLES
        self._request_sig: tuple[int, int, int] | None = None
        self._polled_mono = float("-inf")
        self._handled: set[str] = set()
        self._lead: Any = lambda: None
        self._hook_handle: Any = None
        self._manual = False
        self._watchdog: threading.Thread | None = None
        self._stopping = threading.Event()
        self._failures_logged = 0

    # ---- torch attachment -------------------------------------------------------------------

    def attach_torch(self) -> None:
        """Register the optimizer step hook and start the watchdog; called once torch is imported."""
        if self._torch_ready:
            return
        self._torch_ready = True
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            if not self._manual:
                self._hook_handle = register_optimizer_step_post_hook(self._on_optimizer_step)
        except Exception:
            log.exception("stepscope agent: cannot register the optimizer step hook; only stepscope.step() counts steps")
        try:
            track_ddp(self._ddp_models)
        except Exception:
            log.exception("stepscope agent: cannot follow DistributedDataParallel models; no collective wait share")
        if not self._forked:
            self._start_watchdog()

    def _start_watchdog(self) -> None:
        if self._watchdog is not None:
            return
        self._watchdog = threading.Thread(target=self._watch, name="stepscope-watchdog", daemon=True)
        self._watchdog.start()
        atexit.register(self._at_exit)
        # multiprocessing's children leave through os._exit, which skips atexit, after running its own
        # exit finalizers (registered only now: a child clears its parent's when it starts).
        mp = sys.modules.get("multiprocessing.process")
        mp_util = sys.modules.get("multiprocessing.util")
        if mp is not None and mp_util is not None and mp.parent_process() is not None:
            mp_util.Finalize(None, self._at_exit, exitpriority=0)

    def _read_collective_wait(self) -> bool:
        """Fold DDP's latest timed iteration of its gradient all-reduce into the heartbeat's
        collectiveWait; False while DDP has timed none. On the training thread, between two steps:
        DDP writes these figures on that thread too (in its next forward), so reading them there
        never races with the writer."""
        timed = False
        for model in list(self._ddp_models):
            try:
                data = model._get_ddp_logging_data()
            except Exception:  # a torch whose DDP keeps no such figures: stop asking this model
                self._ddp_models.discard(model)
                log.exception("stepscope agent: no collective wait share from %s", type(model).__name__)
                continue
            seconds, end, iteration = data.get("backward_comm_time"), data.get("backward_comm_time_end"), data.get("iteration")
            if isinstance(seconds, int) and isinstance(end, int) and isinstance(iteration, int) and seconds > 0:
                timed = True
                if iteration >= COLLECTIVE_WAIT_FIRST_ITERATION:
                    self._wait_samples[iteration] = seconds / 1e9
                    self._wait_sample_at = end / 1e9
        latest = sorted(self._wait_samples)[-COLLECTIVE_WAIT_SAMPLES:]
        self._wait_samples = {i: self._wait_samples[i] for i in latest}
        if latest:
            values = sorted(self._wait_samples.values())
            self.collective_wait = {"seconds": values[(len(values) - 1) // 2], "at": self._wait_sample_at}
        return timed

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        lead = self._lead()
        if lead is not optimizer:
            if lead is not None:
                return
            self._lead = weakref.ref(optimizer)
        self.boundary()

    def manual_step(self) -> None:
        if not self._manual:
            self._manual = True
            if self._hook_handle is not None:
                self._hook_handle.remove()
                self._hook_handle = None
        self.boundary()

    # ---- the step boundary (hot path) -------------------------------------------------------

    def boundary(self) -> None:
        """One completed step: a stat of request.json while idle (at most every REQUEST_POLL_SECONDS),
        profiler steps while capturing."""
        try:
            now = _monotonic()
            self.step_count += 1
            self.ring.record(self.step_count, now, now - self.last_step_mono)
            self.last_step_mono = now
            if self._watchdog is None:
                self._start_watchdog()
            if now - self._wait_read_mono >= COLLECTIVE_WAIT_READ_SECONDS and self._ddp_models and (
                    self._read_collective_wait() or self.step_count > COLLECTIVE_WAIT_EAGER_STEPS):
                self._wait_read_mono = now
            if self._session is not None or now - self._polled_mono >= REQUEST_POLL_SECONDS:
                self._polled_mono = now
                try:
                    st = _stat(self.request_path)
                    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
                except OSError:
                    sig = None
                if sig != self._request_sig:
                    with self._lock:
                        self._read_request(sig)
            if self._session is not None:
                with self._lock:
                    self._advance_or_fail()
        except Exception:  # noqa: BLE001 - the agent never raises into the training loop
            self._log_failure("step boundary")

    def _log_failure(self, where: str) -> None:
        # Bounded: a failure that repeats every step must not flood the training log.
        self._failures_logged += 1
        if self._failures_logged <= 5:
            log.exception("stepscope agent: %s failed; training goes on", where)

    # ---- requests ---------------------------------------------------------------------------

    def _read_request(self, sig: tuple[int, int, int] | None) -> None:
        if sig == self._request_sig:
            return
        self._request_sig = sig
        if sig is None:
            return
        try:
            with open(self.request_path, "rb") as f:
                raw = f.read()
        except OSError as e:
            log.warning("stepscope agent: cannot read %s: %s", self.request_path, e)
            return
        problem: ValueError | None = None
        try:
            request: CaptureRequest | None = capture_request(raw)
        except ValueError as e:  # not a request this agent can take: answered below, where its session is named
            request, problem = None, e
        envelope = _envelope(raw) if request is None else {"session": request.session, "action": request.action, "version": request.version}
        if envelope is None:
            log.warning("stepscope agent: cannot read %s: %s", self.request_path, problem)
            return
        session_id = envelope.get("session")
        if not wire.valid_session_id(session_id):
            log.warning("stepscope agent: request.json has no usable session id (%r); ignored", session_id)
            return
        action = envelope.get("action")
        active = self._session
        folder = os.path.join(self.directory, session_id)
        if action == "cancel":
            if active is not None and active.id == session_id:
                active.cancel = True
            elif session_id not in self._handled and not self._already_final(folder):
                self._handled.add(session_id)
                self._answer_without_capture(session_id, folder, wire.CANCELLED, "cancelled before the capture request reached this rank")
            return
        if session_id in self._handled or (active is not None and active.id == session_id):
            return
        self._handled.add(session_id)
        if action != "capture" or envelope.get("version") != wire.WIRE_VERSION:
            self._answer_without_capture(session_id, folder, wire.FAILED, f"unsupported request: version {envelope.get('version')!r}, action {action!r} (this agent speaks version {wire.WIRE_VERSION}, actions capture and cancel)")
            return
        if active is not None:
            self._answer_without_capture(session_id, folder, wire.REFUSED, f"session {active.id} is still active on this rank ({active.state}); one session at a time")
            return
        if self._already_final(folder):
            return
        if request is None:
            self._answer_without_capture(session_id, folder, wire.FAILED, f"bad capture request: {problem}")
            return
        session = Session(request, self.step_count, folder)
        self._session = session
        self._write_state(session, message=f"triggered at step {session.trigger_step}; capturing from step {session.start_at}")

    def _already_final(self, folder: str) -> bool:
        """A state file already final for this rank means an earlier process of it answered (restart)."""
        try:
            with open(self._state_path(folder), "rb") as f:
                return json.loads(f.read()).get("state") in wire.FINAL_STATES
        except (OSError, ValueError, AttributeError):
            return False

    def _answer_without_capture(self, session_id: str, folder: str, state: str, reason: str) -> None:
        log.warning("stepscope agent: session %s %s: %s", session_id, state, reason)
        answer = Session(answer_only(session_id), self.step_count, folder)
        answer.state = state
        answer.error = None if state == wire.CANCELLED else reason
        self._write_state(answer, message=reason)

    # ---- the watchdog thread ----------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stopping.is_set():
            wait = HEARTBEAT_SECONDS
            try:
                # No shared directory (not mounted): nothing to answer, and nothing to create.
                if os.path.isdir(self.directory) and self._known_training_process():
                    with self._lock:
                        # Under the lock, so that no beat comes after _at_exit removed the file.
                        if self._stopping.is_set():
                            return
                        self._heartbeat()
                    wait = self._watch_tick()
            except Exception:  # noqa: BLE001 - the watchdog thread must outlive any one tick's bug
                self._log_failure("watchdog")
            self._stopping.wait(wait)

    def _watch_tick(self) -> float:
        """Hang check, plus request reading and stepless captures when no steps flow; returns the next wait."""
        since_step = _monotonic() - self.last_step_mono
        if since_step >= STEPLESS_AFTER_SECONDS or self.step_count == 0:
            try:
                st = _stat(self.request_path)
                sig: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
            except OSError:
                sig = None
            with self._lock:
                self._read_request(sig)
        with self._lock:
            s = self._session
            if s is None:
                return HEARTBEAT_SECONDS
            if starts_stepless(s.view(), self._tick(s, memory=False)):
                s.on_watchdog = True
                s.notes.append("no step boundary came: profiling started and stopped by the agent's watchdog thread")
                if s.wait_steps:
                    s.notes.append(f"waitSteps={s.wait_steps} ignored without steps")
                self._start_profiler(s)
                if s.prof is not None and not s.all_threads:
                    s.notes.append("this torch records operator (aten) events only of the profiler's own thread, so none of the training thread's, and Python function events (withStack) of every thread")
            if self._cancel_unstarted(s):
                return HEARTBEAT_SECONDS
            wait = HEARTBEAT_SECONDS
            if s.on_watchdog or s.all_threads:
                self._advance_or_fail(on_watchdog=True)
                wait = watchdog_wait(s.view(), self._tick(s, memory=False))  # to end the duration when it runs out
                if s.on_watchdog:
                    return wait
            if hangs(s.view(), self._tick(s, memory=False)):
                s.hung = True
                s.hung_step = self.step_count
                s.state = wire.HUNG
                try:
                    self._write_stacks(s, since_step)
                except Exception as e:
                    s.error = f"cannot write stacks: {e}"
                    log.exception("stepscope agent: cannot write the stacks of session %s", s.id)
                log.warning("stepscope agent: no step for %.1f s in session %s; stacks in %s", since_step, s.id, s.stacks)
                self._write_state(s, message=f"no step completed for {since_step:.1f} s (hangTimeoutSeconds {s.hang_timeout:g}) after step {self.step_count}")
        return wait

    def _at_exit(self) -> None:
        # Once: a multiprocessing child that leaves through sys.exit runs it from both exit hooks.
        if os.getpid() != self.pid or self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            s = self._session
            if s is not None and s.prof is not None and (not s.on_watchdog or s.all_threads):
                s.error = f"process exited after {self.step_count - (s.start_step or 0)} captured step(s)"
                # Export here: a thread started on the way out is not waited for.
                self._stop_profiler(s, wire.FAILED, background=False)
            elif s is not None and s.state in (wire.WAITING, wire.CAPTURING, wire.HUNG):  # a `writing` one finishes its export
                s.error = f"process exited at step {self.step_count} before the capture finished"
                self._finish(s, wire.FAILED, message=s.error)
            unlink(os.path.join(self.directory, wire.AGENTS_FOLDER, wire.agent_file(self.identity()[0])))
            self.ring.remove()


