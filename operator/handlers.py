"""The kopf handlers of ProfileSession: one daemon per session drives its lifecycle; deletion
cancels it on every triggered sidecar before the finalizer is released."""
from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from stepscope.operator import fanout, kube, metrics, pod_record
from stepscope.operator.lifecycle import TERMINAL, Context, SessionRunner
from stepscope.operator.selection import label_selector, target_of
from stepscope.operator.settings import FINALIZER, GROUP, PLURAL, VERSION, OperatorSettings
from stepscope.session import SpecError
from stepscope.signing import load_key


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    # kopf's own bookkeeping goes into annotations, so that status holds only what the
    # ProfileSession schema documents.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.stepscope.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kopf.stepscope.io")
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = int(os.environ.get("STEPSCOPE_WATCH_TIMEOUT_S", 300))
    memo.ctx = Context(OperatorSettings(), load_key(os.environ.get("STEPSCOPE_HMAC_KEY_FILE")))


def login(**_: Any) -> kopf.ConnectionInfo:
    kube.reset()  # a new login re-reads the credentials, e.g. a rotated service-account token
    return kube.connection_info()


async def session_daemon(namespace: str, name: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: logging.Logger, **_: Any) -> None:
    try:
        obj = await asyncio.to_thread(kube.get_session, namespace, name)
    except Exception as exc:
        if kube.is_not_found(exc):
            return
        raise
    await SessionRunner(obj, memo.ctx, stopped, logger).run()


async def cancel_on_delete(spec: kopf.Spec, status: kopf.Status, uid: str, namespace: str, name: str, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Cancel on every triggered sidecar (on every selected one when the pod record is already
    gone: a DELETE of a session a sidecar never had changes nothing); what was captured stays in
    the store."""
    metrics.SESSIONS.set(uid, None)
    if status.get("phase") in TERMINAL or not (status.get("pods") or {}).get("triggered"):
        return
    try:
        selector = label_selector(dict(spec.get("selector") or {}))
    except SpecError:
        return
    record = await asyncio.to_thread(pod_record.read, namespace, name, uid)
    pods = (await asyncio.to_thread(kube.core().list_namespaced_pod, namespace, label_selector=selector)).items
    targets = [t for t in map(target_of, pods) if t is not None and (record is None or t.pod in record.triggered)]
    s: OperatorSettings = memo.ctx.settings
    outcomes = await asyncio.to_thread(fanout.cancel, targets, uid, memo.ctx.key, concurrency=s.fanout_concurrency, timeout=s.sidecar_timeout_s, attempts=s.trigger_attempts)
    failed = [o for o in outcomes if not o.ok]
    logger.info("%s/%s deleted: cancelled on %d sidecar(s)%s", namespace, name, len(outcomes) - len(failed), f", {len(failed)} unreachable" if failed else "")


def register(registry: kopf.OperatorRegistry) -> None:
    """Put the session handlers into `registry` (see stepscope.operator.registry for why not kopf's default one)."""
    kopf.on.startup(registry=registry)(configure)
    kopf.on.login(registry=registry)(login)
    # An unexpected error (an API server hiccup) restarts the daemon after `backoff`; it resumes
    # from the status like after an operator restart.
    kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0, backoff=5.0, registry=registry)(session_daemon)
    kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)(cancel_on_delete)
