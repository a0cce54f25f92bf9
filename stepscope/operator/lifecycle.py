"""One ProfileSession from creation to its end: Pending -> Capturing -> Analyzing -> Succeeded or
Failed. Runs as the session's kopf daemon, so an operator restart resumes it from its status and
its pod record (stepscope.operator.pod_record): the phase says where it was, the record which
sidecars were triggered, and those are never triggered again (the PUT is idempotent too, for a
restart between the PUT and the record's write)."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from stepscope.operator import cancellation, credentials, fanout, jobs, kube, metrics, pod_record
from stepscope.operator.namespace_keys import namespace_key
from stepscope.operator.pod_record import PodRecord
from stepscope.operator.record import SessionRecord, destination, open_destination
from stepscope.operator.selection import Target, label_selector, not_injected, select_targets, target_of
from stepscope.operator.settings import GROUP, INJECT_LABEL, PLURAL, VERSION, OperatorSettings
from stepscope.operator.status import MAX_FAILED_WORKERS, MAX_MESSAGE, WAITING, PodProgress, StatusWriter, aggregate, failed_worker, now_iso, parse_iso, pod_counts, registration_wait, set_condition, unregistered, unregistered_reason
from stepscope.session import SessionSpec, SpecError

TERMINAL = ("Succeeded", "Failed")
TTL_RECHECK_S = 30.0  # how stale a changed ttlSecondsAfterFinished may be while a finished session waits
# What a refused pod list means for the user: the answer is final, retrying cannot help.
LIST_REFUSALS = {
    400: "fix spec.selector",
    403: "the operator's ServiceAccount may not list pods here: add the namespace to the chart's operator.namespaces (docs/security.md)",
    422: "fix spec.selector",
}


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


@dataclass
class Context:
    """What every session's daemon shares: settings and the operator's HMAC key (never logged)."""
    settings: OperatorSettings
    key: bytes

    def key_for(self, namespace: str) -> bytes:
        """What the sidecars of `namespace` verify with (stepscope.operator.namespace_keys)."""
        return namespace_key(self.key, namespace)


def _uninjected(pods: list[str]) -> str:
    more = f" and {len(pods) - 3} more" if len(pods) > 3 else ""
    return (f"not profiled: pod(s) {', '.join(pods[:3])}{more} asked for the sidecar ({INJECT_LABEL}=true) but started without it "
            "(see their SidecarNotInjected events); recreate them to profile them")


class Fail(Exception):
    """Ends the session Failed; `reason` is a CamelCase word, the message says what to change."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


class Stopped(Exception):
    """The daemon is being stopped (operator shutdown or session deletion): leave state as is."""


