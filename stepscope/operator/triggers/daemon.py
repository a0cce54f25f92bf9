"""The I/O shell of a ProfileTrigger (stepscope.operator.triggers.policy): one kopf daemon per trigger
polls its pods' sidecars' signed GET /v1/telemetry through the bounded fan-out pool every
STEPSCOPE_TRIGGER_POLL_INTERVAL_S, steps the pure trigger, creates the ProfileSessions it asks
for with an Event each, and writes the status."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from stepscope import detection
from stepscope.contracts.session import SpecError
from stepscope.contracts.states import ConditionType
from stepscope.operator import kube
from stepscope.operator.sessions import fanout
from stepscope.operator.sessions.lifecycle import Context
from stepscope.operator.sessions.selection import label_selector, select_targets
from stepscope.operator.sessions.status import set_condition
from stepscope.operator.settings import GROUP, PLURAL, VERSION
from stepscope.operator.triggers import alerts as triggers_alerts
from stepscope.operator.triggers import policy as triggers

# Readings change every poll; the status gets them at most this often unless something else changed
# (state, a fire, the pods), so that a trigger costs the API server little.
STATUS_REFRESH_S = 30.0
_READINGS = ("current", "baseline", "conditions")


def get_trigger(namespace: str, name: str) -> dict[str, Any]:
    return kube.custom().get_namespaced_custom_object(GROUP, VERSION, namespace, triggers.TRIGGER_PLURAL, name)


def _patch_status(namespace: str, name: str, status: dict[str, Any]) -> None:
    kube.custom().patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, triggers.TRIGGER_PLURAL, name, {"status": status}
    )


def _patch_meta(namespace: str, name: str, patch: dict[str, Any]) -> None:
    kube.custom().patch_namespaced_custom_object(GROUP, VERSION, namespace, triggers.TRIGGER_PLURAL, name, patch)


def _create_session(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    custom = kube.custom()
    return kube.create_or_get(
        lambda b: custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, b),
        lambda n: custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, n),
        body,
    )


class TriggerWatch:
    def __init__(
        self,
        body: kopf.Body,
        ctx: Context,
        stopped: kopf.DaemonStopped,
        logger: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.body, self.ctx, self.stopped, self.log = body, ctx, stopped, logger
        self.alert_taken = ""
        self.ns, self.name = body["metadata"]["namespace"], body["metadata"]["name"]
        self.state = triggers.restored(body.get("status") or {})
        self.written: dict[str, Any] = {}
        self.written_at = -STATUS_REFRESH_S

    async def run(self) -> None:
        while not self.stopped:
            await self.poll_once()
            await self.stopped.wait(self.ctx.settings.trigger_poll_interval_s)

    async def poll_once(self) -> None:
        now = time.time()
        spec = dict(self.body.get("spec") or {})  # kopf keeps a daemon's body live: spec edits apply at the next poll
        try:
            policy = triggers.Policy.from_spec(self.name, spec)
            selector = label_selector(spec.get("selector") or {})
        except (SpecError, ValueError) as exc:
            await self._write(now, {"state": triggers.INVALID}, False, "InvalidSpec", str(exc))
            return
        targets = select_targets(await asyncio.to_thread(kube.list_pods, self.ns, selector))
        settings = self.ctx.settings
        outcomes = await fanout.telemetry(
            targets, self.ctx.key_for(self.ns), limit=self.ctx.sidecars, timeout=settings.sidecar_timeout_s
        )
        answers = [o.answer for o in outcomes if o.ok]
        telemetry = detection.observe(now, answers) if answers else None
        self.state, actions = triggers.step(
            self.state, triggers.Observation(now, telemetry, await self._take_alert()), policy
        )
        for action in actions:
            await self._act(action)
        fields = triggers.status_fields(self.state, policy, now)
        fields["pods"] = {
            "selected": len(targets),
            "answered": len(answers),
            "ranks": len(telemetry.ranks) if telemetry else 0,
        }
        if not targets:
            await self._write(
                now,
                fields,
                False,
                "NoPodsSelected",
                f"no Running pod with a stepscope sidecar matches spec.selector ({selector})",
            )
        elif not answers:
            failed = outcomes[0]
            await self._write(
                now,
                fields,
                False,
                "SidecarsUnreachable",
                f"none of {len(targets)} sidecar(s) answered, e.g. pod {failed.target.pod}: {failed.error}",
            )
        else:
            await self._write(
                now,
                fields,
                True,
                "Watching",
                f"watching {fields['pods']['ranks']} rank(s) on {len(answers)} of {len(targets)} pod(s)",
            )

    async def _take_alert(self) -> tuple[str, ...]:
        """The alert the Alertmanager endpoint wrote into the trigger (stepscope.operator.triggers.alerts),
        removed once taken; the live body may show it until the removal's watch event comes back."""
        raw = (self.body["metadata"].get("annotations") or {}).get(triggers_alerts.ALERT_ANNOTATION)
        if not raw or raw == self.alert_taken:
            return ()
        await asyncio.to_thread(
            _patch_meta, self.ns, self.name, {"metadata": {"annotations": {triggers_alerts.ALERT_ANNOTATION: None}}}
        )
        self.alert_taken = raw
        try:
            return (str(json.loads(raw)["summary"]),)
        except (ValueError, KeyError, TypeError):
            return (str(raw)[: triggers.MAX_TEXT],)  # written by hand: still an alert

    async def _act(self, action: triggers.Action) -> None:
        if isinstance(action, triggers.HoldBack):
            kopf.info(
                self.body,
                reason="CaptureHeldBack",
                message=f"{action.condition}: {action.reason}; no session: {action.why}"[:1024],
            )
            self.log.info("%s/%s fired (%s) but held back: %s", self.ns, self.name, action.condition, action.why)
            return
        trigger = {"metadata": dict(self.body["metadata"]), "spec": dict(self.body.get("spec") or {})}
        try:
            await asyncio.to_thread(_create_session, self.ns, triggers.session_body(trigger, action))
        except ApiException as exc:
            kopf.warn(
                self.body,
                reason="SessionNotCreated",
                message=f"{action.condition}: {action.reason}; creating {action.name} failed: {kube.describe(exc)}"[
                    :1024
                ],
            )
            self.log.warning(
                "%s/%s: creating session %s failed: %s", self.ns, self.name, action.name, kube.describe(exc)
            )
            return
        kopf.info(
            self.body, reason="SessionCreated", message=f"{action.name}: {action.condition}: {action.reason}"[:1024]
        )
        self.log.info(
            "%s/%s fired (%s): created ProfileSession %s: %s",
            self.ns,
            self.name,
            action.condition,
            action.name,
            action.reason,
        )

    async def _write(self, now: float, fields: dict[str, Any], ready: bool, reason: str, message: str) -> None:
        generation = self.body["metadata"].get("generation")
        conditions = set_condition(
            list((self.body.get("status") or {}).get("conditions") or []),
            ConditionType.READY,
            ready,
            reason,
            message,
            generation,
        )
        patch = {
            **fields,
            "message": message[: triggers.MAX_TEXT],
            "observedGeneration": generation,
            "conditions": conditions,
        }
        quiet = {k: v for k, v in patch.items() if k not in _READINGS}
        if quiet == self.written and now - self.written_at < STATUS_REFRESH_S:
            return
        await asyncio.to_thread(_patch_status, self.ns, self.name, patch)
        self.written, self.written_at = quiet, now


