"""The in-process agent: counts training steps and captures the steps a sidecar asks for.

This file is copied into the pod's shared directory as `bootstrap/stepscope_agent.py` and loaded
by the bootstrap `sitecustomize` of every Python process in the pod, so it imports only the
standard library at start and touches torch only once the program has imported torch itself
(an import hook on `torch`). docs/wire.md fixes the files it reads and writes.

Each step boundary also records the step's time in the rank's step ring
(`telemetry/rank-<r>.steps`, docs/wire.md "Step telemetry"), which the sidecar serves as
metrics: two struct writes into a memory map, always on. Every 2 s a boundary also reads the
timing DistributedDataParallel keeps of its own gradient all-reduce, which the heartbeat carries
(`collectiveWait`) and the sidecar turns into the rank's wait share.

Steps are the calls of torch's global optimizer step post-hook (one optimizer leads, so several
optimizers still count one step), or `step()` calls for loops without an optimizer; the first
`step()` switches the hook off. Step indices are zero-based: a capture from startStep to endStep
records steps startStep..endStep-1, annotated ProfilerStep#startStep..#endStep-1.

What torch.profiler records depends on the thread that starts it: by default its state is
thread-local, so operator (aten) events come only from that thread (and threads that inherit its
profiling state, such as autograd's), Python function events (withStack) from every thread, and
a stop from any other thread is ignored (torch only warns). So captures start and stop at step
boundaries, on the training thread. A durationSeconds capture must also end when its time is up
while the loop makes no step (it blocks in data loading, or sits between epochs), so it uses
torch's profile_all_threads instead: process-wide state that records every thread's operators
and that any thread may stop (torch's own distributed debug handler profiles that way from a
server thread). The watchdog thread stops it, under the agent's lock so never during the
training thread's profiler step, once the duration is over and no step boundary came for 1 s
(STEPLESS_AFTER_SECONDS; a loop that still steps gets that long to end it on a boundary). Its
trace then ends inside the step in progress: ProfilerStep#endStep holds the part recorded, and
the state message says so. A durationSeconds capture in a process that reaches no step boundary
at all (none for 1 s, or 10 s before a first step, STEPSCOPE_FIRST_STEP_GRACE_SECONDS) is
started and stopped by the watchdog thread. A torch without profile_all_threads keeps the
thread-local profiler: its duration captures end at the next step boundary (or hang), and a
stepless one holds every thread's Python functions but none of the training thread's operators,
as its state message says.

The agent answers requests only in processes known to train (a step seen, torch.distributed
initialized, or RANK set in a process that is no multiprocessing child), so a launcher that
imports torch (torchrun) and data loader workers stay quiet. A forked child (os.fork, or
multiprocessing's fork start method) inherits the agent without its threads, so it re-arms an
agent of its own: its own step count, pid and rank (RANK from its environment, else its
torch.distributed rank); as a forked data loader worker shares its parent's RANK and process
group, a forked child registers and answers only from its first step, which also starts its
watchdog. It never raises into the training loop: a failure is logged ("stepscope.agent") and
written to the session's state file.
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import struct
import sys
import threading
import time
import weakref

if __package__:  # stepscope.sidecar.agent, imported from the stepscope package
    from stepscope.contracts import wire
else:  # the bootstrap's copy (stepscope_agent), beside the bootstrap's stepscope_wire
    import stepscope_wire as wire  # type: ignore[no-redef,import-not-found]  # only a training pod has this copy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any



class _LazyLogger:
    """The "stepscope.agent" logger, imported on first use: every Python process in the pod loads
    this module at start, and most never log."""

    def __getattr__(self, name: str) -> Any:
        import logging

        return getattr(logging.getLogger("stepscope.agent"), name)


log = _LazyLogger()

HEARTBEAT_SECONDS = 1.0
# A loop that has not reached a step boundary for this long gets its requests read by the
# watchdog thread instead, so durationSeconds captures work without steps. Before its first step
# a process may still be starting (rendezvous, model setup), so it gets longer to show it steps.
STEPLESS_AFTER_SECONDS = 1.0
FIRST_STEP_GRACE_SECONDS = float(os.environ.get("STEPSCOPE_FIRST_STEP_GRACE_SECONDS", "10"))

# An idle agent looks for request.json at most this often. On this project's VMs a system call
# between two training steps costs the step ~10 us (the kernel's mitigations leave the caches and
# TLB cold for the torch work after it) against ~1 us in a tight loop: one stat a step was most
# of the idle agent's cost. Steps longer than this still stat once a step, and a request is seen
# at most this late.
REQUEST_POLL_SECONDS = 0.01
# How many steps past its own waitSteps a rank follows a request's startStep: room for the steps a
# job makes while the fan-out reaches every pod (10 s of 100-ms steps; a faster loop falls back to
# unaligned starts, as without startStep), far less than a restarted rank is behind.
ALIGN_SLACK_STEPS = 100
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


def _atomic_write(path: str, data: bytes) -> None:
    tmp = f"{os.path.join(os.path.dirname(path), '.' + os.path.basename(path))}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_json(path: str, obj: dict[str, Any]) -> None:
    _atomic_write(path, json.dumps(obj, separators=(",", ":")).encode())


class _StepRing:
    """This process's step telemetry (docs/wire.md, "Step telemetry"): a buffer in memory until
    the watchdog knows the rank and maps the ring file, then that file's memory, so that a step
    costs two struct writes and no system call."""

    def __init__(self) -> None:
        slot = struct.Struct(wire.TELEMETRY_SLOT)
        self._pack_slot = slot.pack_into
        self._pack_count = struct.Struct(wire.TELEMETRY_COUNT).pack_into
        self._slot_size = slot.size
        self._mask = wire.TELEMETRY_CAPACITY - 1
        # Looked up once here: record() runs in the step hook.
        self._slots_at, self._count_at = wire.TELEMETRY_SLOTS_AT, wire.TELEMETRY_COUNT_AT
        self.buffer: Any = bytearray(wire.TELEMETRY_SLOTS_AT + wire.TELEMETRY_CAPACITY * slot.size)
        self.path: str | None = None
        self.run_id = int.from_bytes(os.urandom(8), "little") >> 1 or 1

    def record(self, step: int, end: float, duration: float) -> None:
        buffer = self.buffer
        self._pack_slot(buffer, self._slots_at + (step & self._mask) * self._slot_size, step, end, duration)
        self._pack_count(buffer, self._count_at, step)

    def publish(self, path: str, rank: int, local_rank: int, world: int) -> None:
        """Write the steps so far to `path` under this identity and record into the file from now on."""
        import mmap

        data = bytearray(self.buffer)
        struct.pack_into(wire.TELEMETRY_HEADER, data, 0, wire.TELEMETRY_MAGIC.encode(), wire.TELEMETRY_CAPACITY, rank, local_rank,
                         world, os.getpid(), time.time() - _monotonic(), self.run_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _atomic_write(path, bytes(data))
        with open(path, "r+b") as f:
            mapped = mmap.mmap(f.fileno(), len(data))
        # The steps recorded between the copy and the switch are lost; the reader skips their slots.
        self.buffer, old = mapped, self.path
        self.path = path
        if old is not None and old != path:
            _unlink(old)

    def remove(self) -> None:
        if self.path is not None:
            _unlink(self.path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def thread_stacks() -> list[dict[str, Any]]:
    """Every thread's Python stack, outermost frame first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads: list[dict[str, Any]] = []
    for ident, top in sys._current_frames().items():
        frames: list[dict[str, Any]] = []
        frame: FrameType | None = top
        while frame is not None:
            frames.append({"file": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name})
            frame = frame.f_back
        frames.reverse()
        threads.append({"id": ident, "name": names.get(ident, f"thread-{ident}"), "main": ident == main, "frames": frames})
    return threads


