"""The sidecar's decisions about a session, on the pure functions (stepscope.sidecar.session_phases):
each row a view of the session and the clock, and the actions or phase that must come of them.
The shell (sessions.SessionManager) is covered by test_session_flow.py and test_end_to_end.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from stepscope.sidecar.session_phases import (
    Limits,
    QueueMetrics,
    QueueRank,
    RankView,
    SessionView,
    StartRecorder,
    TimeOut,
    Verdict,
    advance,
    phase_of,
)

NOW = 1_000_000.0
LIMITS = Limits(stale_after_s=15.0, export_grace_s=600.0)
VIEW = SessionView(
    "Capturing", "s3://b/s", "/run/stepscope/agents", timeout_seconds=300, wait_steps=5, accepted_at=NOW - 10, ranks=()
)


def _rank(rank: int, state: str, *, silent: float = 1.0, **fields: Any) -> RankView:
    return RankView(rank, state, pid=100 + rank, step=7, last_sign_of_life=NOW - silent, **fields)


@pytest.mark.parametrize(
    "ranks, expected",
    [
        # Alive, or silent within the bounds: nothing to do.
        ((_rank(0, "waiting"), _rank(1, "writing", silent=599)), []),
        # A silent rank is gone; one writing its trace gets the export grace.
        (
            (_rank(0, "capturing", silent=16),),
            [
                Verdict(
                    0,
                    "failed: the training process (pid 100) stopped sending heartbeats 16 s ago while capturing, "
                    "before the capture finished",
                ),
                QueueRank(0),
            ],
        ),
        (
            (_rank(0, "writing", silent=601),),
            [
                Verdict(
                    0,
                    "failed: the training process (pid 100) was writing its trace and has sent no heartbeat for "
                    "601 s: it died while exporting, or its export takes longer than 600 s (lower "
                    "spec.capture.limits or capture fewer steps)",
                ),
                QueueRank(0),
            ],
        ),
        # Final ranks are never judged; settled ones are queued for upload once per state.
        ((_rank(0, "done", silent=999), _rank(1, "hung", queued_state="hung")), [QueueRank(0)]),
        # A hung rank is not final: its watchdog still beats, and its silence fails it like any other.
        (
            (_rank(0, "hung", silent=16, queued_state="hung"),),
            [
                Verdict(
                    0,
                    "failed: the training process (pid 100) stopped sending heartbeats 16 s ago while hung, "
                    "before the capture finished",
                ),
                QueueRank(0),
            ],
        ),
    ],
)
def test_liveness_and_uploads(ranks: tuple[RankView, ...], expected: list[object]) -> None:
    assert advance(replace(VIEW, ranks=ranks), NOW, LIMITS)[1] == expected


def test_a_silent_rank_is_failed_and_then_queued() -> None:
    view, actions = advance(replace(VIEW, ranks=(_rank(0, "capturing", silent=16),)), NOW, LIMITS)
    assert [type(a) for a in actions] == [Verdict, QueueRank]
    assert view.ranks[0].state == "failed" and view.ranks[0].failed and view.ranks[0].queued


def test_the_timeout_cancels_and_fails_the_unsettled_ranks_only() -> None:
    ranks = (_rank(0, "capturing"), _rank(1, "hung"), _rank(2, "done"))
    view, actions = advance(replace(VIEW, ranks=ranks, accepted_at=NOW - 301), NOW, LIMITS)
    assert actions == [
        TimeOut(),
        Verdict(0, "failed: timed out after 300 s while capturing at step 7"),
        QueueRank(0),
        QueueRank(1),
        QueueRank(2),
    ]
    assert view.timed_out
    # Not once the session finished.
    assert advance(replace(VIEW, phase="Failed", ranks=ranks, accepted_at=NOW - 301), NOW, LIMITS)[1] == [
        QueueRank(1),
        QueueRank(2),
    ]


@pytest.mark.parametrize(
    "view, expected",
    [
        # The recorder starts once a rank saw the trigger (waiting or further), never twice, only when wanted.
        (replace(VIEW, metrics_wanted=True, ranks=(_rank(0, "pending"),)), []),
        (replace(VIEW, metrics_wanted=True, ranks=(_rank(0, "waiting"),)), [StartRecorder()]),
        (replace(VIEW, metrics_wanted=True, recording=True, ranks=(_rank(0, "capturing"),)), []),
        (replace(VIEW, metrics_wanted=False, ranks=(_rank(0, "waiting"),)), []),
        # While it records, the ranks' uploads wait for the last rank (summaries need the metrics) ...
        (replace(VIEW, recording=True, ranks=(_rank(0, "done"), _rank(1, "capturing"))), []),
        # ... then the metrics go first.
        (
            replace(VIEW, recording=True, ranks=(_rank(0, "done"), _rank(1, "failed"))),
            [QueueMetrics(), QueueRank(0), QueueRank(1)],
        ),
        (
            replace(
                VIEW,
                recording=True,
                metrics_queued=True,
                ranks=(_rank(0, "done", queued_state="done"), _rank(1, "cancelled")),
            ),
            [QueueRank(1)],
        ),
    ],
)
def test_recorder_and_metrics(view: SessionView, expected: list[object]) -> None:
    assert advance(view, NOW, LIMITS)[1] == expected


def _queued(rank: int, state: str, **fields: Any) -> RankView:
    return _rank(rank, state, queued_state=state, **fields)


@pytest.mark.parametrize(
    "view, phase, message",
    [
        (VIEW, "Pending", "waiting for training processes to register in /run/stepscope/agents"),
        (
            replace(VIEW, ranks=(_rank(0, "pending"), _rank(1, "waiting"))),
            "Pending",
            "1/2 rank(s) saw the request, waiting 5 step(s) before capturing",
        ),
        (
            replace(VIEW, ranks=(_rank(0, "capturing"), _queued(1, "done"), _rank(2, "writing"))),
            "Capturing",
            "2 rank(s) capturing, 1/3 captured",
        ),
        (replace(VIEW, ranks=(_queued(0, "done", jobs_left=1),)), "Uploading", "uploading to s3://b/s"),
        (replace(VIEW, metrics_pending=True, ranks=(_queued(0, "done"),)), "Uploading", "uploading to s3://b/s"),
        (replace(VIEW, ranks=(_rank(0, "done"),)), "Uploading", "uploading to s3://b/s"),  # not queued yet
        (
            replace(VIEW, ranks=(_queued(0, "done"), _queued(1, "done"))),
            "Succeeded",
            "2 rank(s) captured and uploaded to s3://b/s",
        ),
        (
            replace(VIEW, ranks=tuple(_queued(r, "failed", failed=True, error=f"e{r}") for r in range(7))),
            "Failed",
            "rank 0 e0; rank 1 e1; rank 2 e2; rank 3 e3; rank 4 e4 (+2 more)",
        ),
        (
            replace(VIEW, ranks=(_queued(0, "hung", failed=True, error="hung: stuck"), _queued(1, "done"))),
            "Failed",
            "rank 0 hung: stuck",
        ),
        # A cancel or the timeout ends the session once nothing is left to upload.
        (
            replace(VIEW, cancel_requested=True, ranks=(_rank(0, "capturing"),)),
            "Capturing",
            "1 rank(s) capturing, 0/1 captured",
        ),
        (
            replace(VIEW, cancel_requested=True, ranks=(_queued(0, "cancelled"),)),
            "Cancelled",
            "cancelled; what was captured is in s3://b/s",
        ),
        (replace(VIEW, cancel_requested=True), "Cancelled", "cancelled; what was captured is in s3://b/s"),
        (
            replace(VIEW, timed_out=True),
            "Failed",
            "timed out after 300 s: no training process registered in /run/stepscope/agents",
        ),
        (
            replace(VIEW, timed_out=True, ranks=(_queued(0, "failed", failed=True, error="x"),)),
            "Failed",
            "timed out after 300 s: rank 0 x",
        ),
        # What the capture budget cut is said when the session ends.
        (
            replace(VIEW, ranks=(_queued(0, "done", degraded=("Python stacks dropped", "cut")),)),
            "Succeeded",
            "1 rank(s) captured and uploaded to s3://b/s; 1 rank(s) degraded by the capture budget, rank 0: Python "
            "stacks dropped; cut",
        ),
    ],
)
def test_phase(view: SessionView, phase: str, message: str) -> None:
    assert phase_of(view) == (phase, message)