async def trigger_daemon(
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    **_: Any,
) -> None:
    await TriggerWatch(body, memo.ctx, stopped, logger).run()


def serve_alerts(memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
    port = memo.ctx.settings.alerts_port
    memo.alerts_server = triggers_alerts.serve("0.0.0.0", port, memo.ctx.key_for) if port else None
    if port:
        logger.info("Alertmanager webhook endpoint on port %d: POST /v1/alerts/<namespace>/<trigger>", port)


def stop_alerts(memo: kopf.Memo, **_: Any) -> None:
    server = getattr(memo, "alerts_server", None)
    if server is not None:
        server.shutdown()
        server.server_close()


def register(registry: kopf.OperatorRegistry) -> None:
    """Put the ProfileTrigger daemon into `registry` (after stepscope.operator.sessions.handlers.register,
    whose startup handler makes the context it shares)."""
    kopf.on.startup(registry=registry)(serve_alerts)
    kopf.on.cleanup(registry=registry)(stop_alerts)
    # An unexpected error (an API server hiccup) restarts the daemon after `backoff`: it starts from
    # the status (the sessions it created), learning the baseline again.
    kopf.daemon(GROUP, VERSION, triggers.TRIGGER_PLURAL, cancellation_timeout=10.0, backoff=5.0, registry=registry)(
        trigger_daemon
    )
