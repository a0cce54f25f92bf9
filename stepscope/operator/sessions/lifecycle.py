"""One ProfileSession from creation to its end: Pending -> Capturing -> Analyzing -> Succeeded or
Failed. Runs as the session's kopf daemon, so an operator restart resumes it from its status and
its pod record (stepscope.operator.sessions.pod_record): the phase says where it was, the record which
sidecars were triggered, and those are never triggered again (the PUT is idempotent too, for a
restart between the PUT and the record's write)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import kopf
from kubernetes.client.rest import ApiException

from stepscope import analysis
from stepscope.contracts import layout
from stepscope.contracts.layout import AnalysisResult
from stepscope.contracts.session import SessionSpec, SpecError
from stepscope.contracts.sidecar_api import SessionRequest, StoreCredentials
from stepscope.contracts.states import SESSION_FINAL, ConditionType, SessionPhase
from stepscope.contracts.wire import aligned_start_step
from stepscope.operator import credentials, kube, metrics
from stepscope.operator.namespace_keys import namespace_key
from stepscope.operator.sessions import cancellation, fanout, jobs, phases, pod_record
from stepscope.operator.sessions.phases import (
    Action,
    Captured,
    Failure,
    Finish,
    GiveUp,
    ReadAnalysis,
    RecordPods,
    Report,
    Retry,
    RunState,
    Trigger,
    Wait,
)
from stepscope.operator.sessions.pod_record import PodRecord
from stepscope.operator.sessions.record import SessionRecord, destination, open_destination
from stepscope.operator.sessions.selection import Target, label_selector, not_injected, select_targets, target_of
from stepscope.operator.sessions.status import (
    MAX_MESSAGE,
    PodProgress,
    StatusWriter,
    diagnosed_status,
    now_iso,
    parse_iso,
    pod_counts,
    set_condition,
)
from stepscope.operator.settings import GROUP, PLURAL, VERSION, OperatorSettings

log = logging.getLogger(__name__)
TERMINAL = SESSION_FINAL
TTL_RECHECK_S = 30.0  # how stale a changed ttlSecondsAfterFinished may be while a finished session waits


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


@dataclass
class Context:
    """What every session's and trigger's daemon shares: settings, the operator's HMAC key (never
    logged, never in a repr) and the bound on requests open to sidecars at once (fanout)."""

    settings: OperatorSettings
    key: bytes = field(repr=False)
    sidecars: fanout.Limit = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.sidecars = fanout.Limit(self.settings.fanout_concurrency)

    def key_for(self, namespace: str) -> bytes:
        """What the sidecars of `namespace` verify with (stepscope.operator.namespace_keys)."""
        return namespace_key(self.key, namespace)


class Fail(Exception):
    """Ends the session Failed; `reason` is a CamelCase word, the message says what to change."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


class Stopped(Exception):
    """The daemon is being stopped (operator shutdown or session deletion): leave state as is."""


def _analysis_result(found: dict[str, Any] | None) -> AnalysisResult | None:
    """The Job's result, or None where it left none that can be read (the Job's own outcome then speaks)."""
    try:
        return AnalysisResult.from_dict(found, layout.REPORT_RESULT) if found is not None else None
    except SpecError as exc:
        log.warning("%s", exc)
        return None


def _end(action: Action) -> NoReturn:
    """Ends the loop that asked phases.step: a Failure fails the session; nothing else may come."""
    if isinstance(action, Failure):
        raise Fail(action.reason, action.message)
    raise AssertionError(f"phases.step gave {action!r} where the shell does not apply it")


