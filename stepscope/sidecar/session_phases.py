"""The sidecar's decisions about one capture session, as pure functions over a frozen view of it:
`advance` (one follower round: which ranks the sidecar declares failed, the session's timeout,
when the GPU recorder starts, what to upload) and `phase_of` (the session's phase and message,
docs/wire.md). stepscope.sidecar.sessions.SessionManager is the shell: it reads the shared
directory, builds the view, and applies the actions (request files, the recorder, upload jobs).
The clock comes in as `now`; tests/sidecar/test_session_phases.py drives every transition."""
from __future__ import annotations

from dataclasses import dataclass, replace

from stepscope.contracts import wire
from stepscope.contracts.states import SIDECAR_FINAL, RankState, SidecarPhase

FINISHED_PHASES = SIDECAR_FINAL
PENDING = RankState.PENDING  # a rank with no state file yet: its agent has not seen the request


def settled(state: str) -> bool:
    """Nothing more to wait for before the session may end: final, or hung (stacks taken)."""
    return state in wire.FINAL_STATES or state == wire.HUNG


@dataclass(frozen=True)
class RankView:
    """What the decisions read of one rank."""
    rank: int
    state: str = PENDING
    pid: int = 0
    step: int | None = None
    last_sign_of_life: float = 0.0  # epoch seconds: its heartbeat or state file, the later
    queued_state: str | None = None  # the state whose artifacts were last queued for upload
    jobs_left: int = 0
    failed: bool = False  # failed, hung or refused, or its summary or an upload failed
    error: str | None = None  # all its errors, in words
    degraded: tuple[str, ...] = ()  # what the capture budget cut

    @property
    def queued(self) -> bool:
        return self.queued_state == self.state


@dataclass(frozen=True)
class SessionView:
    phase: str
    destination: str
    agents_dir: str  # where training processes register (for messages)
    timeout_seconds: int  # spec.timeoutSeconds
    wait_steps: int  # spec.capture.waitSteps
    accepted_at: float  # epoch seconds
    ranks: tuple[RankView, ...]  # by rank
    cancel_requested: bool = False
    timed_out: bool = False
    metrics_wanted: bool = False  # spec.hardwareMetrics on and the node has NVML
    recording: bool = False
    metrics_queued: bool = False
    metrics_pending: bool = False  # the GPU metrics' upload has not finished
    metrics_withheld: str = ""  # why no GPU metrics were uploaded, though sampled


@dataclass(frozen=True)
class Limits:
    """How long a rank may be silent before the sidecar declares it gone (sessions.py's defaults)."""
    stale_after_s: float
    export_grace_s: float  # while it writes its trace, which holds the GIL


# -- actions ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """The sidecar declares a rank failed (its process went silent, or the session timed out)."""
    rank: int
    error: str


@dataclass(frozen=True)
class TimeOut:
    """spec.timeoutSeconds passed: ask every agent to cancel (request.json), mark the session."""


@dataclass(frozen=True)
class StartRecorder:
    """Start sampling the node's GPUs: a rank saw the trigger, so its wait steps lead the window."""


@dataclass(frozen=True)
class QueueMetrics:
    """Every rank settled: stop the recorder and upload the GPU metrics (summaries wait for them)."""


@dataclass(frozen=True)
class QueueRank:
    """Upload what this settled rank wrote since its last queueing."""
    rank: int


Action = Verdict | TimeOut | StartRecorder | QueueMetrics | QueueRank


# -- the transitions --------------------------------------------------------------------------

def _liveness(rank: RankView, now: float, limits: Limits) -> Verdict | None:
    silent = now - rank.last_sign_of_life
    if rank.state == wire.WRITING:
        # Exporting holds the process's GIL: silence is expected, for a while.
        if silent <= limits.export_grace_s:
            return None
        return Verdict(rank.rank, f"failed: the training process (pid {rank.pid}) was writing its trace and has sent no "
                                  f"heartbeat for {silent:.0f} s: it died while exporting, or its export takes longer than "
                                  f"{limits.export_grace_s:.0f} s (lower spec.capture.limits or capture fewer steps)")
    if silent <= limits.stale_after_s:
        return None
    return Verdict(rank.rank, f"failed: the training process (pid {rank.pid}) stopped sending heartbeats "
                              f"{silent:.0f} s ago while {rank.state}, before the capture finished")