class SessionRunner:
    def __init__(self, obj: dict[str, Any], ctx: Context, stopped: Any, logger: logging.Logger | logging.LoggerAdapter) -> None:
        self.obj = obj
        meta = obj["metadata"]
        self.ns, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.generation = meta.get("generation")
        self.status: dict[str, Any] = dict(obj.get("status") or {})
        self.ctx, self.settings = ctx, ctx.settings
        self.stopped, self.log = stopped, logger
        self.writer = StatusWriter(self.ns, self.name, self.settings.status_interval_s)
        self.record: SessionRecord | None = None
        self.pods: PodRecord | None = None
        self.dest = ""
        # spec.timeoutSeconds once _drive has read the spec (the spec's own default until then)
        self.timeout_s = float(SessionSpec.timeoutSeconds)
        self.unregistered: list[str] = []  # pods lost for want of a registered training process
        self.uninjected: list[str] = []  # selected pods that asked for the sidecar and started without it

    @property
    def phase(self) -> str:
        return self.status.get("phase") or ""

    async def run(self) -> None:
        metrics.SESSIONS.set(self.uid, self.phase or "Pending")
        try:
            if self.phase not in TERMINAL:
                await self._drive()
        except Stopped:
            return
        except Fail as exc:
            await self._cancel_triggered()
            await self._finish("Failed", exc.reason, exc.message)
        await self._expire()

    # -- the phases -------------------------------------------------------------------------

    async def _drive(self) -> None:
        try:
            spec = SessionSpec.from_dict(self.obj.get("spec") or {})
            selector = label_selector(spec.selector)
        except (SpecError, TypeError, ValueError) as exc:
            raise Fail("InvalidSpec", str(exc)) from None
        self.timeout_s = float(spec.timeoutSeconds)
        creds = await self._credentials(spec)
        self.dest = destination(spec, self.ns, self.name, self.uid)
        await self._open_record(spec, creds)
        if self.phase in ("", "Pending"):
            if not self.phase:
                await self._transition("Pending", "Created", f"selecting pods ({selector})", startTime=now_iso(), artifacts={"prefix": self.dest})
            targets = await self._await_targets(selector)
            await self._trigger(spec, creds, targets)
        if self.phase == "Capturing":
            await self._follow_capture(selector, spec)
        if self.phase == "Analyzing":
            await self._follow_analysis()

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
        snapshot = {"session": self.uid, "namespace": self.ns, "name": self.name, "destination": self.dest, "spec": spec.to_dict()}
        try:
            store = await asyncio.to_thread(open_destination, spec, self.dest, creds)
            self.record = SessionRecord(store, snapshot)
            await asyncio.to_thread(self.record.load)
            if not self.phase:  # the first write doubles as the check that the store is usable
                await asyncio.to_thread(self.record.append, "Pending", "created")
        except Exception as exc:  # noqa: BLE001 - any failure to reach the store is the user's to fix
            if spec.storage.scheme in ("s3", "oss"):
                raise Fail("StorageUnreachable", f"storage {spec.storage.uri} is not usable: {exc}; check spec.storage (bucket, endpoint, region) and its credentials") from None
            self.log.warning("session.json not written to %s: %s", self.dest, exc)
            self.record = None

    async def _await_targets(self, selector: str) -> list[Target]:
        """Running pods with a sidecar; waits the selection grace for pods still starting."""
        since = parse_iso(self.status.get("startTime") or now_iso())
        while True:
            pods = await self._list_pods(selector)
            targets = select_targets(pods)
            self.uninjected = not_injected(pods)
            if targets:
                return targets
            if time.time() - since >= self.settings.selection_grace_s:
                seen = f"{len(pods)} pod(s) match but none is Running with a container port named 'stepscope'" if pods else "no pod matches"
                if self.uninjected:
                    seen += f"; {_uninjected(self.uninjected)}"
                raise Fail("NoPodsSelected", f"spec.selector ({selector}) selects no Running pod with a stepscope sidecar in namespace {self.ns}: {seen}; label the training pods with stepscope.io/inject=\"true\" or fix spec.selector")
            await self._sleep(min(1.0, self.settings.selection_grace_s))

    async def _trigger(self, spec: SessionSpec, creds: dict[str, Any] | None, targets: list[Target]) -> None:
        body = {"session": self.uid, "namespace": self.ns, "name": self.name, "destination": self.dest, "spec": spec.to_dict()}
        if creds:
            body["credentials"] = creds
        previous = await self._read_pods()  # left by an earlier operator process
        already = previous.triggered if previous else frozenset()
        todo = [t for t in targets if t.pod not in already]
        try:
            await asyncio.to_thread(pod_record.check_room, already | {t.pod for t in todo})
        except pod_record.PodRecordTooLarge as exc:
            raise Fail("PodRecordTooLarge", f"{exc}; no sidecar was triggered") from None
        s = self.settings
        # Pods align too: every sidecar gets the same absolute start step.
        answers = await asyncio.to_thread(fanout.telemetry, todo, self.ctx.key_for(self.ns), concurrency=s.fanout_concurrency, timeout=s.sidecar_timeout_s)
        start_step = fanout.aligned_start_step(answers, spec.capture.waitSteps)
        if start_step is not None:
            body["startStep"] = start_step
        outcomes = await asyncio.to_thread(fanout.trigger, todo, self.uid, body, self.ctx.key_for(self.ns), concurrency=s.fanout_concurrency, timeout=s.sidecar_timeout_s, attempts=s.trigger_attempts)
        accepted = already | {o.target.pod for o in outcomes if o.ok}
        refused = {o.target.pod: f"trigger refused: {o.error}" for o in outcomes if not o.ok}
        if not accepted:
            first = next(iter(refused.values()), "no sidecar answered")
            raise Fail("TriggerFailed", f"no sidecar accepted the session ({len(refused)} tried); first error: {first}")
        self.pods = PodRecord(accepted, frozenset(refused))
        try:
            record = await asyncio.to_thread(pod_record.write, self.ns, self.name, self.uid, self.pods)
        except pod_record.PodRecordTooLarge as exc:  # the split outgrew the room checked above: undo the fan-out
            raise Fail("PodRecordTooLarge", f"{exc}; the {len(accepted)} triggered sidecar(s) are cancelled") from None
        message = f"{len(accepted)} sidecar(s) triggered" + (f", {len(refused)} refused" if refused else "") + (f"; {_uninjected(self.uninjected)}" if self.uninjected else "")
        failed = [failed_worker(pod, None, reason) for pod, reason in sorted(refused.items())][:MAX_FAILED_WORKERS]
        conditions = set_condition(self.status.get("conditions") or [], "Triggered", True, "Triggered", message, self.generation)
        await self._transition("Capturing", "Triggered", message, pods=pod_counts(record, self.pods), failedWorkers=failed, conditions=conditions)

    async def _follow_capture(self, selector: str, spec: SessionSpec) -> None:
        pods = self.pods or await self._read_pods()
        if pods is None:
            record = pod_record.record_name(self.name, self.uid)
            raise Fail("PodRecordLost", f"ConfigMap {record}, the list of pods this session triggered, is gone, so the capture cannot be followed; captures so far are kept in {self.dest}; create a new ProfileSession")
        progress = {pod: PodProgress() for pod in pods.triggered}
        for pod in pods.refused:
            progress[pod] = PodProgress(lost="trigger refused by the sidecar")
        s = self.settings
        while True:
            await self._poll(selector, progress)
            await self._give_up_unregistered(spec, progress)
            agg = aggregate(progress)
            await self._progress(agg.workers, agg.failed_workers, registration_wait(progress, spec.registrationTimeoutSeconds))
            if agg.done:
                break
            if self._timed_out():  # run() cancels it on the sidecars
                raise self._capture_timeout(spec, agg.workers)
            await self._sleep(s.poll_interval_s)
        uploaded, total = agg.workers["uploaded"], agg.workers["total"]
        # A hung job makes no step to capture, but its hung ranks' stacks are the diagnosis.
        if uploaded == 0 and not agg.hung:
            # The sidecars keep the same timeout: one that ran out first ended its workers, which is
            # the session's timeout too, not a capture failure of its own.
            if self._timed_out():
                raise self._capture_timeout(spec, agg.workers)
            if self.unregistered:
                more = f" (and {len(self.unregistered) - 1} more pod(s))" if len(self.unregistered) > 1 else ""
                raise Fail("NoTrainingProcess", f"pod {self.unregistered[0]}{more}: {unregistered_reason(spec.registrationTimeoutSeconds)}")
            raise Fail("CaptureFailed", f"no worker uploaded a capture ({agg.workers['failed']} of {total} failed); first: {agg.failed_workers[0]['reason'] if agg.failed_workers else 'unknown'}")
        message = f"{uploaded} of {total} worker(s) captured and uploaded" + (f"; {agg.hung} hung, their Python stacks uploaded" if agg.hung else "")
        conditions = set_condition(self.status.get("conditions") or [], "Captured", True, "Captured", message, self.generation)
        if not spec.analysisEnabled:
            await self._finish("Succeeded", "Captured", message + "; analysis disabled", conditions=conditions)
            return
        job = await asyncio.to_thread(jobs.create_analysis, self.ns, self.name, self.uid, s, spec.storage.credentialsSecret, await self._secret_keys(spec))
        metrics.ANALYSIS_JOBS.inc()
        await self._transition("Analyzing", "Captured", f"{message}; analysis Job {job} created", conditions=conditions, analysisJob=job)

    async def _poll(self, selector: str, progress: dict[str, PodProgress]) -> None:
        """One round: mark pods that went away as lost, ask the others' sidecars."""
        s = self.settings
        pods = {p.metadata.name: p for p in await self._list_pods(selector)}
        live: list[Target] = []
        for pod, p in progress.items():
            if p.done:
                continue
            target = target_of(pods[pod]) if pod in pods else None
            if target is None:
                p.lost = "pod deleted during capture" if pod not in pods else f"pod left Running ({pods[pod].status.phase}) during capture"
            else:
                live.append(target)
        for o in await asyncio.to_thread(fanout.poll, live, self.uid, self.ctx.key_for(self.ns), concurrency=s.fanout_concurrency, timeout=s.sidecar_timeout_s):
            p = progress[o.target.pod]
            if o.ok:
                p.answer, p.misses = o.answer, 0
                continue
            p.misses += 1
            # 404: the sidecar restarted and forgot the session; the rank's capture is gone.
            if p.misses >= s.unreachable_polls or o.status == 404:
                p.lost = f"sidecar lost the session: {o.error}"[:200]

    async def _give_up_unregistered(self, spec: SessionSpec, progress: dict[str, PodProgress]) -> None:
        """A pod whose training never registered with its sidecar is lost with the reason (and
        cancelled there), rather than keeping the session Capturing until spec.timeoutSeconds."""
        triggered = next((c.get("lastTransitionTime") for c in self.status.get("conditions") or [] if c.get("type") == "Triggered"), None)
        since = parse_iso(triggered or self.status.get("startTime") or now_iso())
        pods = unregistered(progress, time.time() - since, spec.registrationTimeoutSeconds)
        if not pods:
            return
        for pod in pods:
            progress[pod].lost = unregistered_reason(spec.registrationTimeoutSeconds)
        self.unregistered += pods
        await asyncio.to_thread(cancellation.cancel, self.ns, self.obj.get("spec") or {}, self.uid, frozenset(pods), self.settings, self.ctx.key)

    async def _secret_keys(self, spec: SessionSpec) -> dict[str, str]:
        if not spec.storage.credentialsSecret:
            return {}
        data = await asyncio.to_thread(credentials.read_secret_data, self.ns, spec.storage.credentialsSecret)
        return credentials.secret_key_names(data)

    async def _follow_analysis(self) -> None:
        name = self.status.get("analysisJob") or ""
        while True:
            try:
                job = await asyncio.to_thread(kube.batch().read_namespaced_job, name, self.ns)
            except Exception as exc:
                if not kube.is_not_found(exc):
                    raise
                raise Fail("AnalysisFailed", f"analysis Job {name} disappeared") from None
            outcome, message = jobs.job_outcome(job)
            if outcome != "Running":
                break
            if self._timed_out():
                raise Fail("Timeout", f"analysis did not finish within spec.timeoutSeconds; captures are kept in {self.dest}")
            await self._sleep(self.settings.poll_interval_s)
        fresh = await asyncio.to_thread(kube.get_session, self.ns, self.name)
        fresh_status = fresh.get("status") or {}
        conditions = self.status["conditions"] = fresh_status.get("conditions") or []
        analyzed: dict[str, Any] = next((c for c in conditions if c.get("type") == "Analyzed"), {})
        if outcome == "Failed":
            raise Fail("AnalysisFailed", str(analyzed.get("message") or message) if analyzed.get("status") == "False" else message)
        self.status.update({k: fresh_status[k] for k in ("diagnosis", "artifacts") if k in fresh_status})
        summary = (fresh_status.get("diagnosis") or {}).get("summary", "analysis done")
        await self._finish("Succeeded", "Analyzed", summary, conditions=conditions)

    # -- status, events, timeline ----------------------------------------------------------

    async def _progress(self, workers: dict[str, int], failed: list[dict[str, Any]], waiting: str | None) -> None:
        message = self.status.get("message") or ""
        if waiting is None and message.startswith(WAITING):
            waiting = "every selected pod's training processes registered; capturing"
        if workers == self.status.get("workers") and failed == self.status.get("failedWorkers") and waiting in (None, message):
            return
        patch = {"workers": workers, "failedWorkers": failed, "workersReady": f"{workers['captured']}/{workers['total']}"}
        await self._write({**patch, "message": waiting[:MAX_MESSAGE]} if waiting else patch)

    async def _write(self, patch: dict[str, Any]) -> None:
        patch = {**patch, "observedGeneration": self.generation}
        self.status.update(patch)
        await self.writer.write(patch)

    async def _transition(self, phase: str, reason: str, message: str, **fields: Any) -> None:
        patch = {"phase": phase, "message": message[:MAX_MESSAGE], **fields}
        conditions = fields.get("conditions") or self.status.get("conditions") or []
        if phase in TERMINAL:
            ready = phase == "Succeeded"
            conditions = set_condition(conditions, "Ready", ready, reason, message, self.generation)
            patch["completionTime"] = now_iso()
        patch["conditions"] = conditions
        await self._write(patch)
        metrics.SESSIONS.set(self.uid, phase)
        # kopf.events takes the object as a plain mapping too (it reads apiVersion, kind and metadata)
        (kopf.warn if phase == "Failed" else kopf.info)(self.obj, reason=reason, message=f"{phase}: {message}")  # type: ignore[arg-type]  # see above
        self.log.info("%s/%s -> %s (%s): %s", self.ns, self.name, phase, reason, message)
        if self.record is not None:
            try:
                await asyncio.to_thread(self.record.append, phase, message)
            except Exception as exc:  # noqa: BLE001 - the session's outcome must not hinge on its own diary
                self.log.warning("session.json not updated: %s", exc)

    async def _finish(self, phase: str, reason: str, message: str, **fields: Any) -> None:
        conditions = fields.pop("conditions", None) or self.status.get("conditions") or []
        if phase == "Failed":
            pending = [t for t in ("Triggered", "Captured", "Analyzed") if not any(c.get("type") == t for c in conditions)]
            for t in pending:
                conditions = set_condition(conditions, t, False, reason, message, self.generation)
        await self._transition(phase, reason, message, conditions=conditions, **fields)

    # -- helpers ---------------------------------------------------------------------------

    async def _read_pods(self) -> PodRecord | None:
        try:
            return await asyncio.to_thread(pod_record.read, self.ns, self.name, self.uid)
        except pod_record.PodRecordUnreadable as exc:
            raise Fail("PodRecordUnreadable", f"{exc}, so which sidecars run this session is unknown; captures so far are kept in {self.dest}; create a new ProfileSession") from None

    async def _cancel_triggered(self) -> None:
        """A session failing before its capture ended is cancelled on the sidecars its pod record
        lists, in Pending too: a restarted operator may fail it there (its Secret or store gone)
        after an earlier process triggered them. They keep what they captured."""
        if self.phase not in ("", "Pending", "Capturing"):
            return
        try:
            pods = self.pods or await asyncio.to_thread(pod_record.read, self.ns, self.name, self.uid)
        except pod_record.PodRecordUnreadable:
            return  # the failure says so; the sidecars stop on their own after spec.timeoutSeconds
        if pods is not None:
            await asyncio.to_thread(cancellation.cancel, self.ns, self.obj.get("spec") or {}, self.uid, pods.triggered, self.settings, self.ctx.key_for(self.ns))

    async def _list_pods(self, selector: str) -> list[Any]:
        """The selected pods. A refusal the user must fix fails the session at once; any other
        error is retried (by kopf) until spec.timeoutSeconds, then fails it with that error."""
        try:
            result = await asyncio.to_thread(kube.core().list_namespaced_pod, self.ns, label_selector=selector)
        except ApiException as exc:
            if exc.status in LIST_REFUSALS:
                raise Fail("PodsUnlistable", f"listing pods in namespace {self.ns} with spec.selector ({selector}) was refused: "
                                             f"HTTP {exc.status} {_api_message(exc)}; {LIST_REFUSALS[exc.status]}") from None
            if self._timed_out():
                raise Fail("PodsUnlistable", f"pods in namespace {self.ns} could not be listed within spec.timeoutSeconds: HTTP {exc.status} {_api_message(exc)}") from None
            raise
        except Exception as exc:
            if self._timed_out():
                raise Fail("PodsUnlistable", f"pods in namespace {self.ns} could not be listed within spec.timeoutSeconds: {exc}") from None
            raise
        return list(result.items)

    def _capture_timeout(self, spec: SessionSpec, workers: dict[str, int]) -> Fail:
        return Fail("Timeout", f"capture did not finish within spec.timeoutSeconds={spec.timeoutSeconds}s; "
                               f"{workers['uploaded']} of {workers['total']} worker(s) uploaded, kept in {self.dest}")

    def _timed_out(self) -> bool:
        start = self.status.get("startTime")
        return isinstance(start, str) and bool(start) and time.time() - parse_iso(start) > self.timeout_s

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
            await asyncio.to_thread(kube.custom().delete_namespaced_custom_object, GROUP, VERSION, self.ns, PLURAL, self.name)
        except Exception as exc:
            if not kube.is_not_found(exc):
                raise