class SessionRunner:
    """The I/O shell around stepscope.operator.sessions.phases: it observes the pods, sidecars and the
    analysis Job, asks `phases.step` what to do, and does it."""

    def __init__(
        self, obj: dict[str, Any], ctx: Context, stopped: Any, logger: logging.Logger | logging.LoggerAdapter
    ) -> None:
        self.obj = obj
        meta = obj["metadata"]
        self.ns, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.generation = meta.get("generation")
        self.status: dict[str, Any] = dict(obj.get("status") or {})
        self.ctx, self.settings = ctx, ctx.settings
        self.stopped, self.log = stopped, logger
        self.writer = StatusWriter(self.ns, self.name, self.settings.status_interval_s)
        self.record: SessionRecord | None = None
        self.store: Any = None  # the session's store folder, once _open_record opened it
        self.pods: PodRecord | None = None
        self.dest = ""
        self.state: RunState | None = None  # once _drive has read the spec
        self.uninjected: tuple[str, ...] = ()  # selected pods that asked for the sidecar and started without it
        self.live: dict[str, Target] | None = None  # the sidecars a capture's last poll found Running

    @property
    def phase(self) -> str:
        return self.status.get("phase") or ""

    async def run(self) -> None:
        metrics.SESSIONS.set(self.uid, self.phase or SessionPhase.PENDING)
        try:
            if self.phase not in TERMINAL:
                await self._drive()
        except Stopped:
            return
        except Fail as exc:
            await self._cancel_triggered()
            await self._finish(SessionPhase.FAILED, exc.reason, exc.message)
        await self._expire()

    def _step(self, obs: phases.Observation) -> list[Action]:
        """phases.step on the state as status now says it; the caller applies the actions in order."""
        assert self.state is not None, "the spec is read first"
        triggered = next(
            (
                c.get("lastTransitionTime")
                for c in self.status.get("conditions") or []
                if c.get("type") == ConditionType.TRIGGERED
            ),
            None,
        )
        start = self.status.get("startTime")
        state = replace(
            self.state,
            phase=self.phase,
            start=parse_iso(start) if isinstance(start, str) and start else None,
            triggered=parse_iso(triggered) if triggered else None,
        )
        self.state, actions = phases.step(state, obs)
        return actions

    # -- the phases -------------------------------------------------------------------------

    async def _drive(self) -> None:
        try:
            spec = SessionSpec.from_dict(self.obj.get("spec") or {})
            spec.validate_for_cluster()
            selector = label_selector(spec.selector.to_dict() if spec.selector else {})
        except (SpecError, TypeError, ValueError) as exc:
            raise Fail("InvalidSpec", str(exc)) from None
        creds = await self._credentials(spec)
        self.dest = destination(spec, self.ns, self.name, self.uid)
        self.state = RunState(
            self.phase,
            self.ns,
            selector,
            self.dest,
            spec.timeoutSeconds,
            self.settings.selection_grace_s,
            spec.registrationTimeoutSeconds,
            spec.analysis.enabled,
            analysis_start_grace_s=self.settings.analysis_start_grace_s,
        )
        await self._open_record(spec, creds)
        if self.phase in ("", SessionPhase.PENDING):
            if not self.phase:
                await self._transition(
                    SessionPhase.PENDING,
                    "Created",
                    f"selecting pods ({selector})",
                    startTime=now_iso(),
                    artifacts={"prefix": self.dest},
                )
            targets = await self._await_targets(selector)
            await self._trigger(spec, creds, targets)
        if self.phase == SessionPhase.CAPTURING:
            await self._follow_capture(selector, spec)
        if self.phase == SessionPhase.ANALYZING:
            await self._follow_analysis(spec)

    async def _credentials(self, spec: SessionSpec) -> dict[str, Any] | None:
        if not spec.storage.credentialsSecret:
            return None
        # A Secret applied together with the session may be created just after it: wait for it
        # as long as for the pods (the selection grace), counted from the session's creation.
        created = parse_iso(self.obj["metadata"].get("creationTimestamp") or now_iso())
        while True:
            try:
                return await asyncio.to_thread(credentials.from_secret, self.ns, spec.storage.credentialsSecret)
            except credentials.SecretNotFound as exc:
                if time.time() - created >= self.settings.selection_grace_s:
                    raise Fail("SecretNotFound", str(exc)) from None
            except credentials.CredentialsError as exc:
                raise Fail("InvalidSecret", str(exc)) from None
            await self._sleep(min(1.0, self.settings.selection_grace_s))

    async def _open_record(self, spec: SessionSpec, creds: dict[str, Any] | None) -> None:
        snapshot = self._request(spec).to_dict()
        try:
            store = self.store = await asyncio.to_thread(open_destination, spec, self.dest, creds)
            self.record = SessionRecord(store, snapshot)
            await asyncio.to_thread(self.record.load)
            if not self.phase:  # the first write doubles as the check that the store is usable
                await asyncio.to_thread(self.record.append, "Pending", "created")
        except Exception as exc:  # noqa: BLE001 - any failure to reach the store is the user's to fix
            raise Fail(
                "StorageUnreachable",
                f"storage {spec.storage.uri} is not usable: {exc}; check spec.storage (bucket, endpoint, region) and "
                "its credentials",
            ) from None

    async def _await_targets(self, selector: str) -> list[Target]:
        """Running pods with a sidecar; waits the selection grace for pods still starting."""
        while True:
            pods = await self._list_pods(selector)
            self.uninjected = tuple(not_injected(pods))
            for action in self._step(
                phases.Listed(time.time(), len(pods), tuple(select_targets(pods)), self.uninjected)
            ):
                if isinstance(action, Trigger):
                    return list(action.targets)
                if not isinstance(action, Wait):
                    _end(action)
            await self._sleep(min(1.0, self.settings.selection_grace_s))

    def _request(self, spec: SessionSpec, **more: Any) -> SessionRequest:
        """The session as a sidecar takes it (PUT), and as its session.json in the store (no credentials)."""
        return SessionRequest(
            session=self.uid, namespace=self.ns, name=self.name, destination=self.dest, spec=spec, **more
        )

    async def _trigger(self, spec: SessionSpec, creds: dict[str, Any] | None, targets: list[Target]) -> None:
        previous = await self._read_pods()  # left by an earlier operator process
        already = previous.triggered if previous else frozenset()
        todo = [t for t in targets if t.pod not in already]
        try:
            await asyncio.to_thread(pod_record.check_room, already | {t.pod for t in todo})
        except pod_record.PodRecordTooLarge as exc:
            raise Fail("PodRecordTooLarge", f"{exc}; no sidecar was triggered") from None
        s = self.settings
        # Pods align too: every sidecar gets the same absolute start step.
        answers = await fanout.telemetry(
            todo, self.ctx.key_for(self.ns), limit=self.ctx.sidecars, timeout=s.sidecar_timeout_s
        )
        start_step = aligned_start_step(fanout.live_step_counts(answers), spec.capture.waitSteps)
        request = self._request(spec, credentials=StoreCredentials(**creds) if creds else None, startStep=start_step)
        outcomes = await fanout.trigger(
            todo,
            request,
            self.ctx.key_for(self.ns),
            limit=self.ctx.sidecars,
            timeout=s.sidecar_timeout_s,
            attempts=s.trigger_attempts,
        )
        answers_seen = phases.TriggerAnswers(
            already,
            frozenset(o.target.pod for o in outcomes if o.ok),
            {o.target.pod: o.error for o in outcomes if not o.ok},
            self.uninjected,
        )
        for action in self._step(answers_seen):
            if not isinstance(action, RecordPods):
                _end(action)
            self.pods = action.pods
            try:
                record = await asyncio.to_thread(pod_record.write, self.ns, self.name, self.uid, self.pods)
            except pod_record.PodRecordTooLarge as exc:  # the split outgrew the room checked above: undo the fan-out
                raise Fail(
                    "PodRecordTooLarge", f"{exc}; the {len(self.pods.triggered)} triggered sidecar(s) are cancelled"
                ) from None
            conditions = set_condition(
                self.status.get("conditions") or [],
                ConditionType.TRIGGERED,
                True,
                "Triggered",
                action.message,
                self.generation,
            )
            await self._transition(
                SessionPhase.CAPTURING,
                "Triggered",
                action.message,
                pods=pod_counts(record, self.pods),
                failedWorkers=list(action.failed_workers),
                conditions=conditions,
            )

    async def _follow_capture(self, selector: str, spec: SessionSpec) -> None:
        pods = self.pods or await self._read_pods()
        if pods is None:
            record = pod_record.record_name(self.name, self.uid)
            raise Fail(
                "PodRecordLost",
                f"ConfigMap {record}, the list of pods this session triggered, is gone, so the capture cannot be "
                f"followed; captures so far are kept in {self.dest}; create a new ProfileSession",
            )
        progress = {pod: PodProgress() for pod in pods.triggered}
        for pod in pods.refused:
            progress[pod] = PodProgress(lost="trigger refused by the sidecar")
        while True:
            await self._poll(selector, progress)
            for action in self._step(phases.Polled(time.time(), progress)):
                if isinstance(action, GiveUp):
                    for pod in action.pods:
                        progress[pod].lost = action.reason
                    await cancellation.cancel(
                        self.ns,
                        self.obj.get("spec") or {},
                        self.uid,
                        frozenset(action.pods),
                        self.settings,
                        self.ctx.key_for(self.ns),
                        self.ctx.sidecars,
                    )
                elif isinstance(action, Report):
                    patch = phases.progress_patch(self.status, action)
                    if patch is not None:
                        await self._write(patch)
                elif isinstance(action, Wait):
                    await self._sleep(self.settings.poll_interval_s)
                elif isinstance(action, Captured):
                    await self._captured(spec, action)
                    return
                else:
                    _end(action)

    async def _captured(self, spec: SessionSpec, captured: Captured) -> None:
        conditions = set_condition(
            self.status.get("conditions") or [],
            ConditionType.CAPTURED,
            True,
            "Captured",
            captured.message,
            self.generation,
        )
        if not captured.analyze:
            await self._finish(
                SessionPhase.SUCCEEDED, "Captured", captured.message + "; analysis disabled", conditions=conditions
            )
            return
        raw = await self._unsummarised()
        plan = jobs.shard_plan(len(raw), spec.analysis.parallelism, self.settings.analysis_max_parallelism)
        if plan is not None:
            completions, parallelism = plan
            job = await asyncio.to_thread(
                jobs.create_shards,
                self.ns,
                self.name,
                self.uid,
                self.settings,
                spec.storage.credentialsSecret,
                await self._secret_keys(spec),
                completions,
                parallelism,
            )
            await self._transition(
                SessionPhase.ANALYZING,
                "Captured",
                f"{captured.message}; {len(raw)} rank(s) have no summary: shard Job {job} "
                f"summarises them in {completions} shard(s), {parallelism} at a time",
                conditions=conditions,
                analysisShardJob=job,
            )
            return
        await self._create_analysis(
            spec, lambda job: f"{captured.message}; analysis Job {job} created", conditions=conditions
        )

    async def _create_analysis(self, spec: SessionSpec, message: Callable[[str], str], **fields: Any) -> None:
        job = await asyncio.to_thread(
            jobs.create_analysis,
            self.ns,
            self.name,
            self.uid,
            self.settings,
            spec.storage.credentialsSecret,
            await self._secret_keys(spec),
        )
        metrics.ANALYSIS_JOBS.inc()
        await self._transition(SessionPhase.ANALYZING, "Captured", message(job), analysisJob=job, **fields)

    async def _unsummarised(self) -> list[int]:
        """The ranks captured with a raw trace and no summary; none when the store cannot be listed
        (the analysis Job then meets the store's error itself)."""
        try:
            return await asyncio.to_thread(analysis.unsummarised_ranks, self.store)
        except Exception as exc:  # noqa: BLE001 - the analysis Job reports an unusable store
            self.log.warning(
                "%s/%s: listing %s for ranks without a summary failed: %s", self.ns, self.name, self.dest, exc
            )
            return []

    async def _poll(self, selector: str, progress: dict[str, PodProgress]) -> None:
        """One round: ask the sidecars, mark pods that went away as lost. After the first round the
        sidecars the last listing found are asked while the pods are listed again (at 10,240 pods
        the listing alone takes about a second); an answer then counts only if its pod is still
        Running at the address it was asked at."""
        if self.live is None:
            self.live = self._still_live(await self._list_pods(selector), progress)
            outcomes = await self._ask(list(self.live.values()))
        else:
            listing = asyncio.ensure_future(self._list_pods(selector))
            try:
                outcomes = await self._ask([t for pod, t in self.live.items() if not progress[pod].done])
                self.live = self._still_live(await listing, progress)
            finally:
                listing.cancel()
        unreachable_polls = self.settings.unreachable_polls
        for o in outcomes:
            p = progress[o.target.pod]
            if self.live.get(o.target.pod) != o.target:
                continue  # gone (marked lost) or moved since it was asked: the next round asks it anew
            if o.ok:
                p.answer, p.misses = o.answer, 0
                continue
            p.misses += 1
            # 404: the sidecar restarted and forgot the session; the rank's capture is gone.
            if p.misses >= unreachable_polls or o.status == 404:
                p.lost = f"sidecar lost the session: {o.error}"[:200]

    @staticmethod
    def _still_live(listed: list[kube.Pod], progress: dict[str, PodProgress]) -> dict[str, Target]:
        """The sidecar of every pod not done yet that is still Running; the others are marked lost."""
        pods = {p.metadata.name: p for p in listed}
        live: dict[str, Target] = {}
        for pod, p in progress.items():
            if p.done:
                continue
            target = target_of(pods[pod]) if pod in pods else None
            if target is None:
                status = pods[pod].status if pod in pods else None
                p.lost = (
                    "pod deleted during capture"
                    if pod not in pods
                    else f"pod left Running ({status.phase if status else None}) during capture"
                )
            else:
                live[pod] = target
        return live

    async def _ask(self, targets: list[Target]) -> list[fanout.Outcome]:
        return await fanout.poll(
            targets,
            self.uid,
            self.ctx.key_for(self.ns),
            limit=self.ctx.sidecars,
            timeout=self.settings.sidecar_timeout_s,
        )

    async def _secret_keys(self, spec: SessionSpec) -> dict[str, str]:
        if not spec.storage.credentialsSecret:
            return {}
        data = await asyncio.to_thread(credentials.read_secret_data, self.ns, spec.storage.credentialsSecret)
        return credentials.secret_key_names(data)

    async def _await_job(self, name: str) -> ReadAnalysis:
        while True:
            try:
                job = await asyncio.to_thread(kube.batch().read_namespaced_job, name, self.ns)
                outcome, message = jobs.job_outcome(job)
            except Exception as exc:
                if not kube.is_not_found(exc):
                    raise
                job, outcome, message = None, "Gone", ""
            now = time.time()
            failed_create = ""
            assert self.state is not None, "the spec is read first"
            if outcome == "Running" and phases.podless_too_long(self.state, now, *jobs.pod_presence(job)):
                failed_create = await asyncio.to_thread(jobs.failed_create, self.ns, name)
            for action in self._step(phases.JobSeen(now, name, outcome, message, failed_create)):
                if isinstance(action, ReadAnalysis):
                    return action
                if not isinstance(action, Wait):
                    _end(action)
            await self._sleep(self.settings.poll_interval_s)

    async def _follow_analysis(self, spec: SessionSpec) -> None:
        """The Jobs leave their results in the store; the operator alone writes them into the status."""
        shards = self.status.get("analysisShardJob") or ""
        if shards and not self.status.get("analysisJob"):
            summarised = await self._await_job(shards)
            failed = jobs.failed_indexes(await asyncio.to_thread(kube.batch().read_namespaced_job, shards, self.ns))
            done = (
                f"shard Job {shards} summarised every shard"
                if summarised.outcome == "Succeeded"
                else f"shard Job {shards} gave up{f' on shards {failed}' if failed else ''} ({summarised.message}): "
                "the analysis Job summarises the ranks left itself"
            )
            await self._create_analysis(spec, lambda job: f"{done}; analysis Job {job} created")
        ended = await self._await_job(self.status.get("analysisJob") or "")
        assert self.record is not None, "the store is opened first"
        result, report = await asyncio.gather(
            asyncio.to_thread(self.record.read_json, layout.REPORT_RESULT),
            asyncio.to_thread(self.record.read_json, layout.REPORT_DIAGNOSIS),
        )
        found = _analysis_result(result)
        analyzed = {"status": "True" if found.analyzed else "False", "message": found.message} if found else {}
        diagnosis = (report or {}).get(
            "diagnosis"
        )  # the report's document: the diagnosis beside the full findings and tables
        summary = str((diagnosis or {}).get("summary", "analysis done"))
        for action in self._step(phases.AnalysisStatus(ended.outcome, ended.message, analyzed, summary)):
            if not isinstance(action, Finish):
                _end(action)
            patch = diagnosed_status(self.status, diagnosis or {"summary": summary}, self.dest, self.generation)
            await self._finish(SessionPhase.SUCCEEDED, action.reason, action.message, **patch)

    # -- status, events, timeline ----------------------------------------------------------

    async def _write(self, patch: dict[str, Any]) -> None:
        patch = {**patch, "observedGeneration": self.generation}
        self.status.update(patch)
        await self.writer.write(patch)

    async def _transition(self, phase: str, reason: str, message: str, **fields: Any) -> None:
        patch = {"phase": phase, "message": message[:MAX_MESSAGE], **fields}
        conditions = fields.get("conditions") or self.status.get("conditions") or []
        if phase in TERMINAL:
            ready = phase == SessionPhase.SUCCEEDED
            conditions = set_condition(conditions, ConditionType.READY, ready, reason, message, self.generation)
            patch["completionTime"] = now_iso()
        patch["conditions"] = conditions
        await self._write(patch)
        metrics.SESSIONS.set(self.uid, phase)
        # kopf.events takes the object as a plain mapping too (it reads apiVersion, kind and metadata)
        (kopf.warn if phase == SessionPhase.FAILED else kopf.info)(
            self.obj,  # type: ignore[arg-type]  # see above
            reason=reason,
            message=f"{phase}: {message}",
        )
        self.log.info("%s/%s -> %s (%s): %s", self.ns, self.name, phase, reason, message)
        if self.record is not None:
            try:
                await asyncio.to_thread(self.record.append, phase, message)
            except Exception as exc:  # noqa: BLE001 - the session's outcome must not hinge on its own diary
                self.log.warning("session.json not updated: %s", exc)

    async def _finish(self, phase: str, reason: str, message: str, **fields: Any) -> None:
        conditions = fields.pop("conditions", None) or self.status.get("conditions") or []
        if phase == SessionPhase.FAILED:
            pending = [
                t
                for t in (ConditionType.TRIGGERED, ConditionType.CAPTURED, ConditionType.ANALYZED)
                if not any(c.get("type") == t for c in conditions)
            ]
            for t in pending:
                conditions = set_condition(conditions, t, False, reason, message, self.generation)
        await self._transition(phase, reason, message, conditions=conditions, **fields)

    # -- helpers ---------------------------------------------------------------------------

    async def _read_pods(self) -> PodRecord | None:
        try:
            return await asyncio.to_thread(pod_record.read, self.ns, self.name, self.uid)
        except pod_record.PodRecordUnreadable as exc:
            raise Fail(
                "PodRecordUnreadable",
                f"{exc}, so which sidecars run this session is unknown; captures so far are kept in {self.dest}; "
                "create a new ProfileSession",
            ) from None

    async def _cancel_triggered(self) -> None:
        """A session failing before its capture ended is cancelled on the sidecars its pod record
        lists, in Pending too: a restarted operator may fail it there (its Secret or store gone)
        after an earlier process triggered them. They keep what they captured."""
        if self.phase not in ("", SessionPhase.PENDING, SessionPhase.CAPTURING):
            return
        try:
            pods = self.pods or await asyncio.to_thread(pod_record.read, self.ns, self.name, self.uid)
        except pod_record.PodRecordUnreadable:
            return  # the failure says so; the sidecars stop on their own after spec.timeoutSeconds
        if pods is not None:
            await cancellation.cancel(
                self.ns,
                self.obj.get("spec") or {},
                self.uid,
                pods.triggered,
                self.settings,
                self.ctx.key_for(self.ns),
                self.ctx.sidecars,
            )

    async def _list_pods(self, selector: str) -> list[kube.Pod]:
        """The selected pods; on an error phases.step says whether to fail the session now or
        to raise it (kopf retries the daemon)."""
        try:
            pods = await asyncio.to_thread(kube.list_pods, self.ns, selector)
        except Exception as exc:
            http = exc.status if isinstance(exc, ApiException) else None
            words = f"HTTP {exc.status} {_api_message(exc)}" if isinstance(exc, ApiException) else str(exc)
            for action in self._step(phases.ListFailed(time.time(), http, words)):
                if not isinstance(action, Retry):
                    _end(action)
            raise
        return pods

    async def _sleep(self, seconds: float) -> None:
        await self.stopped.wait(seconds)
        if self.stopped:
            raise Stopped()

    async def _expire(self) -> None:
        """Delete the session ttlSecondsAfterFinished after it finished (its children go with it).
        The TTL may change after the trigger (the one mutable spec field): it is read again before
        the deletion and at least every TTL_RECHECK_S while waiting."""
        done = self.status.get("completionTime")
        ttl = (self.obj.get("spec") or {}).get("ttlSecondsAfterFinished")
        while done and ttl is not None:
            wait = parse_iso(done) + float(ttl) - time.time()
            await self.stopped.wait(max(0.0, min(wait, TTL_RECHECK_S)))
            if self.stopped:
                return
            try:
                fresh = await asyncio.to_thread(kube.get_session, self.ns, self.name)
            except Exception as exc:
                if kube.is_not_found(exc):
                    return
                raise
            latest = (fresh.get("spec") or {}).get("ttlSecondsAfterFinished")
            if latest == ttl and wait <= TTL_RECHECK_S:
                break
            ttl = latest
        else:
            return
        self.log.info("%s/%s finished %ss ago: deleting it (ttlSecondsAfterFinished)", self.ns, self.name, ttl)
        try:
            await asyncio.to_thread(
                kube.custom().delete_namespaced_custom_object, GROUP, VERSION, self.ns, PLURAL, self.name
            )
        except Exception as exc:
            if not kube.is_not_found(exc):
                raise
