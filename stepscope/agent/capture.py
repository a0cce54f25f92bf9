"""The capture on one rank: the decisions (decisions.py) applied to torch.profiler, with the
capture budget (a probe step that counts Python calls, a memory bound), the trace's export off the
training thread, and the session's final state."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from .budget import CallCounter, release_memory, rss_mb
from .decisions import CANCEL_UNSTARTED, PROBE, RESUME, START, STEP, Tick, cancels_unstarted, decide
from .log import log
from .rank import Rank
from .schedstat import SchedClock
from .stacks import StackSampler
from .torch_hooks import all_threads_config
from .vocabulary import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .session import Session


class Capture(Rank):
    """Drives the profiler of the active session; the agent calls it at step boundaries and from its watchdog."""

    def _advance_or_fail(self, *, on_watchdog: bool = False) -> None:
        """_advance, ending the session `failed` if it raises, so that a broken capture neither
        hangs in `capturing` nor fails again at every step."""
        try:
            self._advance(on_watchdog=on_watchdog)
        except Exception as e:
            s = self._session
            if s is None:
                raise
            prof, s.prof = s.prof, None
            if prof is not None:
                try:
                    prof.stop()
                except Exception:
                    log.debug("stepscope agent: the profiler did not stop cleanly", exc_info=True)
            self._fail(s, "capture", e)

    def _tick(self, s: Session, *, memory: bool = True) -> Tick:
        """Now; the process's growth only where a decision reads it (a read of /proc)."""
        grown = rss_mb() - s.rss_start_mb if memory and s.prof is not None else 0.0
        return Tick(self.step_count, time.monotonic(), self.last_step_mono, grown)

    def _advance(self, *, on_watchdog: bool = False) -> None:
        """Apply `decide` to the active session, at a step boundary or on a watchdog tick."""
        s = self._session
        if s is None:
            return
        tick = self._tick(s)
        for action in decide(s.view(), tick, on_watchdog):
            kind = action[0]
            if kind == RESUME:
                s.hung, s.state = False, action[1]
                self._write_state(s, message=f"steps resumed at step {self.step_count} after a hang")
            elif kind == CANCEL_UNSTARTED:
                self._finish(s, wire.CANCELLED, message=f"cancelled at step {self.step_count} before capture started")
            elif kind == PROBE:
                if self._probing(s):
                    return
            elif kind == START:
                self._start_profiler(s)
            elif kind == STEP:
                if s.sched is not None:
                    s.sched.mark(s.prof.step_num + 1)
                s.prof.step()
                if s.sampler is not None:
                    s.sampler.anchor(s.prof.step_num)
            else:
                _, final, over_memory, stepless = action
                if over_memory:
                    self._cut_for_memory(s, tick.grown_mb)
                if stepless:
                    s.notes.append(
                        f"no step boundary came after step {self.step_count - 1}: the watchdog thread stopped the "
                        "profiler, "
                        f"so ProfilerStep#{self.step_count} holds the part of step {self.step_count} recorded until "
                        "then"
                    )
                self._stop_profiler(s, final)

    def _probing(self, s: Session) -> bool:
        """The capture budget's first stage, before a withStack capture: count the Python calls of
        one step (the last wait step; one more step where none is left, a request that came with
        waitSteps 0 or that the watchdog read), and drop the stacks when the capture would record
        more than maxStackEvents of them: each costs the training thread time when the profiler
        stops. True while the probe step runs."""
        if s.probe is None:
            if sys.getprofile() is not None:
                s.probed = True  # the program profiles itself; the memory bound still holds
                s.notes.append("Python calls not counted before the capture: the program has its own sys.setprofile")
                return False
            s.probe = CallCounter()
            sys.setprofile(s.probe)
            if self.step_count >= s.start_at:
                s.notes.append(
                    "the capture started one step late: that step counted the Python calls for the capture budget"
                )
            return True
        sys.setprofile(None)
        s.probed = True
        calls, seconds = s.probe.calls, max(1e-6, time.monotonic() - s.probe.started)
        s.probe = None
        if s.steps is not None:
            projected, over = calls * s.steps, f"{calls:,} Python calls per step x {s.steps} steps"
        else:
            projected = int(calls / seconds * (s.duration or 0))
            over = f"{calls / seconds:,.0f} Python calls per second x {s.duration:g} s"
        if projected > s.capture.limits.maxStackEvents:
            s.with_stack = False
            # A few hundred samples of every thread's stack still name where the time goes
            # (a stepless program's probe ran on the watchdog thread, which is not worth sampling).
            s.sampler = None if s.on_watchdog else StackSampler(threading.get_ident(), s.capture.limits.maxStackEvents)
            instead = (
                ""
                if s.sampler is None
                else f", every thread's stack is sampled every {wire.STACK_SAMPLE_SECONDS * 1000:g} ms instead"
            )
            s.degraded.append(
                f"{wire.STACKS_DROPPED}: {over} = {projected:,} exceeds "
                f"capture.limits.maxStackEvents={s.capture.limits.maxStackEvents:,}{instead}; "
                "set capture.withStack=false or raise capture.limits.maxStackEvents"
            )
            log.warning("stepscope agent: session %s: %s", s.id, s.degraded[-1])
        return False

    def _cut_for_memory(self, s: Session, grown: float) -> None:
        """The budget's second stage: the capture is cut short once the process grew by more than
        maxMemoryMB since the profiler started (the profiler's buffers, mostly); say so."""
        captured = self.step_count - (s.start_step or 0)
        cut = (
            f"{captured} of {s.steps} steps"
            if s.steps is not None
            else f"{time.monotonic() - s.started_mono:.1f} of {s.duration:g} s ({captured} steps)"
        )
        s.degraded.append(
            f"capture cut after {cut}: the process grew {grown:,.0f} MB while profiling, "
            f"over capture.limits.maxMemoryMB={s.max_memory_mb:g}; capture fewer steps, set capture.withStack=false "
            "or raise capture.limits.maxMemoryMB"
        )
        log.warning("stepscope agent: session %s: %s", s.id, s.degraded[-1])

    def _cancel_unstarted(self, s: Session) -> bool:
        """Cancel a session whose profiler never started; any thread may, even while training hangs."""
        if not cancels_unstarted(s.view()):
            return False
        self._finish(s, wire.CANCELLED, message=f"cancelled at step {self.step_count} before capture started")
        return True

    def _start_profiler(self, s: Session) -> None:
        try:
            import torch
            from torch.profiler import ProfilerAction, ProfilerActivity, profile

            activities = []
            if "CPU" in s.capture.activities:
                activities.append(ProfilerActivity.CPU)
            if "CUDA" in s.capture.activities:
                if torch.cuda.is_available():
                    activities.append(ProfilerActivity.CUDA)
                else:
                    s.notes.append("CUDA was asked for but is not available in this process; CPU activities only")
            if not activities:
                activities.append(ProfilerActivity.CPU)
            os.makedirs(s.folder, exist_ok=True)
            # A duration may run out while the loop makes no step, so its profiler records every
            # thread and keeps its state process-wide: the watchdog can stop it (a thread-local one
            # ignores a stop from another thread, with only a warning).
            all_threads = all_threads_config() if s.duration is not None else None
            extra = {} if all_threads is None else {"experimental_config": all_threads}
            # A schedule that always records: without a schedule torch.profiler writes no
            # ProfilerStep#N annotations. Starting at step_num = steps done so far makes N the
            # step's zero-based index, the numbers of the state file's startStep/endStep.
            prof = profile(
                activities=activities,
                schedule=lambda _: ProfilerAction.RECORD,
                with_stack=s.with_stack,
                record_shapes=s.capture.recordShapes,
                profile_memory=s.capture.profileMemory,
                with_flops=s.capture.withFlops,
                **extra,
            )
            prof.step_num = self.step_count
            prof.start()
        except Exception as e:  # noqa: BLE001 - a profiler that cannot start fails the session, never the training
            self._fail(s, "profiler start", e)
            return
        s.prof = prof
        s.all_threads = all_threads is not None
        # The training thread's: the watchdog thread that starts a stepless capture is not it.
        s.sched = None if s.on_watchdog else SchedClock.of_this_thread()
        if s.sched is not None:
            s.sched.mark(prof.step_num)
        if s.sampler is not None:
            s.sampler.start(prof.step_num)
        s.state = wire.CAPTURING
        s.start_step = self.step_count
        s.start_time = time.time()
        s.started_mono = time.monotonic()
        s.rss_start_mb = rss_mb()
        what = f"{s.steps} steps" if s.steps is not None else f"{s.duration:g} s"
        self._write_state(s, message=f"capturing {what} from step {s.start_step}")

    def _stop_profiler(self, s: Session, final: str, *, background: bool = True) -> None:
        prof, s.prof = s.prof, None
        if s.sampler is not None:
            s.sampler.stop()
        s.end_step = self.step_count
        s.end_time = time.time()
        # `writing` before the stop: torch processes every recorded event in it, holding the GIL,
        # so no heartbeat comes until it returns and the sidecar must know the rank is exporting.
        s.state = wire.WRITING
        self._write_state(
            s,
            message=f"writing the trace of steps {s.start_step}..{s.end_step - 1}"
            if s.steps is not None
            else "writing the trace",
        )
        if s.sched is not None:
            s.sched.mark(s.end_step)
            s.sched.close()
        # Into the trace before the profiler stops (torch keeps metadata of the running session
        # only); the trace goes on without any of them, and so does the training.
        metadata = s.sched.metadata() if s.sched is not None else {}
        if s.gpu[1]:
            metadata[wire.GPU_KEY] = {"index": s.gpu[0], "uuid": s.gpu[1]}
        for key, value in metadata.items():
            try:
                prof.add_metadata_json(key, json.dumps(value))
            except Exception:
                log.debug("stepscope agent: %s was not written into the trace", key, exc_info=True)
        try:
            prof.stop()
        except Exception as e:  # noqa: BLE001 - a profiler that cannot stop fails the session, never the training
            self._fail(s, "profiler stop", e)
            return
        # The only reference to the profiler and its results, so that they are freed once written.
        held = [prof]
        del prof
        if not background:
            self._export(s, held, final)
            return
        # Exporting takes a while for a long capture; the training thread goes on meanwhile. Not a
        # daemon thread, so a process that ends right after its last step still writes its trace.
        threading.Thread(target=self._export, args=(s, held, final), name="stepscope-export", daemon=False).start()

    def _export(self, s: Session, held: list[Any], final: str) -> None:
        """Write the trace gzipped, then give the memory the capture took back to the system.
        torch (Kineto) writes its JSON only to a path, through a temporary file it renames over
        it (a FIFO there is replaced), so the raw JSON passes through the session folder."""
        try:
            self._write_trace(s, held.pop(), final)
        finally:
            held.clear()
            release_memory()

    def _write_trace(self, s: Session, prof: Any, final: str) -> None:
        import gzip
        import shutil

        name = wire.trace_file(self.identity()[0])
        raw = os.path.join(s.folder, f".{name}.{os.getpid()}.json")
        packed = os.path.join(s.folder, f".{name}.{os.getpid()}.tmp")
        try:
            prof.export_chrome_trace(raw)
            if s.sampler is not None and s.sampler.samples:
                # A trace without Python stacks is small: reading it whole costs little.
                with open(raw, "rb") as src:
                    trace = json.load(src)
                trace["traceEvents"].extend(s.sampler.events(trace["traceEvents"]))
                with gzip.open(packed, "wt", compresslevel=6) as out:
                    json.dump(trace, out)
            else:
                with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(packed, os.path.join(s.folder, name))
        except Exception as e:  # noqa: BLE001 - a trace that cannot be written fails the session, never the training
            with self._lock:
                self._fail(s, "trace export", e)
            return
        finally:
            for leftover in (raw, packed):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
        s.trace = name
        start, end = s.start_step or 0, s.end_step or 0  # both set when the profiler stopped
        captured = f"{end - start} steps ({start}..{end - 1})"
        if s.steps is None:
            captured = f"{(s.end_time or 0.0) - (s.start_time or 0.0):.2f} s, {captured}"
        with self._lock:
            self._finish(s, final, message=f"captured {captured}" + (", cancelled" if final == wire.CANCELLED else ""))

    def _fail(self, s: Session, what: str, error: Exception) -> None:
        log.error("stepscope agent: %s failed in session %s; training goes on", what, s.id, exc_info=error)
        s.error = f"{what} failed: {type(error).__name__}: {error}"
        self._finish(s, wire.FAILED, message=s.error)

    def _finish(self, s: Session, state: str, *, message: str) -> None:
        if s.probe is not None:
            s.probe.active = False  # it removes itself on the training thread's next call
        if s.sampler is not None:
            s.sampler.stop()
        if s.sched is not None:
            s.sched.close()
        s.state = state
        if s.end_time is None:
            s.end_time = time.time()
        self._write_state(s, message=message)
        if self._session is s:
            self._session = None
