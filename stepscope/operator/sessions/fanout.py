"""Talking to many sidecars at once: trigger, poll and cancel. The signed client is blocking, so
each request runs on the operator's own bounded pool of sidecar threads (`pool`, the Context's),
never on asyncio's default executor, which carries every session's API calls and status writes:
a pod whose port answers slowly holds one sidecar thread for at most the client's total deadline
(`timeout`, per attempt) and nothing else. The pool bounds sockets and threads whatever the pod
count and however many sessions fan out at once."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from stepscope import retry
from stepscope.contracts.sidecar_api import SessionRequest
from stepscope.operator import metrics
from stepscope.operator.sessions.selection import Target
from stepscope.sidecar_client import SidecarClient, SidecarError

T = TypeVar("T")

# Answers that will not change on a retry: a bad signature (wrong key), a refused body, another
# session holding the sidecar. Anything else (unreachable, 5xx) may be a sidecar still starting.
_FINAL_STATUSES = {400, 401, 403, 404, 409, 422}


@dataclass(frozen=True)
class Outcome:
    target: Target
    ok: bool
    answer: dict[str, Any]
    error: str = ""
    status: int = 0


async def _map(fn: Callable[[Target], Outcome], targets: Iterable[Target], pool: Executor) -> list[Outcome]:
    loop = asyncio.get_running_loop()
    return list(await asyncio.gather(*(loop.run_in_executor(pool, fn, t) for t in targets)))


def _transient(exc: Exception) -> bool:
    return isinstance(exc, SidecarError) and exc.status not in _FINAL_STATUSES


def _call(target: Target, op: Callable[[SidecarClient], dict[str, Any]], key: bytes, timeout: float, attempts: int, backoff_s: float) -> Outcome:
    client = SidecarClient(target.url, key, timeout=timeout)

    def once() -> dict[str, Any]:
        try:
            return op(client)
        except SidecarError:
            metrics.SIDECAR_ERRORS.inc()
            raise

    policy = retry.RetryPolicy(attempts=max(1, attempts), base_delay_s=backoff_s, max_delay_s=max(backoff_s, 5.0))
    try:
        # Debug only: sidecars still starting are common, and the outcome reports what is left.
        return Outcome(target, True, retry.call(once, policy, transient=_transient, what=f"request to {target.url}", log_level=logging.DEBUG))
    except SidecarError as exc:
        return Outcome(target, False, {}, exc.message, exc.status)


async def trigger(targets: Iterable[Target], request: SessionRequest, key: bytes, *, pool: Executor, timeout: float,
                  attempts: int, backoff_s: float = 0.2) -> list[Outcome]:
    """PUT the session on every sidecar; the PUT is idempotent, so a retry never starts it twice."""
    def one(target: Target) -> Outcome:
        outcome = _call(target, lambda c: c.put_session(request.session, request), key, timeout, attempts, backoff_s)
        if outcome.ok:
            metrics.TRIGGERS.inc()
        return outcome
    return await _map(one, targets, pool)


async def poll(targets: Iterable[Target], session_id: str, key: bytes, *, pool: Executor, timeout: float) -> list[Outcome]:
    """One GET per sidecar, no retry: the next poll is the retry."""
    return await _map(lambda t: _call(t, lambda c: c.get_session(session_id), key, timeout, 1, 0.0), targets, pool)


async def cancel(targets: Iterable[Target], session_id: str, key: bytes, *, pool: Executor, timeout: float, attempts: int) -> list[Outcome]:
    return await _map(lambda t: _call(t, lambda c: c.delete_session(session_id), key, timeout, attempts, 0.2), targets, pool)


async def telemetry(targets: Iterable[Target], key: bytes, *, pool: Executor, timeout: float) -> list[Outcome]:
    """Every sidecar's step telemetry (GET /v1/telemetry), one try each: a trigger polls again anyway."""
    return await _map(lambda t: _call(t, lambda c: c.get_telemetry(), key, timeout, 1, 0.0), targets, pool)


def live_step_counts(answers: Iterable[Outcome]) -> list[int]:
    """The steps each live rank of the answering sidecars has completed (GET /v1/telemetry)."""
    return [int(rank["steps"]) for o in answers if o.ok for rank in o.answer.get("ranks") or []
            if isinstance(rank, dict) and rank.get("alive") and isinstance(rank.get("steps"), int)]