# ---- the capture's decisions, pure ------------------------------------------------------------
# What to do with the active session at a step boundary or a watchdog tick is decided by pure
# functions over a snapshot of it (CaptureView) and of the moment (Tick); the Agent below applies
# the actions (profiler, state file, stacks). tests/agent/test_decisions.py drives each one.
# namedtuples and plain tuples, not dataclasses: every Python process of the pod imports this file,
# and dataclasses would cost each ~9 ms at start.

CaptureView = collections.namedtuple("CaptureView", (
    "state", "profiling", "on_watchdog", "all_threads", "cancel", "hung", "hung_step", "start_at", "start_step", "steps", "duration",
    "started_mono", "triggered_mono", "with_stack", "probed", "probing", "max_memory_mb", "hang_timeout"))
# The moment: steps completed, CLOCK_MONOTONIC now and at the last step boundary, and how much the
# process grew since the profiler started (MB; 0 while none runs).
Tick = collections.namedtuple("Tick", ("step", "mono", "last_step_mono", "grown_mb"))

# Actions, as tuples led by their name:
RESUME = "resume"  # (RESUME, state): steps came again after a hang; back to `state`
CANCEL_UNSTARTED = "cancel-unstarted"  # (CANCEL_UNSTARTED,): cancelled before the profiler started
PROBE = "probe"  # (PROBE,): run or end the capture budget's probe step; nothing more while it runs
START = "start"  # (START,): start the profiler
STEP = "step"  # (STEP,): one profiler step
STOP = "stop"  # (STOP, final state, over the memory budget, stopped off a step boundary)


def cancels_unstarted(v: CaptureView, state: str | None = None) -> bool:
    """A cancelled session whose profiler never started ends at once, from any thread."""
    return bool(v.cancel) and not v.profiling and (state or v.state) in (wire.WAITING, wire.HUNG)


