"""What the sidecar knows about its capture sessions: it accepts a trigger, follows every local
rank through the shared directory, records the node's GPU metrics during the window, and hands
each finished rank's artifacts to the upload worker.

The decisions (which rank is gone, the timeout, the recorder, what to upload, the phase) are pure
functions in stepscope.sidecar.session_phases; this module reads the files and applies them.

Phases (docs/wire.md): Pending (no rank capturing yet), Capturing, Uploading (every rank finished
or hung, uploads outstanding), then Succeeded, Failed (a rank failed, hung, was refused, vanished,
timed out or could not be uploaded) or Cancelled. A rank that hung is not final: the session ends
Failed with its stacks, and the follower keeps reading its state file, so that a trace it writes
once its steps resume is still uploaded.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stepscope import analysis
from stepscope.contracts import layout, wire
from stepscope.contracts.session import SessionSpec, SpecError
from stepscope.contracts.sidecar_api import CANCEL, CAPTURE, SessionRequest
from stepscope.contracts.states import RankState, SidecarPhase
from stepscope.retry import RetryPolicy
from stepscope.sidecar import session_phases, shared_dir
from stepscope.sidecar.session_phases import (
    FINISHED_PHASES,
    Limits,
    QueueMetrics,
    QueueRank,
    RankView,
    SessionView,
    StartRecorder,
    TimeOut,
    Verdict,
)
from stepscope.sidecar.telemetry import live_step_counts
from stepscope.sidecar.uploads import Job, Uploader
from stepscope.storage import Store, StoreError, open_store

log = logging.getLogger(__name__)
T = TypeVar("T")

HISTORY = 32
# The sidecar may see the node's every GPU; a pod's samples are those of the GPUs its ranks name.
NO_RANK_GPU = (
    "no rank of this pod named the GPU it computes on (CPU ranks, or an agent that does not report it), and other "
    "GPUs of the node are not the pod's to upload"
)
# The agent's watchdog rewrites its registry file every second and its state file on every
# transition; neither for this long means the process is gone. Liveness goes by these files, as
# the sidecar need not share the training container's pid namespace.
STALE_AFTER_S = 15.0
# A rank `writing` its trace sends no heartbeat while torch processes the recorded events (it holds
# the GIL): the capture budget keeps that to seconds, a raised budget may take minutes.
EXPORT_GRACE_S = 600.0
# Files of sessions this sidecar does not follow (a failed upload, a sidecar restarted before its
# uploads finished, a rank that finished after its session) are removed this long after their last
# change, and the oldest first once all sessions' files take more than the disk bound.
LEFTOVER_TTL_S = 24 * 3600.0
MAX_LOCAL_MB = 10 * 1024
SWEEP_INTERVAL_S = 60.0


@dataclass
class RankProgress:
    rank: int
    local_rank: int = -1
    world_size: int = 0
    pid: int = 0
    # The CUDA device the rank computes on and its UUID, as its agent reported them (-1 and "" for
    # a CPU rank or an agent that saw no CUDA yet): they tell the sidecar, which sees every GPU of
    # the node, which GPU is whose.
    gpu: int = -1
    gpu_uuid: str = ""
    state: str = session_phases.PENDING
    step: int | None = None
    start_step: int | None = None
    end_step: int | None = None
    error: str | None = None
    trace: str | None = None
    stacks: str | None = None
    queued_state: str | None = None  # the state whose artifacts were last queued
    sent: set[str] = field(default_factory=set)  # local files queued for upload
    agent_state: str = RankState.PENDING  # as the agent last wrote it; `state` may be the sidecar's verdict
    degraded: list[str] = field(default_factory=list)
    captured_trace: bool = False
    jobs_left: int = 0
    upload_errors: list[str] = field(default_factory=list)
    summary_error: str | None = None
    last_sign_of_life: float = 0.0

    @property
    def terminal(self) -> bool:
        return self.state in wire.FINAL_STATES

    @property
    def queued(self) -> bool:
        return self.queued_state == self.state

    @property
    def failed(self) -> bool:
        return self.state in wire.FAILED_STATES or bool(self.upload_errors) or self.summary_error is not None

    @property
    def uploaded(self) -> bool:
        """What this rank captured is safely in the store."""
        return self.captured_trace and self.queued and self.jobs_left == 0 and not self.upload_errors

    def errors(self) -> str | None:
        return "; ".join(e for e in (self.error, self.summary_error, *self.upload_errors) if e) or None

    def view(self) -> RankView:
        return RankView(
            self.rank,
            self.state,
            self.pid,
            self.step,
            self.last_sign_of_life,
            self.queued_state,
            self.jobs_left,
            self.failed,
            self.errors(),
            tuple(self.degraded),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "localRank": self.local_rank,
            "pid": self.pid,
            "state": self.state,
            "step": self.step,
            "startStep": self.start_step,
            "endStep": self.end_step,
            "uploaded": self.uploaded,
            "error": self.errors(),
            "degraded": list(self.degraded),
        }


@dataclass
class Session:
    id: str
    spec: SessionSpec
    destination: str
    store: Store  # holds the credentials, which nothing else keeps
    accepted_at: float
    ranks: dict[int, RankProgress] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    phase: str = SidecarPhase.PENDING
    message: str = "waiting for the training processes to see the request"
    cancel_requested: bool = False
    timed_out: bool = False
    recorder: Any = None
    metrics: Any = None  # pandas.DataFrame of the node's samples, once the recorder stopped
    metrics_queued: bool = False
    metrics_pending: bool = False
    metrics_withheld: str = ""  # why the samples were not uploaded (session_phases.SessionView)
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    def view(self, agents_dir: Path, metrics_wanted: bool = False) -> SessionView:
        return SessionView(
            self.phase,
            self.destination,
            str(agents_dir),
            self.spec.timeoutSeconds,
            self.spec.capture.waitSteps,
            self.accepted_at,
            tuple(r.view() for _, r in sorted(self.ranks.items())),
            self.cancel_requested,
            self.timed_out,
            metrics_wanted,
            self.recorder is not None,
            self.metrics_queued,
            self.metrics_pending,
            self.metrics_withheld,
        )

    def rank_gpus(self) -> dict[str, int]:
        """GPU UUID -> the CUDA index its rank computes on, for the GPU metrics. Only these GPUs'
        rows are kept: the sidecar may see every GPU of the node (NVIDIA_VISIBLE_DEVICES=all),
        other tenants' too, so with no rank naming its GPU (CPU ranks, an older agent) none is."""
        return {r.gpu_uuid: r.gpu for r in self.ranks.values() if r.gpu_uuid and r.gpu >= 0}

    def workers(self) -> dict[str, int]:
        ranks = self.ranks.values()
        return {
            "total": len(self.ranks),
            "triggered": sum(r.state != RankState.PENDING for r in ranks),
            "capturing": sum(r.state in (wire.CAPTURING, wire.WRITING) for r in ranks),
            "captured": sum(r.state == wire.DONE for r in ranks),
            "uploaded": sum(r.uploaded for r in ranks),
            "failed": sum(r.failed for r in ranks),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "session": self.id,
            "phase": self.phase,
            "workers": self.workers(),
            "ranks": [r.to_dict() for _, r in sorted(self.ranks.items())],
            "artifacts": sorted(self.artifacts),
            "message": self.message,
            "destination": self.destination,
            "timeline": list(self.timeline),
        }


