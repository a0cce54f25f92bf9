"""The one retry layer (stepscope.retry): transient failures are retried with doubling, capped,
jittered delays up to the policy's attempts; a permanent one is raised at once. The store and
the operator's fan-out both go through it."""

from __future__ import annotations

import pytest

from stepscope import retry
from stepscope.retry import RetryPolicy
from stepscope.storage import StoreError


def _failing(errors: list[Exception]) -> tuple[list[int], object]:
    calls: list[int] = []

    def operation() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    return calls, operation


def is_transient(exc: Exception) -> bool:
    return isinstance(exc, StoreError) and exc.transient


def test_transient_failures_are_retried_with_doubling_capped_delays() -> None:
    waits: list[float] = []
    calls, operation = _failing([StoreError("503", transient=True)] * 4)
    policy = RetryPolicy(attempts=5, base_delay_s=1.0, max_delay_s=4.0)
    assert retry.call(operation, policy, transient=is_transient, what="put", sleep=waits.append) == "ok"
    assert len(calls) == 5
    # Jitter keeps each wait within [half, all] of 1, 2, 4, 4 (capped).
    for waited, full in zip(waits, [1.0, 2.0, 4.0, 4.0], strict=True):
        assert full / 2 <= waited <= full


def test_a_permanent_error_is_raised_at_once_and_the_last_transient_one_after_the_attempts() -> None:
    waits: list[float] = []
    calls, operation = _failing([StoreError("503", transient=True), StoreError("access denied (AccessDenied)")])
    with pytest.raises(StoreError, match="access denied"):
        retry.call(
            operation,
            RetryPolicy(attempts=10, base_delay_s=0.0),
            transient=is_transient,
            what="put",
            sleep=waits.append,
        )
    assert len(calls) == 2 and len(waits) == 1
    calls, operation = _failing([StoreError(f"503 #{i}", transient=True) for i in range(10)])
    with pytest.raises(StoreError, match="503 #2"):
        retry.call(
            operation, RetryPolicy(attempts=3, base_delay_s=0.0), transient=is_transient, what="put", sleep=waits.append
        )
    assert len(calls) == 3