def decide(v: CaptureView, t: Tick, on_watchdog: bool) -> list[tuple[Any, ...]]:
    """The session's next move, at a step boundary (on_watchdog False) or a watchdog tick. A
    profiler is stepped and stopped by the thread that started it, except that the watchdog ends
    an all-threads capture that no step boundary ends."""
    if v.on_watchdog != on_watchdog:
        return _end_without_a_step(v, t) if on_watchdog and v.all_threads else []
    actions: list[tuple[Any, ...]] = []
    state = v.state
    if v.hung and t.step != v.hung_step:
        state = wire.CAPTURING if v.profiling else wire.WAITING
        actions.append((RESUME, state))
    if cancels_unstarted(v, state):
        return actions + [(CANCEL_UNSTARTED,)]
    if state == wire.WAITING:
        # The budget's probe counts the last wait step's Python calls (one more step where none is left).
        if v.with_stack and not v.probed and (v.probing or t.step + 1 >= v.start_at):
            actions.append((PROBE,))
        if t.step >= v.start_at:
            actions.append((START,))
        return actions
    if state != wire.CAPTURING or not v.profiling:
        return actions
    if v.cancel:
        return actions + [(STOP, wire.CANCELLED, False, False)]
    if t.grown_mb > v.max_memory_mb:
        return actions + [(STOP, wire.DONE, True, False)]
    if on_watchdog:
        over = t.mono - v.started_mono >= (v.duration or 0)
    elif v.steps is not None:
        over = t.step - (v.start_step or 0) >= v.steps
    else:
        over = v.duration is not None and t.mono - v.started_mono >= v.duration
    return actions + [(STOP, wire.DONE, False, False) if over else (STEP,)]


def _end_without_a_step(v: CaptureView, t: Tick) -> list[tuple[Any, ...]]:
    """Stop, from the watchdog, an all-threads capture of the training thread whose duration is
    over (or that was cancelled) while the loop makes no step: it blocks in data loading or sits
    between epochs. A loop that still steps gets STEPLESS_AFTER_SECONDS more to end it on a step
    boundary, so the sidecar sees the end at most that long after the duration."""
    if v.state != wire.CAPTURING or not v.profiling or v.duration is None:
        return []
    stalled = t.mono - t.last_step_mono >= STEPLESS_AFTER_SECONDS
    late = t.mono - v.started_mono - v.duration
    if v.cancel and stalled:
        return [(STOP, wire.CANCELLED, False, True)]
    if late >= 0 and (stalled or late >= STEPLESS_AFTER_SECONDS):
        return [(STOP, wire.DONE, False, True)]
    if stalled and t.grown_mb > v.max_memory_mb:
        return [(STOP, wire.DONE, True, True)]
    return []


def starts_stepless(v: CaptureView, t: Tick) -> bool:
    """A durationSeconds capture of a process that reaches no step boundary: the watchdog starts
    it (before a first step, once the first-step grace is over)."""
    stepless_after = STEPLESS_AFTER_SECONDS if t.step else FIRST_STEP_GRACE_SECONDS
    return v.state == wire.WAITING and v.duration is not None and t.mono - max(t.last_step_mono, v.triggered_mono) >= stepless_after


def hangs(v: CaptureView, t: Tick) -> bool:
    """No step for hangTimeoutSeconds, counted from the trigger at the earliest: a request may
    reach a rank that was already stuck, or one still starting up."""
    return v.state in (wire.WAITING, wire.CAPTURING) and not v.hung and t.mono - max(t.last_step_mono, v.triggered_mono) >= v.hang_timeout


def watchdog_wait(v: CaptureView, t: Tick) -> float:
    """How long the watchdog sleeps: a heartbeat, or less to end a duration when it runs out."""
    left = v.duration - (t.mono - v.started_mono) if v.profiling and v.duration is not None else 0.0
    return max(0.01, min(HEARTBEAT_SECONDS, left)) if left > 0 else HEARTBEAT_SECONDS


class _Session:
    """One capture request on this rank, from trigger to a final state."""

    def __init__(self, request: dict[str, Any], trigger_step: int, folder: str) -> None:
        capture = request.get("capture") or {}
        self.id: str = request["session"]
        self.folder = folder
        # A request the sidecar writes is complete; one written by hand gets the spec's defaults,
        # and only a missing field does (waitSteps 0 is a choice).
        self.wait_steps = int(wire.DEFAULT_WAIT_STEPS if capture.get("waitSteps") is None else capture["waitSteps"])
        self.duration: float | None = float(capture["durationSeconds"]) if capture.get("durationSeconds") is not None else None
        self.steps: int | None = None if self.duration is not None else int(capture.get("steps") or wire.DEFAULT_CAPTURE_STEPS)
        self.activities = [str(a) for a in (capture.get("activities") or wire.DEFAULT_ACTIVITIES)]
        self.with_stack = bool(capture.get("withStack", True))
        self.record_shapes = bool(capture.get("recordShapes", wire.DEFAULT_RECORD_SHAPES))
        self.profile_memory = bool(capture.get("profileMemory", False))
        self.with_flops = bool(capture.get("withFlops", False))
        self.hang_timeout = float(request.get("hangTimeoutSeconds") or wire.DEFAULT_HANG_TIMEOUT_SECONDS)
        limits = capture.get("limits") or {}
        # 0 is a budget too (no stacks at all); only a missing field takes the default.
        self.max_stack_events = int(wire.DEFAULT_MAX_STACK_EVENTS if limits.get("maxStackEvents") is None else limits["maxStackEvents"])
        self.max_memory_mb = float(wire.DEFAULT_MAX_MEMORY_MB if limits.get("maxMemoryMB") is None else limits["maxMemoryMB"])
        self.probe: _CallCounter | None = None  # counts one step's Python calls before a withStack capture
        self.probed = False
        self.sampler: _StackSampler | None = None  # samples the training thread where the budget dropped its stacks
        self.rss_start_mb = 0.0
        self.state = wire.WAITING
        self.trigger_step = trigger_step
        # The step the capture begins at: the request's absolute startStep, which the sidecar and
        # operator set alike for every rank of a job so that all ranks capture the same steps
        # (DDP ranks step in lockstep); a rank already past it begins at its next step.
        # A startStep far beyond this rank's own count (its process restarted, or it counts steps
        # differently) would never come within the session: then it waits as if none were given.
        start = request.get("startStep")
        start_at = trigger_step + self.wait_steps
        if start is not None and int(start) <= start_at + ALIGN_SLACK_STEPS:
            start_at = max(int(start), trigger_step)
        self.start_at = start_at
        self.start_step: int | None = None
        self.end_step: int | None = None
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.started_mono = 0.0
        self.triggered_mono = _monotonic()
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

    def view(self) -> CaptureView:
        return CaptureView(self.state, self.prof is not None, self.on_watchdog, self.all_threads, self.cancel, self.hung, self.hung_step,
                           self.start_at, self.start_step, self.steps, self.duration, self.started_mono, self.triggered_mono,
                           self.with_stack, self.probed, self.probe is not None, self.max_memory_mb, self.hang_timeout)