class SessionManager:
    """Thread-safe: HTTP handler threads, the follower thread and the upload worker all call in."""

    def __init__(
        self,
        stepscope_dir: Path,
        *,
        pod: str,
        node: str,
        uploader: Uploader,
        retry: RetryPolicy | None = None,
        nvml_backend: Any = None,
        poll_interval_s: float = 0.5,
        keep_local: bool = False,
        stale_after_s: float = STALE_AFTER_S,
        export_grace_s: float = EXPORT_GRACE_S,
        leftover_ttl_s: float = LEFTOVER_TTL_S,
        max_local_mb: float = MAX_LOCAL_MB,
        own_every_gpu: bool = False,
    ) -> None:
        self.dir = stepscope_dir
        self._own_every_gpu = own_every_gpu
        self.pod, self.node = pod, node
        self._uploader = uploader
        self._retry = retry
        self._backend = nvml_backend
        self._poll_interval_s = poll_interval_s
        self._keep_local = keep_local
        self._stale_after_s = stale_after_s
        self._export_grace_s = max(export_grace_s, stale_after_s)
        self._limits = Limits(stale_after_s, self._export_grace_s)
        self._leftover_ttl_s = leftover_ttl_s
        self._max_local_bytes = max_local_mb * 2**20
        self.local_bytes = 0  # what sessions' files took in the shared directory at the last sweep
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="stepscope-follower", daemon=True)

    def start(self) -> None:
        self.sweep()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            recording = [s for s in self._sessions.values() if s.recorder is not None and not s.metrics_queued]
        for session in recording:
            # Keeps what was sampled of the ranks' GPUs next to the traces, which also stay on the shared volume.
            session.recorder.stop(shared_dir.metrics_file(self.dir, session.id), gpus=self._metrics_gpus(session))

    def active(self) -> Session | None:
        with self._lock:
            return next((s for s in self._sessions.values() if not s.finished), None)

    # -- control endpoint -------------------------------------------------------------------

    def put(self, session_id: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """A trigger (PUT /v1/sessions/{id}): the body read straight into the contract's SessionRequest."""
        if not wire.valid_session_id(session_id):
            return 400, {"error": f"invalid session id {session_id!r}: letters, digits, '.', '_', '-' only"}
        try:
            request = SessionRequest.from_json(body, "body")
        except SpecError as exc:
            return 400, {"error": f"bad spec: {exc}" if str(exc).startswith("body.spec") else str(exc)}
        if request.session not in (None, session_id):
            return 400, {"error": f"body.session {request.session!r} does not match the path's {session_id!r}"}
        with self._lock:
            known = self._sessions.get(session_id)
            if known is not None:
                return 200, known.to_dict()
            other = self.active()
            if other is not None:
                return 409, {
                    "error": f"session {other.id} is still {other.phase} on this sidecar; delete it or wait for it to "
                    "finish"
                }
            spec, destination, start_step = request.spec, request.destination, request.startStep
            try:
                # The operator's credentials from the session's Secret, never the pod's or node's cloud identity.
                store = open_store(
                    destination,
                    endpoint=spec.storage.endpoint,
                    region=spec.storage.region,
                    credentials=request.credentials.to_dict() if request.credentials else None,
                    retry=self._retry,
                    ambient_credentials=False,
                )
            except StoreError as exc:
                return 400, {"error": str(exc)}
            # The session folder is the agents' to create: they may run as another user than the sidecar.
            session = Session(session_id, spec, destination, store, time.time())
            if start_step is None:
                # Every local rank starts at the same absolute step (they step in lockstep), not
                # waitSteps after whichever step each happens to read the request at.
                start_step = wire.aligned_start_step(
                    live_step_counts(self.dir, stale_after_s=self._stale_after_s), spec.capture.waitSteps
                )
            shared_dir.write_request(self.dir, session_id, CAPTURE, spec, start_step)
            self._transition(session, SidecarPhase.PENDING)
            self._sessions[session_id] = session
            self._forget_old()
            log.info("session %s accepted: capture %s, upload to %s", session_id, spec.capture, destination)
            return 201, session.to_dict()

    def get(self, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            session = self._sessions.get(session_id)
            return {**session.to_dict(), "sharedDirBytes": self.local_bytes} if session else None

    def delete(self, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if not session.finished and not session.cancel_requested:
                session.cancel_requested = True
                shared_dir.write_request(self.dir, session_id, CANCEL, session.spec)
                log.info("session %s: cancel requested", session_id)
                self._update_phase(session)
            return session.to_dict()

    # -- following the ranks ----------------------------------------------------------------

    def _follow(self) -> None:
        next_sweep = 0.0
        while not self._stop.wait(self._poll_interval_s):
            try:
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + SWEEP_INTERVAL_S
                    self.sweep()
                self.poll()
            except Exception:  # one bad poll must not end the follower (logged with its traceback)
                log.exception("following the shared directory failed")

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove what no session of this sidecar still needs: files older than the leftover TTL,
        then the oldest while all sessions' files exceed the disk bound. The files of a session
        still capturing or uploading, or with a rank that may still write, are kept. Returns the
        sessions whose files were removed."""
        now = time.time() if now is None else now
        found = shared_dir.leftovers(self.dir)
        with self._lock:
            busy = {
                sid
                for sid, s in self._sessions.items()
                if not s.finished or any(r.jobs_left or r.agent_state in wire.ACTIVE_STATES for r in s.ranks.values())
            }
        total = sum(f.size for f in found)
        removed = []
        for leftover in found:
            if leftover.session in busy:
                continue
            expired = now - leftover.newest > self._leftover_ttl_s
            if not expired and total <= self._max_local_bytes:
                continue
            for path in leftover.paths:
                shutil.rmtree(path, ignore_errors=True)
            total -= leftover.size
            removed.append(leftover.session)
            log.warning(
                "removed the %.1f MB left in %s by session %s (%s)",
                leftover.size / 2**20,
                self.dir,
                leftover.session,
                "older than the leftover TTL" if expired else "the shared directory was over its disk bound",
            )
        self.local_bytes = total
        if total > self._max_local_bytes:
            log.warning(
                "sessions' files take %.0f MB in %s, over the bound of %.0f MB, and are all still needed",
                total / 2**20,
                self.dir,
                self._max_local_bytes / 2**20,
            )
        return removed

    def poll(self) -> None:
        """Read the agents' files once and move the active session on, and the finished sessions
        whose agents may still write a trace (a hung rank that resumes, a rank declared gone while
        it was exporting)."""
        with self._lock:
            lingering = [
                s
                for s in self._sessions.values()
                if s.finished and any(r.agent_state in wire.ACTIVE_STATES for r in s.ranks.values())
            ]
        for late in lingering:
            self._follow_late(late)
        session = self.active()
        if session is None:
            return
        now = time.time()
        agents = {r: a for r, a in shared_dir.agents(self.dir).items() if now - a.heartbeat <= self._stale_after_s}
        states = shared_dir.rank_states(self.dir, session.id)
        with self._lock:
            for rank in set(agents) | set(states):
                if rank not in session.ranks and (
                    session.phase in (SidecarPhase.PENDING, SidecarPhase.CAPTURING) or rank in states
                ):
                    session.ranks[rank] = RankProgress(rank, last_sign_of_life=now)
            for rank, progress in session.ranks.items():
                if not progress.terminal:
                    self._apply(progress, states.get(rank), agents.get(rank), session.cancel_requested)
            metrics_wanted = self._backend is not None and session.spec.hardwareMetrics.enabled
            _, actions = session_phases.advance(
                session.view(self.dir / wire.AGENTS_FOLDER, metrics_wanted), now, self._limits
            )
            for action in actions:
                if isinstance(action, Verdict):
                    progress = session.ranks[action.rank]
                    progress.state, progress.error = wire.FAILED, action.error
                elif isinstance(action, TimeOut):
                    self._time_out(session)
                elif isinstance(action, StartRecorder):
                    self._start_recorder(session)
                elif isinstance(action, QueueMetrics):
                    session.metrics_queued = session.metrics_pending = True
                    self._uploader.submit(self._metrics_job(session))
                elif isinstance(action, QueueRank):
                    self._queue_rank(session, session.ranks[action.rank])
            self._update_phase(session)

    def _follow_late(self, session: Session) -> None:
        """A finished session's rank whose agent was not done yet: once its state file is final,
        upload what it wrote (its trace, a new summary); while its process lives, keep looking."""
        states = shared_dir.rank_states(self.dir, session.id)
        now = time.time()
        agents = {r: a for r, a in shared_dir.agents(self.dir).items() if now - a.heartbeat <= self._stale_after_s}
        with self._lock:
            for rank, progress in session.ranks.items():
                if progress.agent_state not in wire.ACTIVE_STATES:
                    continue
                state = states.get(rank) or {}
                if state.get("state") in wire.FINAL_STATES:
                    verdict, error = progress.state, progress.error
                    self._apply(progress, state, agents.get(rank), False)
                    if progress.state == wire.DONE:
                        session.message += (
                            f"; rank {rank} finished its capture after {verdict}: its trace is uploaded as well"
                        )
                        progress.error = error  # why the session ended without it (it names the state)
                    self._queue_rank(session, progress)
                elif (
                    rank not in agents
                    and now - max(progress.last_sign_of_life, _as_number(state.get("updatedAt"), 0.0, float))
                    > self._export_grace_s
                ):
                    progress.agent_state = wire.FAILED  # its process is gone: nothing more will come

    @staticmethod
    def _apply(
        progress: RankProgress, state: dict[str, Any] | None, agent: shared_dir.Agent | None, cancelling: bool
    ) -> None:
        if agent is not None:
            progress.local_rank, progress.world_size, progress.pid, progress.step = (
                agent.local_rank,
                agent.world_size,
                agent.pid,
                agent.step,
            )
            progress.last_sign_of_life = max(progress.last_sign_of_life, agent.heartbeat)
        if state is not None:
            progress.last_sign_of_life = max(progress.last_sign_of_life, _as_number(state.get("updatedAt"), 0.0, float))
            progress.state = progress.agent_state = str(state.get("state", wire.WAITING))
            if isinstance(state.get("degraded"), list):
                progress.degraded = [str(d) for d in state["degraded"]]
            progress.local_rank = _as_number(state.get("localRank"), progress.local_rank, int)
            progress.world_size = _as_number(state.get("worldSize"), progress.world_size, int)
            progress.pid = _as_number(state.get("pid"), progress.pid, int)
            progress.gpu = _as_number(state.get("gpu"), progress.gpu, int)
            if isinstance(state.get("gpuUuid"), str) and state["gpuUuid"]:
                progress.gpu_uuid = state["gpuUuid"]
            progress.step = state.get("step", progress.step)
            progress.start_step, progress.end_step = state.get("startStep"), state.get("endStep")
            progress.trace, progress.stacks = state.get("trace"), state.get("stacks")
            if progress.state in wire.FAILED_STATES:
                progress.error = f"{progress.state}: {state.get('error') or state.get('message') or 'no reason given'}"
        if cancelling and progress.state == "pending":
            # The agent never picked the capture up, so it has nothing to cancel or report.
            progress.state = wire.CANCELLED

    def _time_out(self, session: Session) -> None:
        session.timed_out = True
        shared_dir.write_request(self.dir, session.id, CANCEL, session.spec)
        log.warning("session %s timed out after %d s", session.id, session.spec.timeoutSeconds)

    def _start_recorder(self, session: Session) -> None:
        from stepscope.sidecar.nvml import MetricsRecorder

        session.recorder = MetricsRecorder(self._backend, session.spec.hardwareMetrics.intervalMicroseconds)
        session.recorder.start()
        log.info(
            "session %s: recording GPU metrics every %d us",
            session.id,
            session.spec.hardwareMetrics.intervalMicroseconds,
        )

    def _queue_rank(self, session: Session, progress: RankProgress) -> None:
        progress.queued_state = progress.state
        for job in self._rank_jobs(session, progress):
            progress.jobs_left += 1
            self._uploader.submit(job)

    def _update_phase(self, session: Session) -> None:
        if session.finished:
            return
        phase, message = session_phases.phase_of(session.view(self.dir / wire.AGENTS_FOLDER))
        session.message = message
        self._transition(session, phase)

    @staticmethod
    def _transition(session: Session, phase: str) -> None:
        if session.timeline and session.phase == phase:
            return
        session.phase = phase
        session.timeline.append({"phase": phase, "time": time.time()})
        if phase in FINISHED_PHASES:
            log.info("session %s %s: %s", session.id, phase, session.message)

    def _forget_old(self) -> None:
        finished = [sid for sid, s in self._sessions.items() if s.finished]
        for sid in finished[: max(0, len(self._sessions) - HISTORY)]:
            del self._sessions[sid]

    # -- upload jobs ------------------------------------------------------------------------

    def _metrics_gpus(self, session: Session) -> dict[str, int] | None:
        """The GPUs whose samples a session keeps (recorder.stop's `gpus`): its ranks'; every GPU
        (None) only where no rank named one and the machine's GPUs are all the user's."""
        gpus = session.rank_gpus()
        return None if not gpus and self._own_every_gpu else gpus

    def _metrics_job(self, session: Session) -> Job:
        local = shared_dir.metrics_file(self.dir, session.id)
        key = layout.node_metrics(self.pod)

        def run() -> None:
            if session.metrics is None:
                if not local.is_file():
                    session.recorder.stop(local, gpus=self._metrics_gpus(session))
                session.metrics = analysis.read_metrics(local)
            if session.metrics.empty:
                session.metrics_withheld = (
                    NO_RANK_GPU if not session.rank_gpus() else "NVML shows none of the ranks' GPUs"
                )
                session.metrics = None  # no samples to join to the summaries
                return
            session.store.put_file(key, local)

        def done(error: str | None) -> None:
            with self._lock:
                session.metrics_pending = False
                if error is None and session.metrics_withheld:
                    self._remove_local(local)
                elif error is None:
                    session.artifacts.append(key)
                    self._remove_local(local)
                else:
                    session.message = f"GPU metrics not uploaded: {error}"
                self._update_phase(session)

        return Job(f"session {session.id}: GPU metrics", run, done)

    def _rank_jobs(self, session: Session, progress: RankProgress) -> list[Job]:
        """Jobs for what the rank wrote since its last queueing: each file once, and a summary the
        first time and again once a trace came (a hung rank that resumed)."""
        trace = shared_dir.local_file(self.dir, session.id, progress.trace)
        stacks = shared_dir.local_file(self.dir, session.id, progress.stacks)
        rank = progress.rank
        first = not progress.sent
        new_trace = trace is not None and trace.name not in progress.sent
        progress.captured_trace = progress.captured_trace or trace is not None
        jobs: list[Job] = []
        policy = session.spec.saveRawTrace
        if trace is not None and new_trace and (policy == "all" or (policy == "master" and rank == 0)):
            jobs.append(self._file_job(session, progress, trace, layout.rank_trace(rank)))
        if stacks is not None and stacks.name not in progress.sent:
            jobs.append(self._file_job(session, progress, stacks, layout.rank_stacks(rank)))
        if new_trace or (first and progress.state != wire.CANCELLED):
            jobs.append(self._summary_job(session, progress, trace))
        progress.sent.update(p.name for p in (trace, stacks) if p is not None)
        progress.sent.add("summary")
        return jobs

    def _file_job(self, session: Session, progress: RankProgress, path: Path, key: str) -> Job:
        return Job(
            f"session {session.id}: {key}",
            lambda: session.store.put_file(key, path),
            lambda error: self._job_done(session, progress, key, error),
        )

    def _summary_job(self, session: Session, progress: RankProgress, trace: Path | None) -> Job:
        key = layout.rank_summary(progress.rank)
        encoded: list[bytes] = []  # computed once, even when the upload is retried

        def run() -> None:
            if not encoded:
                encoded.append(self._summary(session, progress, trace))
            session.store.put_bytes(key, encoded[0])

        return Job(f"session {session.id}: {key}", run, lambda error: self._job_done(session, progress, key, error))

    def _summary(self, session: Session, progress: RankProgress, trace: Path | None) -> bytes:
        from stepscope.analysis.model import SUMMARY_VERSION, RankSummary, encode_summary

        if trace is None:
            # The diagnosis still hears of this rank and why it has no trace.
            summary = RankSummary(
                version=SUMMARY_VERSION,
                rank=progress.rank,
                worldSize=progress.world_size,
                localRank=progress.local_rank,
                pod=self.pod,
                node=self.node,
                error=progress.error or f"no trace ({progress.state})",
                warnings=list(progress.degraded),
            )
            return encode_summary(summary)
        summary = analysis.summarize(
            trace,
            rank=progress.rank,
            pod=self.pod,
            node=self.node,
            samples=session.metrics,
            comm_kernel_patterns=session.spec.analysis.commKernelPatterns,
        )
        # What the capture budget dropped or cut reaches the diagnosis and the report.
        summary.warnings = [*progress.degraded, *summary.warnings]
        if summary.error:
            # The rank counts as failed: its capture is of no use to the diagnosis. The trace and
            # the summary (which carries the reason) are still uploaded.
            log.warning(
                "session %s: rank %d's trace could not be summarised: %s", session.id, progress.rank, summary.error
            )
            with self._lock:
                progress.summary_error = f"trace not summarised: {summary.error}"
        return encode_summary(summary)

    def _job_done(self, session: Session, progress: RankProgress, key: str, error: str | None) -> None:
        with self._lock:
            progress.jobs_left -= 1
            if error is None:
                session.artifacts.append(key)
            else:
                progress.upload_errors.append(f"upload of {key} failed: {error}")
            if progress.queued and progress.jobs_left == 0 and not progress.upload_errors:
                for name in (progress.trace, progress.stacks):
                    path = shared_dir.local_file(self.dir, session.id, name)
                    if path is not None:
                        self._remove_local(path)
            self._update_phase(session)

    def _remove_local(self, path: Path) -> None:
        """Only after a confirmed upload: the pod's shared volume is small, traces are not."""
        if self._keep_local:
            return
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("uploaded %s but cannot remove it (%s); it stays on the shared volume", path, exc.strerror)


def _as_number(value: Any, default: T, kind: Callable[[Any], T]) -> T:
    """A number from an agent's file; a malformed one keeps what was known rather than stopping the follower."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        return default
