"""The kopf handlers of ProfileSession: one daemon per session drives its lifecycle; deletion
cancels it on every triggered sidecar before the finalizer is released."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from stepscope.contracts.session import SessionSpec
from stepscope.operator import kube, metrics
from stepscope.operator.sessions import cancellation, fanout, pod_record
from stepscope.operator.sessions.lifecycle import TERMINAL, Context, SessionRunner
from stepscope.operator.settings import FINALIZER, GROUP, PLURAL, VERSION, OperatorSettings
from stepscope.settings import hmac_key_file
from stepscope.signing import load_key


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    # kopf's own bookkeeping goes into annotations, so that status holds only what the
    # ProfileSession schema documents.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.stepscope.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kopf.stepscope.io")
    settings.posting.level = logging.INFO
    operator = OperatorSettings()
    settings.watching.server_timeout = operator.watch_timeout_s
    memo.ctx = Context(operator, load_key(hmac_key_file()))


def login(**_: Any) -> kopf.ConnectionInfo:
    kube.reset()  # a new login re-reads the credentials, e.g. a rotated service-account token
    return kube.connection_info()


# kopf's handler protocols type `namespace` optional (cluster-scoped resources have none) and the
# logger as either kind: a ProfileSession always has a namespace.
async def session_daemon(namespace: str | None, name: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
    assert namespace is not None
    try:
        obj = await asyncio.to_thread(kube.get_session, namespace, name)
    except Exception as exc:
        if kube.is_not_found(exc):
            return
        raise
    await SessionRunner(obj, memo.ctx, stopped, logger).run()


# Tries at finding the sidecars to cancel (API errors) before a deleted session is let go anyway:
# a finalizer must not keep it forever, and the sidecars stop on their own at the timeout.
DELETE_ATTEMPTS = 3
DELETE_RETRY_S = 5.0


async def cancel_on_delete(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, uid: str, namespace: str | None, name: str, retry: int,
                           memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
    """Cancel a session that had not ended on every sidecar the pod record lists, whatever the
    phase says: an operator stopped between writing the record and the Capturing status leaves a
    Pending session whose sidecars run. Without a readable record, it is cancelled on every selected
    sidecar (one may have been triggered just before a crash; a DELETE of a session a sidecar never
    had changes nothing). What was captured stays in the store. Deletion never waits long: API
    errors are retried DELETE_ATTEMPTS times and each sidecar a bounded number of times."""
    assert namespace is not None
    metrics.SESSIONS.set(uid, None)
    stops_alone = f"they stop on their own after spec.timeoutSeconds={spec.get('timeoutSeconds', SessionSpec.default_of('timeoutSeconds'))}s"
    try:
        outcomes = await _cancel(body, spec, status, uid, namespace, name, memo.ctx)
    except Exception as exc:  # noqa: BLE001 - the API server: retried, then the session goes without the cancel
        error = f"the API server answered {exc.status} {exc.reason}" if isinstance(exc, ApiException) else f"{exc.__class__.__name__}: {exc}"
        if retry + 1 < DELETE_ATTEMPTS:
            raise kopf.TemporaryError(f"finding the sidecars to cancel failed ({error}); retrying", delay=DELETE_RETRY_S) from None
        kopf.warn(body, reason="CancelSkipped", message=f"the sidecars to cancel could not be found in {DELETE_ATTEMPTS} tries ({error}); {stops_alone}")
        return
    failed = [o for o in outcomes if not o.ok]
    if failed:
        kopf.warn(body, reason="CancelUndelivered", message=f"{len(failed)} of {len(outcomes)} sidecar(s) did not answer the cancel, "
                                                            f"e.g. pod {failed[0].target.pod}: {failed[0].error}; {stops_alone}")
    logger.info("%s/%s deleted: cancelled on %d sidecar(s)%s", namespace, name, len(outcomes) - len(failed), f", {len(failed)} unreachable" if failed else "")


async def _cancel(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, uid: str, namespace: str, name: str, ctx: Context) -> list[fanout.Outcome]:
    if status.get("phase") in TERMINAL:
        return []  # the session ended on its sidecars already: the way to a terminal phase cancels what still ran
    try:
        record = await asyncio.to_thread(pod_record.read, namespace, name, uid)
    except pod_record.PodRecordUnreadable as exc:
        kopf.warn(body, reason="PodRecordUnreadable", message=f"{exc}; cancelling the session on every selected sidecar")
        record = None
    return await cancellation.cancel(namespace, dict(spec), uid, record.triggered if record else None, ctx.settings, ctx.key_for(namespace), ctx.sidecars)


def register(registry: kopf.OperatorRegistry) -> None:
    """Put the session handlers into `registry` (see stepscope.operator.registry for why not kopf's default one)."""
    kopf.on.startup(registry=registry)(configure)
    kopf.on.login(registry=registry)(login)
    # An unexpected error (an API server hiccup) restarts the daemon after `backoff`; it resumes
    # from the status like after an operator restart.
    kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0, backoff=5.0, registry=registry)(session_daemon)
    kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)(cancel_on_delete)
