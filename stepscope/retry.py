"""The one retry policy of stepscope's remote calls (the object store, the operator's requests to
sidecars): a bounded number of attempts with jittered, doubling delays, and only for failures the
caller classifies as transient; a permanent one (access denied, a missing bucket, a refused
request) is raised at once with its reason."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt `attempt` (1-based): doubling, capped, with jitter so that
        many clients do not retry in step."""
        return min(self.base_delay_s * 2 ** (attempt - 1), self.max_delay_s) * (0.5 + random.random() / 2)


def call(
    operation: Callable[[], T],
    policy: RetryPolicy,
    *,
    transient: Callable[[Exception], bool],
    what: str,
    sleep: Callable[[float], object] = time.sleep,
    log_level: int = logging.WARNING,
) -> T:
    """`operation()`, retried per `policy` while it raises what `transient` accepts; the last error
    (or the first permanent one) is raised. Each retry is logged at `log_level`."""
    for attempt in range(1, max(1, policy.attempts) + 1):
        try:
            return operation()
        except Exception as exc:
            delay = _retry_delay(exc, attempt, policy, transient, what, log_level)
            if delay is None:
                raise
            sleep(delay)
    raise AssertionError("unreachable")


async def call_async(
    operation: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    transient: Callable[[Exception], bool],
    what: str,
    log_level: int = logging.WARNING,
) -> T:
    """`call` for a coroutine: the waits between attempts are asyncio.sleep."""
    for attempt in range(1, max(1, policy.attempts) + 1):
        try:
            return await operation()
        except Exception as exc:
            delay = _retry_delay(exc, attempt, policy, transient, what, log_level)
            if delay is None:
                raise
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def _retry_delay(
    exc: Exception,
    attempt: int,
    policy: RetryPolicy,
    transient: Callable[[Exception], bool],
    what: str,
    log_level: int,
) -> float | None:
    """The wait before the next attempt, logged; None when `exc` is permanent or the attempts are spent."""
    if not transient(exc) or attempt >= policy.attempts:
        return None
    delay = policy.delay(attempt)
    log.log(log_level, "%s failed (attempt %d/%d, retrying in %.2f s): %s", what, attempt, policy.attempts, delay, exc)
    return delay