class Agent:
    """Step counter, request reader, profiler driver and watchdog of one training process."""

    def __init__(self, directory: str, *, forked: bool = False) -> None:
        self.directory = directory
        self.request_path = os.path.join(directory, wire.REQUEST_FILE)
        self.step_count = 0
        self.last_step_mono = _monotonic()
        self.ring = _StepRing()
        self._ring_refused = False
        self._ddp_models: weakref.WeakSet[Any] = weakref.WeakSet()
        self._wait_read_mono = float("-inf")
        self.collective_wait: dict[str, float] | None = None  # the heartbeat's collectiveWait
        self._wait_sample_at = 0.0
        self._wait_samples: dict[int, float] = {}  # DDP iteration -> its all-reduce seconds, the latest COLLECTIVE_WAIT_SAMPLES
        self.started_at = time.time()
        self.pid = os.getpid()
        # multiprocessing's spawn replaces sys.argv before it says a process is its child; at
        # interpreter start, a spawned child still has the marker on its command line.
        self._spawned_child = "--multiprocessing-fork" in getattr(sys, "argv", ())
        # A forked child inherits RANK and even an initialized torch.distributed from its parent, so
        # only its own steps show that it trains; it starts its watchdog at its first step.
        self._forked = forked
        self.host = os.uname().nodename
        self._request_sig: tuple[int, int, int] | None = None
        self._polled_mono = float("-inf")
        self._session: _Session | None = None
        self._handled: set[str] = set()
        self._lock = threading.RLock()
        self._lead: Any = lambda: None
        self._hook_handle: Any = None
        self._manual = False
        self._torch_ready = False
        self._identity: tuple[int, int, int] | None = None
        self._identity_certain = False
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
            self._track_ddp()
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

    def _track_ddp(self) -> None:
        """Remember (weakly) each DistributedDataParallel model the program builds: its reducer
        times the gradient all-reduce of sampled iterations itself (DDP's runtime logging: the
        first 10 iterations, then every 100th), the rank's wait in collectives at no cost of ours."""
        from torch.nn.parallel import DistributedDataParallel

        original = DistributedDataParallel.__init__
        if getattr(original, "_stepscope_tracks", False):  # a forked child's class is patched already
            return
        models = self._ddp_models

        def tracked_init(module: Any, *args: Any, **kwargs: Any) -> None:
            original(module, *args, **kwargs)
            # The process's agent: a forked child re-arms one of its own after the class was patched.
            (_AGENT._ddp_models if _AGENT is not None else models).add(module)

        tracked_init._stepscope_tracks = True  # type: ignore[attr-defined]  # a marker on the function, read above
        tracked_init.__wrapped__ = original  # type: ignore[attr-defined]  # as functools.wraps would, for inspect.signature
        tracked_init.__doc__ = original.__doc__
        DistributedDataParallel.__init__ = tracked_init  # the tracking is the point

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
                request = json.loads(f.read())
            if not isinstance(request, dict):
                raise ValueError("request.json is not a JSON object")
        except (OSError, ValueError) as e:
            log.warning("stepscope agent: cannot read %s: %s", self.request_path, e)
            return
        session_id = request.get("session")
        if not wire.valid_session_id(session_id):
            log.warning("stepscope agent: request.json has no usable session id (%r); ignored", session_id)
            return
        action = request.get("action")
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
        if action != "capture" or request.get("version") != wire.WIRE_VERSION:
            self._answer_without_capture(session_id, folder, wire.FAILED, f"unsupported request: version {request.get('version')!r}, action {action!r} (this agent speaks version {wire.WIRE_VERSION}, actions capture and cancel)")
            return
        if active is not None:
            self._answer_without_capture(session_id, folder, wire.REFUSED, f"session {active.id} is still active on this rank ({active.state}); one session at a time")
            return
        if self._already_final(folder):
            return
        try:
            session = _Session(request, self.step_count, folder)
        except (TypeError, ValueError, KeyError) as e:
            self._answer_without_capture(session_id, folder, wire.FAILED, f"bad capture request: {e}")
            return
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
        answer = _Session({"session": session_id}, self.step_count, folder)
        answer.state = state
        answer.error = None if state == wire.CANCELLED else reason
        self._write_state(answer, message=reason)

    # ---- the capture state machine ----------------------------------------------------------

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

    def _tick(self, s: _Session, *, memory: bool = True) -> Tick:
        """Now; the process's growth only where a decision reads it (a read of /proc)."""
        grown = _rss_mb() - s.rss_start_mb if memory and s.prof is not None else 0.0
        return Tick(self.step_count, _monotonic(), self.last_step_mono, grown)

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
                s.prof.step()
                if s.sampler is not None:
                    s.sampler.anchor(s.prof.step_num)
            else:
                _, final, over_memory, stepless = action
                if over_memory:
                    self._cut_for_memory(s, tick.grown_mb)
                if stepless:
                    s.notes.append(f"no step boundary came after step {self.step_count - 1}: the watchdog thread stopped the profiler, "
                                   f"so ProfilerStep#{self.step_count} holds the part of step {self.step_count} recorded until then")
                self._stop_profiler(s, final)

    def _probing(self, s: _Session) -> bool:
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
            s.probe = _CallCounter()
            sys.setprofile(s.probe)
            if self.step_count >= s.start_at:
                s.notes.append("the capture started one step late: that step counted the Python calls for the capture budget")
            return True
        sys.setprofile(None)
        s.probed = True
        calls, seconds = s.probe.calls, max(1e-6, _monotonic() - s.probe.started)
        s.probe = None
        if s.steps is not None:
            projected, over = calls * s.steps, f"{calls:,} Python calls per step x {s.steps} steps"
        else:
            projected = int(calls / seconds * (s.duration or 0))
            over = f"{calls / seconds:,.0f} Python calls per second x {s.duration:g} s"
        if projected > s.max_stack_events:
            s.with_stack = False
            # A few hundred samples of every thread's stack still name where the time goes
            # (a stepless program's probe ran on the watchdog thread, which is not worth sampling).
            s.sampler = None if s.on_watchdog else _StackSampler(threading.get_ident(), s.max_stack_events)
            instead = "" if s.sampler is None else f", every thread's stack is sampled every {wire.STACK_SAMPLE_SECONDS * 1000:g} ms instead"
            s.degraded.append(f"{wire.STACKS_DROPPED}: {over} = {projected:,} exceeds capture.limits.maxStackEvents={s.max_stack_events:,}{instead}; "
                              "set capture.withStack=false or raise capture.limits.maxStackEvents")
            log.warning("stepscope agent: session %s: %s", s.id, s.degraded[-1])
        return False

    def _cut_for_memory(self, s: _Session, grown: float) -> None:
        """The budget's second stage: the capture is cut short once the process grew by more than
        maxMemoryMB since the profiler started (the profiler's buffers, mostly); say so."""
        captured = self.step_count - (s.start_step or 0)
        cut = (f"{captured} of {s.steps} steps" if s.steps is not None
               else f"{_monotonic() - s.started_mono:.1f} of {s.duration:g} s ({captured} steps)")
        s.degraded.append(f"capture cut after {cut}: the process grew {grown:,.0f} MB while profiling, "
                          f"over capture.limits.maxMemoryMB={s.max_memory_mb:g}; capture fewer steps, set capture.withStack=false "
                          "or raise capture.limits.maxMemoryMB")
        log.warning("stepscope agent: session %s: %s", s.id, s.degraded[-1])

    def _cancel_unstarted(self, s: _Session) -> bool:
        """Cancel a session whose profiler never started; any thread may, even while training hangs."""
        if not cancels_unstarted(s.view()):
            return False
        self._finish(s, wire.CANCELLED, message=f"cancelled at step {self.step_count} before capture started")
        return True

    def _start_profiler(self, s: _Session) -> None:
        try:
            import torch
            from torch.profiler import ProfilerAction, ProfilerActivity, profile

            activities = []
            if "CPU" in s.activities:
                activities.append(ProfilerActivity.CPU)
            if "CUDA" in s.activities:
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
            all_threads = _all_threads_config() if s.duration is not None else None
            extra = {} if all_threads is None else {"experimental_config": all_threads}
            # A schedule that always records: without a schedule torch.profiler writes no
            # ProfilerStep#N annotations. Starting at step_num = steps done so far makes N the
            # step's zero-based index, the numbers of the state file's startStep/endStep.
            prof = profile(activities=activities, schedule=lambda _: ProfilerAction.RECORD, with_stack=s.with_stack,
                           record_shapes=s.record_shapes, profile_memory=s.profile_memory, with_flops=s.with_flops, **extra)
            prof.step_num = self.step_count
            prof.start()
        except Exception as e:  # noqa: BLE001 - a profiler that cannot start fails the session, never the training
            self._fail(s, "profiler start", e)
            return
        s.prof = prof
        s.all_threads = all_threads is not None
        if s.sampler is not None:
            s.sampler.start(prof.step_num)
        s.state = wire.CAPTURING
        s.start_step = self.step_count
        s.start_time = time.time()
        s.started_mono = _monotonic()
        s.rss_start_mb = _rss_mb()
        what = f"{s.steps} steps" if s.steps is not None else f"{s.duration:g} s"
        self._write_state(s, message=f"capturing {what} from step {s.start_step}")

    def _stop_profiler(self, s: _Session, final: str, *, background: bool = True) -> None:
        prof, s.prof = s.prof, None
        if s.sampler is not None:
            s.sampler.stop()
        s.end_step = self.step_count
        s.end_time = time.time()
        # `writing` before the stop: torch processes every recorded event in it, holding the GIL,
        # so no heartbeat comes until it returns and the sidecar must know the rank is exporting.
        s.state = wire.WRITING
        self._write_state(s, message=f"writing the trace of steps {s.start_step}..{s.end_step - 1}" if s.steps is not None else "writing the trace")
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

    def _export(self, s: _Session, held: list[Any], final: str) -> None:
        """Write the trace gzipped, then give the memory the capture took back to the system.
        torch (Kineto) writes its JSON only to a path, through a temporary file it renames over
        it (a FIFO there is replaced), so the raw JSON passes through the session folder."""
        try:
            self._write_trace(s, held.pop(), final)
        finally:
            held.clear()
            _release_memory()

    def _write_trace(self, s: _Session, prof: Any, final: str) -> None:
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

    def _fail(self, s: _Session, what: str, error: Exception) -> None:
        log.error("stepscope agent: %s failed in session %s; training goes on", what, s.id, exc_info=error)
        s.error = f"{what} failed: {type(error).__name__}: {error}"
        self._finish(s, wire.FAILED, message=s.error)

    def _finish(self, s: _Session, state: str, *, message: str) -> None:
        if s.probe is not None:
            s.probe.active = False  # it removes itself on the training thread's next call
        if s.sampler is not None:
            s.sampler.stop()
        s.state = state
        if s.end_time is None:
            s.end_time = time.time()
        self._write_state(s, message=message)
        if self._session is s:
            self._session = None

    # ---- files ------------------------------------------------------------------------------

    def identity(self) -> tuple[int, int, int]:
        """(rank, local rank, world size): torchrun's environment, else torch.distributed, else 0/0/1."""
        if self._identity_certain and self._identity is not None:
            return self._identity
        env = os.environ
        if "RANK" in env:
            try:
                rank = int(env["RANK"])
                self._identity = (rank, int(env.get("LOCAL_RANK", rank)), int(env.get("WORLD_SIZE", 1)))
                self._identity_certain = True
                return self._identity
            except ValueError:
                pass
        dist = sys.modules.get("torch.distributed")
        if dist is not None and self._torch_ready:
            try:
                if dist.is_available() and dist.is_initialized():
                    rank = dist.get_rank()
                    self._identity = (rank, int(env.get("LOCAL_RANK", rank)), dist.get_world_size())
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

    def _write_state(self, s: _Session, *, message: str) -> None:
        rank, local_rank, world = self.identity()
        captured = (s.end_step if s.end_step is not None else self.step_count) - s.start_step if s.start_step is not None else 0
        notes = "; ".join([*s.degraded, *s.notes])
        if s.gpu[0] < 0:
            s.gpu = _cuda_device()
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
            _write_json(self._state_path(s.folder), state)
        except OSError as e:
            log.error("stepscope agent: cannot write the state of session %s (%s): %s", s.id, s.state, e)

    def _heartbeat(self) -> None:
        rank, local_rank, world = self.identity()
        folder = os.path.join(self.directory, wire.AGENTS_FOLDER)
        os.makedirs(folder, exist_ok=True)
        _write_json(os.path.join(folder, wire.agent_file(rank)), {
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

    def _write_stacks(self, s: _Session, since_step: float) -> None:
        rank = self.identity()[0]
        name = wire.stacks_file(rank)
        os.makedirs(s.folder, exist_ok=True)
        _write_json(os.path.join(s.folder, name), {
            "version": wire.WIRE_VERSION, "rank": rank, "pid": os.getpid(), "host": self.host, "session": s.id,
            "step": self.step_count, "secondsSinceStep": round(since_step, 3), "time": time.time(), "threads": thread_stacks(),
        })
        s.stacks = name

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
            _unlink(os.path.join(self.directory, wire.AGENTS_FOLDER, wire.agent_file(self.identity()[0])))
            self.ring.remove()


class _CallCounter:
    """A sys.setprofile function that counts Python and built-in calls: the events torch's
    Python tracer would record with withStack."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = _monotonic()
        self.active = True

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1
            if not self.active:  # the session ended on another thread; setprofile is per thread
                sys.setprofile(None)


def sample_spans(times: list[float], interval: float) -> list[tuple[float, float]]:
    """The span of time each sample of a thread's stack (taken at `times`, in order) stands for.

    The sampler needs the GIL to take a sample: while a thread runs pure Python, the sampler waits
    for it until the interpreter's switch interval makes that thread let go, and a sample comes
    late. The time it waited beyond its interval was spent in what that late sample shows (the
    thread that held the GIL ran it until then), not in what the sample before showed, which
    lasts one interval. Each sample so stands for the time from the end of its predecessor's
    interval (or its own time, if sooner) to the next sample's start; the last one for an interval."""
    starts = [times[0]] + [min(t, before + interval) for before, t in zip(times, times[1:])]
    return list(zip(starts, starts[1:] + [times[-1] + interval]))


# While the sampler samples, the interpreter asks a thread that runs Python to let go of the GIL
# after this long (rather than its default 5 ms), so that samples come no later than this: the
# switch costs microseconds and happens only when another thread (the sampler) waits for the GIL.
SAMPLING_SWITCH_SECONDS = wire.STACK_SAMPLE_SECONDS / 4


class _StackSampler:
    """Samples every thread's Python stack every wire.STACK_SAMPLE_SECONDS while a capture whose
    stacks the budget dropped records: a few hundred samples where the tracer would have recorded
    millions of events. At export they become the trace's python_function events (each sample
    stands for the span sample_spans gives it; a frame on consecutive samples is one event), named
    as torch's tracer names them, so the analysis can still name the function the time goes to, on
    the training thread (`thread_id`, whose events go on the steps' thread) and on any other
    thread of the process (a logging thread that holds the GIL). Samples stop once they hold
    maxStackEvents frames."""

    def __init__(self, thread_id: int, max_frames: int) -> None:
        self.thread_id = thread_id
        self.max_frames = max_frames
        self.samples: list[tuple[float, int, tuple[tuple[int, Any], ...]]] = []
        self.anchors: list[tuple[int, float]] = []  # (ProfilerStep number, monotonic time it began)
        # The frames running when sampling starts: the tracer names them by their current line
        # (later calls by their first line); held so that their ids are not reused meanwhile.
        self.running: dict[int, tuple[Any, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, step: int) -> None:
        """On the training thread, right after the profiler started its first step."""
        frame: Any = sys._getframe(1)
        while frame is not None:
            self.running[id(frame)] = (frame, f"{frame.f_code.co_filename}({frame.f_lineno}): {frame.f_code.co_name}")
            frame = frame.f_back
        self.anchor(step)
        self._thread = threading.Thread(target=self._run, name="stepscope-sampler", daemon=True)
        self._thread.start()

    def anchor(self, step: int) -> None:
        self.anchors.append((step, _monotonic()))

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SAMPLING_SWITCH_SECONDS))
        try:
            self._sample()
        finally:
            sys.setswitchinterval(switch)

    def _sample(self) -> None:
        frames = 0
        me = threading.get_ident()
        while not self._stop.wait(wire.STACK_SAMPLE_SECONDS) and frames < self.max_frames:
            now = _monotonic()
            for ident, top in sys._current_frames().items():
                if ident == me:
                    continue
                frame: Any = top
                stack: list[tuple[int, Any]] = []
                while frame is not None:
                    stack.append((id(frame), frame.f_code))
                    frame = frame.f_back
                stack.reverse()
                self.samples.append((now, ident, tuple(stack)))
                frames += len(stack)

    def events(self, trace_events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The samples as python_function events in the clock of `trace_events`, placed by the
        ProfilerStep spans (whose starts the agent timed too) on the training thread's tid."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        steps = {e["name"]: e for e in trace_events if str(e.get("name", "")).startswith("ProfilerStep#")}
        offsets = sorted(steps[f"ProfilerStep#{n}"]["ts"] - t * 1e6 for n, t in self.anchors if f"ProfilerStep#{n}" in steps)
        if not offsets:
            return []
        offset = offsets[len(offsets) // 2]
        first = steps[f"ProfilerStep#{self.anchors[0][0]}"]
        prefixes = _trace_prefixes()
        names: dict[int, str] = {}

        def name(key: int, code: Any) -> str:
            if key in self.running and self.running[key][0].f_code is code:
                return _trimmed(self.running[key][1], prefixes)
            if id(code) not in names:
                names[id(code)] = _trimmed(f"{code.co_filename}({code.co_firstlineno}): {code.co_name}", prefixes)
            return names[id(code)]

        out: list[dict[str, Any]] = []
        by_thread: dict[int, list[tuple[float, tuple[tuple[int, Any], ...]]]] = {}
        for t, ident, stack in self.samples:
            by_thread.setdefault(ident, []).append((t, stack))
        for ident, samples in by_thread.items():
            # The training thread's events go on the steps' thread; another thread's on its own.
            tid = first.get("tid") if ident == self.thread_id else ident
            open_: list[tuple[int, Any, dict[str, Any]]] = []
            spans = sample_spans([t for t, _ in samples], wire.STACK_SAMPLE_SECONDS)
            for (_, stack), (begin, end) in zip(samples, spans):
                ts = begin * 1e6 + offset
                same = 0
                while same < min(len(open_), len(stack)) and open_[same][0] == stack[same][0] and open_[same][1] is stack[same][1]:
                    same += 1
                del open_[same:]
                for key, code in stack[same:]:
                    event = {"ph": "X", "cat": "python_function", "name": name(key, code), "pid": first.get("pid"), "tid": tid,
                             "ts": ts, "dur": 0.0, "args": {"Python parent id": open_[-1][2]["args"]["Python id"] if open_ else None,
                                                            "Python id": len(out) + 1, "Sampled": True}}
                    out.append(event)
                    open_.append((key, code, event))
                for _, _, event in open_:
                    event["dur"] = end * 1e6 + offset - event["ts"]
        self.running.clear()
        return out


def _trace_prefixes() -> list[str]:
    """The folders torch's tracer cuts from a file name (sys.path and site-packages)."""
    try:
        from torch.profiler.python_tracer import _prefix_regex

        return list(_prefix_regex())
    except Exception:  # noqa: BLE001 - a private torch helper: whatever it raises, names stay untrimmed
        return []


def _trimmed(name: str, prefixes: list[str]) -> str:
    return next((name[len(p):] for p in prefixes if name.startswith(p)), name)


def _rss_mb() -> float:
    """This process's resident memory (Linux); 0 where /proc is missing, which disables the memory bound."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_MB
    except (OSError, ValueError, IndexError):
        return 0.0


_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 4096 / 2**20


def _release_memory() -> None:
    """Hand the profiler's freed memory back to the system: glibc keeps freed heap pages, so the
    RSS a capture took would otherwise stay with the training process."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _cuda_device() -> tuple[int, str]:
    """The CUDA device this process computes on and its UUID, for the sidecar, which sees every GPU
    of the node, to tell which is this rank's; (-1, "") until the program has initialised CUDA
    itself: the agent never does, that would take a context on a GPU the program may not use."""
    cuda = sys.modules.get("torch.cuda")
    try:
        if cuda is None or not cuda.is_initialized():
            return -1, ""
        index = cuda.current_device()
        return index, str(cuda.get_device_properties(index).uuid)
    except Exception:  # noqa: BLE001 - the agent never raises into training
        return -1, ""


def _all_threads_config() -> Any:
    """The profiler configuration that records every thread with process-wide state, which any
    thread may stop (torch's own debug handler starts and stops it on a server thread); None where
    this torch has no profile_all_threads."""
    try:
        from torch.profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):
        return None


class _TorchImportWatcher:
    """Lets torch be imported as usual, then attaches the agent: no torch import at interpreter start."""

    def __init__(self, on_import: Any) -> None:
        self._on_import = on_import

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        # The finders after this one, in order: torch may come from an editable or custom finder.
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _AfterExecLoader(spec.loader, self._on_import)
        return spec


class _AfterExecLoader:
    def __init__(self, loader: Any, after: Any) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # Give the module its real loader back, so resource lookups and inspect see torch's own.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            self._after()
        except Exception:
            log.exception("stepscope agent: cannot attach to torch; training goes on without it")


_AGENT: Agent | None = None


def start(directory: str | None = None) -> Agent:
    """Start the agent in this process (idempotent); attaches to torch when the program imports it."""
    global _AGENT
    if _AGENT is not None:
        return _AGENT
    _AGENT = agent = Agent(directory or os.environ.get(wire.DIR_ENV) or wire.DEFAULT_DIR)
    os.register_at_fork(after_in_child=_rearm_in_forked_child)
    if "torch" in sys.modules and hasattr(sys.modules["torch"], "optim"):
        agent.attach_torch()
    else:
        sys.meta_path.insert(0, _TorchImportWatcher(_attach_torch))
    return agent


def _attach_torch() -> None:
    if _AGENT is not None:
        _AGENT.attach_torch()


def _rearm_in_forked_child() -> None:
    """A forked child keeps its parent's agent but none of its threads, and perhaps a lock a parent
    thread held: it gets an agent of its own (its pid, steps and rank). A forked rank steps; a forked
    data loader worker never does, so it never registers nor answers. Runs inside os.fork()."""
    global _AGENT
    parent = _AGENT
    if parent is None:
        return
    try:
        if parent._hook_handle is not None:
            parent._hook_handle.remove()
            parent._hook_handle = None
        child = Agent(parent.directory, forked=True)
        child._manual = parent._manual
        _AGENT = child
        if parent._torch_ready:
            child.attach_torch()
    except Exception:
        _AGENT = None
        log.exception("stepscope agent: cannot re-arm in a forked child; it is not profiled")


def step() -> None:
    """Mark the end of one training step (for loops without an optimizer); never raises."""
    agent = _AGENT
    if agent is not None:
        try:
            agent.manual_step()
        except Exception:  # noqa: BLE001 - stepscope.step() never raises into the training loop
            agent._log_failure("step()")
