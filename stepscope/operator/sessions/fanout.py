"""Talking to many sidecars at once: trigger, poll and cancel. Each request runs on the operator's
event loop (SidecarClient.request_async: one connection, no thread, its reply capped and its
whole exchange within `timeout` per attempt), and the Context's Limit bounds how many are open
at once whatever the pod count and however many sessions fan out together: a pod whose port
answers slowly holds one of them for at most `timeout`, and nothing else."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from stepscope import retry
from stepscope.contracts.sidecar_api import SessionRequest
from stepscope.operator import metrics
from stepscope.operator.sessions.selection import Target
from stepscope.sidecar_client import TELEMETRY_PATH, SidecarClient, SidecarError

# Answers that will not change on a retry: a bad signature (wrong key), a refused body, another
# session holding the sidecar. Anything else (unreachable, 5xx) may be a sidecar still starting.
_FINAL_STATUSES = {400, 401, 403, 404, 409, 422}

Operation = Callable[[SidecarClient], Awaitable[dict[str, Any]]]


class Limit:
    """At most `size` requests open at once, shared by every fan-out of the operator. A fan-out
    runs at most `size` workers over its targets rather than one task each: asyncio.Semaphore
    scans its waiters on every acquire (Python 3.11), which for 10,000 waiting pods is seconds."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.semaphore = asyncio.Semaphore(self.size)


@dataclass(frozen=True)
class Outcome:
    target: Target
    ok: bool
    answer: dict[str, Any]
    error: str = ""
    status: int = 0


def _transient(exc: Exception) -> bool:
    return isinstance(exc, SidecarError) and exc.status not in _FINAL_STATUSES


async def _call(
    target: Target, op: Operation, key: bytes, limit: Limit, timeout: float, attempts: int, backoff_s: float
) -> Outcome:
    client = SidecarClient(target.url, key, timeout=timeout)

    async def once() -> dict[str, Any]:
        async with limit.semaphore:
            try:
                return await op(client)
            except SidecarError:
                metrics.SIDECAR_ERRORS.inc()
                raise

    policy = retry.RetryPolicy(attempts=max(1, attempts), base_delay_s=backoff_s, max_delay_s=max(backoff_s, 5.0))
    try:
        # Debug only: sidecars still starting are common, and the outcome reports what is left.
        return Outcome(
            target,
            True,
            await retry.call_async(
                once, policy, transient=_transient, what=f"request to {target.url}", log_level=logging.DEBUG
            ),
        )
    except SidecarError as exc:
        return Outcome(target, False, {}, exc.message, exc.status)


async def _map(targets: Iterable[Target], call: Callable[[Target], Awaitable[Outcome]], limit: Limit) -> list[Outcome]:
    """`call` of every target, in the targets' order, by at most limit.size workers."""
    todo = list(targets)
    out: list[Outcome | None] = [None] * len(todo)
    queue = iter(range(len(todo)))

    async def worker() -> None:
        for i in queue:
            out[i] = await call(todo[i])

    await asyncio.gather(*(worker() for _ in range(min(limit.size, len(todo)))))
    return [o for o in out if o is not None]


async def trigger(
    targets: Iterable[Target],
    request: SessionRequest,
    key: bytes,
    *,
    limit: Limit,
    timeout: float,
    attempts: int,
    backoff_s: float = 0.2,
) -> list[Outcome]:
    """PUT the session on every sidecar; the PUT is idempotent, so a retry never starts it twice."""
    path = SidecarClient.session_path(request.session)
    data = request.to_json()  # encoded once for every pod

    async def one(target: Target) -> Outcome:
        outcome = await _call(
            target, lambda c: c.request_async("PUT", path, data), key, limit, timeout, attempts, backoff_s
        )
        if outcome.ok:
            metrics.TRIGGERS.inc()
        return outcome

    return await _map(targets, one, limit)


async def poll(
    targets: Iterable[Target], session_id: str, key: bytes, *, limit: Limit, timeout: float
) -> list[Outcome]:
    """One GET per sidecar, no retry: the next poll is the retry."""
    path = SidecarClient.session_path(session_id)
    return await _map(
        targets, lambda t: _call(t, lambda c: c.request_async("GET", path), key, limit, timeout, 1, 0.0), limit
    )


async def cancel(
    targets: Iterable[Target], session_id: str, key: bytes, *, limit: Limit, timeout: float, attempts: int
) -> list[Outcome]:
    path = SidecarClient.session_path(session_id)
    return await _map(
        targets,
        lambda t: _call(t, lambda c: c.request_async("DELETE", path), key, limit, timeout, attempts, 0.2),
        limit,
    )


async def telemetry(targets: Iterable[Target], key: bytes, *, limit: Limit, timeout: float) -> list[Outcome]:
    """Every sidecar's step telemetry (GET /v1/telemetry), one try each: a trigger polls again anyway."""
    return await _map(
        targets,
        lambda t: _call(t, lambda c: c.request_async("GET", TELEMETRY_PATH), key, limit, timeout, 1, 0.0),
        limit,
    )


def live_step_counts(answers: Iterable[Outcome]) -> list[int]:
    """The steps each live rank of the answering sidecars has completed (GET /v1/telemetry)."""
    return [
        int(rank["steps"])
        for o in answers
        if o.ok
        for rank in o.answer.get("ranks") or []
        if isinstance(rank, dict) and rank.get("alive") and isinstance(rank.get("steps"), int)
    ]