def advance(view: SessionView, now: float, limits: Limits) -> tuple[SessionView, list[Action]]:
    """One follower round of an active session, after its ranks' files were read into `view`."""
    actions: list[Action] = []
    ranks = list(view.ranks)

    def fail(i: int, verdict: Verdict) -> None:
        ranks[i] = replace(ranks[i], state=wire.FAILED, error=verdict.error, failed=True)
        actions.append(verdict)

    for i, rank in enumerate(ranks):
        if rank.state not in wire.FINAL_STATES and (verdict := _liveness(rank, now, limits)) is not None:
            fail(i, verdict)
    if view.phase not in FINISHED_PHASES and now - view.accepted_at > view.timeout_seconds:
        view = replace(view, timed_out=True)
        actions.append(TimeOut())
        for i, rank in enumerate(ranks):
            if not settled(rank.state):
                fail(i, Verdict(rank.rank, f"failed: timed out after {view.timeout_seconds} s while {rank.state} at step {rank.step}"))
    if (not view.recording and view.metrics_wanted
            and any(r.state == wire.WAITING or r.state in wire.STARTED_STATES for r in ranks)):
        view = replace(view, recording=True)
        actions.append(StartRecorder())
    if view.recording and not view.metrics_queued:
        if not (ranks and all(settled(r.state) for r in ranks)):
            return replace(view, ranks=tuple(ranks)), actions  # summaries wait for the node's metrics, which end with the last rank
        view = replace(view, metrics_queued=True, metrics_pending=True)
        actions.append(QueueMetrics())
    for i, rank in enumerate(ranks):
        if settled(rank.state) and not rank.queued:
            ranks[i] = replace(rank, queued_state=rank.state)
            actions.append(QueueRank(rank.rank))
    return replace(view, ranks=tuple(ranks)), actions


def phase_of(view: SessionView) -> tuple[str, str]:
    """The session's phase and message (docs/wire.md). A finished session keeps its own."""
    ranks = view.ranks
    all_settled = bool(ranks) and all(settled(r.state) for r in ranks)
    uploading = view.metrics_pending or any(not r.queued or r.jobs_left for r in ranks)
    failures = [f"rank {r.rank} {r.error}" for r in ranks if r.failed]
    done = (not ranks or all_settled) and not uploading
    if view.cancel_requested and done:
        phase, message = SidecarPhase.CANCELLED, f"cancelled; what was captured is in {view.destination}"
    elif view.timed_out and done:
        phase = SidecarPhase.FAILED
        message = f"timed out after {view.timeout_seconds} s: " + ("; ".join(failures[:5]) if failures else
                                                                     f"no training process registered in {view.agents_dir}")
    elif not ranks:
        phase, message = SidecarPhase.PENDING, f"waiting for training processes to register in {view.agents_dir}"
    elif not any(r.state in wire.STARTED_STATES or settled(r.state) for r in ranks):
        waiting = sum(r.state == wire.WAITING for r in ranks)
        phase, message = SidecarPhase.PENDING, f"{waiting}/{len(ranks)} rank(s) saw the request, waiting {view.wait_steps} step(s) before capturing"
    elif not all_settled:
        capturing = sum(r.state in (wire.CAPTURING, wire.WRITING) for r in ranks)
        captured = sum(r.state == wire.DONE for r in ranks)
        phase, message = SidecarPhase.CAPTURING, f"{capturing} rank(s) capturing, {captured}/{len(ranks)} captured"
    elif uploading:
        phase, message = SidecarPhase.UPLOADING, f"uploading to {view.destination}"
    elif failures:
        phase, message = SidecarPhase.FAILED, "; ".join(failures[:5]) + (f" (+{len(failures) - 5} more)" if len(failures) > 5 else "")
    else:
        phase, message = SidecarPhase.SUCCEEDED, f"{len(ranks)} rank(s) captured and uploaded to {view.destination}"
    degraded = [r for r in ranks if r.degraded]
    if degraded and phase in FINISHED_PHASES:
        message += f"; {len(degraded)} rank(s) degraded by the capture budget, rank {degraded[0].rank}: {'; '.join(degraded[0].degraded)}"
    if view.metrics_withheld and phase in FINISHED_PHASES:
        message += f"; GPU metrics not uploaded: {view.metrics_withheld}"
    return phase, message
