"""Cancelling a session on its sidecars, when it is deleted or fails before its capture ended.
Whom to cancel comes from the session's pod record; the sidecars keep what they captured."""

from __future__ import annotations

import asyncio
from typing import Any

from stepscope.contracts.session import SpecError
from stepscope.operator import kube
from stepscope.operator.sessions import fanout
from stepscope.operator.sessions.selection import label_selector, target_of
from stepscope.operator.settings import OperatorSettings


async def cancel(
    namespace: str,
    spec: dict[str, Any],
    uid: str,
    pods: frozenset[str] | None,
    settings: OperatorSettings,
    key: bytes,
    limit: fanout.Limit,
) -> list[fanout.Outcome]:
    """DELETE the session on the Running sidecars of `pods`, or of every selected pod when None,
    signed with `key`, the key of `namespace` (its sidecars refuse any other).
    Pods are listed by the spec's selector, or in the whole namespace when it does not parse
    (there are names to go by then)."""
    try:
        selector = label_selector(dict(spec.get("selector") or {}))
    except SpecError:
        if pods is None:
            return []
        selector = ""
    listed = await asyncio.to_thread(kube.list_pods, namespace, selector)
    targets = [t for t in map(target_of, listed) if t is not None and (pods is None or t.pod in pods)]
    return await fanout.cancel(
        targets, uid, key, limit=limit, timeout=settings.sidecar_timeout_s, attempts=settings.trigger_attempts
    )
