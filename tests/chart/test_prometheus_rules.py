"""The chart's PrometheusRule evaluated by the real `promtool test rules` (Prometheus' own rule
engine) at the chart's defaults, over jobs whose series are simulated step by step as the sidecar
exports them (tests/chart/promtool.py): each condition fires as README "Capture automatically"
and stepscope/detection.py say, within its sustainedSeconds plus two scrape intervals and two
evaluations of the slowdown's start, and not on what the README says it must not fire on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chart.promtool import Rank, ever_fired, firing, input_series, rule_groups, run_test

SLOW, DRIFT, HANG = "StepscopeStepTimeSlowdown", "StepscopeRankDivergence", "StepscopeHang"
SCRAPE = 15.0  # values.yaml's prometheus.scrapeInterval
SUSTAINED = 60.0  # values.yaml's conditions' sustainedSeconds
STEP = 0.1
# The slowdown starts off the scrape grid, 15 minutes in: the 10-minute baseline is learned.
ONSET = 907.0
END = ONSET + 900.0


def budget(evaluation: float) -> float:
    """How long after a condition starts to hold it must fire: sustainedSeconds, two scrapes, two evaluations."""
    return SUSTAINED + 2 * SCRAPE + 2 * evaluation


def check(
    tmp_path: Path,
    ranks: list[Rank],
    expr_tests: list[dict[str, Any]],
    *,
    evaluation: float = SCRAPE,
    end: float = END,
    alert_tests: list[dict[str, Any]] | None = None,
) -> None:
    done = run_test(
        tmp_path,
        rule_groups(),
        input_series(ranks, SCRAPE, end),
        scrape_s=SCRAPE,
        evaluation_s=evaluation,
        expr_tests=expr_tests,
        alert_tests=alert_tests or [],
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_healthy_job_stays_silent(tmp_path: Path) -> None:
    ranks = [Rank(r, [(3600.0, STEP)], jitter=0.05, wait_share=[(0.0, 0.05 + 0.01 * r)]) for r in range(4)]
    check(tmp_path, ranks, [ever_fired(3600, {})], end=3600)


@pytest.mark.parametrize("pause", [41.0, 45.0, 50.0, 59.0])
def test_a_pause_shorter_than_sustained_seconds_does_not_fire(tmp_path: Path, pause: float) -> None:
    # One evaluation or checkpoint between two steps of every rank (they pause together).
    ranks = [Rank(r, [(END, STEP)], pauses=[(ONSET, pause)]) for r in range(2)]
    check(tmp_path, ranks, [ever_fired(END, {})])


def test_a_slowdown_under_the_factor_does_not_fire(tmp_path: Path) -> None:
    ranks = [Rank(r, [(ONSET, STEP), (END, 1.2 * STEP)]) for r in range(2)]
    check(tmp_path, ranks, [ever_fired(END, {})])


@pytest.mark.parametrize(("factor", "evaluation"), [(1.53, 15.0), (1.6, 15.0), (1.6, 30.0), (3.0, 15.0)])
def test_a_sustained_slowdown_fires_within_the_budget_and_keeps_firing(
    tmp_path: Path, factor: float, evaluation: float
) -> None:
    ranks = [Rank(r, [(ONSET, STEP), (END, factor * STEP)]) for r in range(2)]
    check(
        tmp_path,
        ranks,
        [
            firing(ONSET + SUSTAINED - evaluation, {}),  # not before it held for sustainedSeconds
            firing(ONSET + budget(evaluation), {f'alertname="{SLOW}"': 1}),
            # The baseline leaves out the slow steps: still firing when the slowdown has lasted
            # longer than the baseline window.
            firing(END, {f'alertname="{SLOW}"': 1}),
        ],
        evaluation=evaluation,
    )


def test_the_slowdowns_summary_reads_in_seconds_against_the_baseline(tmp_path: Path) -> None:
    ranks = [Rank(r, [(ONSET, STEP), (END, 1.6 * STEP)], jitter=0.0) for r in range(2)]
    at = ONSET + budget(SCRAPE)
    check(
        tmp_path,
        ranks,
        [],
        alert_tests=[
            {
                "eval_time": f"{int(at)}s",
                "alertname": SLOW,
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "namespace": "stepscope",
                            "stepscope_namespace": "train",
                            "stepscope_trigger": "stepscope",
                            "job": "llm",
                        },
                        "exp_annotations": {
                            "summary": "job llm: step time 0.160 s, over 1.5x its baseline 0.100 s for 60 s"
                        },
                    }
                ],
            }
        ],
    )


def test_a_slow_rank_among_ranks_that_do_not_step_together_diverges_from_its_peers_median(tmp_path: Path) -> None:
    # Two independent ranks (pipeline stages): rank 1 takes 1.6x rank 0's step time. The peers'
    # median leaves the rank out: with two ranks it is the other one's step time.
    ranks = [Rank(0, [(END, STEP)], jitter=0.0), Rank(1, [(ONSET, STEP), (END, 1.6 * STEP)], jitter=0.0)]
    check(
        tmp_path,
        ranks,
        [
            firing(ONSET + budget(SCRAPE), {f'alertname="{DRIFT}",rank="1"': 1}, by="alertname, rank"),
            ever_fired(END, {f'alertname="{DRIFT}",rank="1"': 1}, by="alertname, rank"),
        ],
        alert_tests=[
            divergence(ranks[1], "job llm: rank 1 (pod llm-1): step time 1.60x its peers' median (over 1.5x) for 60 s")
        ],
    )


def divergence(rank: Rank, summary: str) -> dict[str, Any]:
    """An alert_rule_test: the divergence of `rank` fires (it alone) with `summary`, once it is due."""
    labels = dict(item.split("=") for item in rank.labels().replace('"', "").split(","))
    return {
        "eval_time": f"{int(ONSET + budget(SCRAPE))}s",
        "alertname": DRIFT,
        "exp_alerts": [
            {
                "exp_labels": {
                    **labels,
                    "severity": "warning",
                    "namespace": "stepscope",
                    "stepscope_namespace": "train",
                    "stepscope_trigger": "stepscope",
                },
                "exp_annotations": {"summary": summary},
            }
        ],
    }


def test_four_independent_ranks_one_slower_by_the_factor(tmp_path: Path) -> None:
    ranks = [Rank(r, [(END, STEP)]) for r in range(3)] + [Rank(3, [(ONSET, STEP), (END, 1.6 * STEP)])]
    check(
        tmp_path,
        ranks,
        [
            firing(ONSET + budget(SCRAPE), {f'alertname="{DRIFT}",rank="3"': 1}, by="alertname, rank"),
            ever_fired(END, {f'alertname="{DRIFT}",rank="3"': 1}, by="alertname, rank"),
        ],
    )


def test_the_lockstep_rank_that_hardly_waits_diverges(tmp_path: Path) -> None:
    # Data parallel: both ranks step together, 1.25x slower once rank 1 slows down (no slowdown);
    # rank 0 then waits for it in the all-reduce (the real sidecar's reading: 0.39 against 0.004).
    ranks = [
        Rank(r, [(ONSET, STEP), (END, 1.25 * STEP)], jitter=0.0, wait_share=[(0.0, share), (ONSET, after)])
        for r, share, after in ((0, 0.05, 0.39), (1, 0.06, 0.004))
    ]
    check(
        tmp_path,
        ranks,
        [
            firing(ONSET + budget(SCRAPE), {f'alertname="{DRIFT}",rank="1"': 1}, by="alertname, rank"),
            ever_fired(END, {f'alertname="{DRIFT}",rank="1"': 1}, by="alertname, rank"),
        ],
        alert_tests=[
            divergence(
                ranks[1],
                "job llm: rank 1 (pod llm-1): its wait share in collectives is 0.39 below its peers' median "
                "(0.25 or more): they wait for it, for 60 s",
            )
        ],
    )


def test_a_hang_fires_once_no_rank_stepped_for_no_step_seconds_and_nothing_else(tmp_path: Path) -> None:
    ranks = [Rank(r, [(ONSET, STEP)]) for r in range(2)]
    check(
        tmp_path,
        ranks,
        [
            firing(ONSET + 300 - SCRAPE, {}),
            firing(ONSET + 300 + 2 * SCRAPE + 2 * SCRAPE, {f'alertname="{HANG}"': 1}),
            ever_fired(END, {f'alertname="{HANG}"': 1}),
        ],
    )


def test_a_restarted_job_is_neither_hung_nor_slow_and_its_baseline_survives(tmp_path: Path) -> None:
    # The containers restart after 15 minutes (the same pids; the sidecar starts each rank's series
    # over from 0) and are gone for 6 minutes; the new processes' first 20 steps are 3x slower
    # (warm-up). Then, 10 minutes later, a real 1.6x slowdown.
    back = ONSET + 360.0
    slow_at = back + 600.0
    end = slow_at + 300.0
    ranks = [
        Rank(r, [(back, STEP), (back + 6.0, 3 * STEP), (slow_at, STEP), (end, 1.6 * STEP)], restarts=[(ONSET, back)])
        for r in range(2)
    ]
    check(
        tmp_path,
        ranks,
        [ever_fired(slow_at, {}), firing(slow_at + budget(SCRAPE), {f'alertname="{SLOW}"': 1})],
        end=end,
    )


def test_steps_longer_than_a_scrape_interval_are_judged_too(tmp_path: Path) -> None:
    # 20 s steps, scraped every 15 s: some intervals end no step. A reading holds until the next,
    # so the slowdown (32 s steps) still holds without a break once its first slow step has ended.
    ranks = [Rank(r, [(ONSET, 20.0), (END, 32.0)], jitter=0.05) for r in range(2)]
    check(tmp_path, ranks, [ever_fired(ONSET, {}), firing(ONSET + 32.0 + budget(SCRAPE), {f'alertname="{SLOW}"': 1})])


def test_ranks_that_differ_steadily_but_less_than_the_factor_stay_silent(tmp_path: Path) -> None:
    # Pipeline stages of unequal weight: the slowest 1.3x the others' median.
    ranks = [Rank(r, [(END, seconds)], jitter=0.05) for r, seconds in enumerate((0.1, 0.11, 0.12, 0.13))]
    check(tmp_path, ranks, [ever_fired(END, {})])


def test_each_job_is_judged_on_its_own(tmp_path: Path) -> None:
    # Two jobs in one namespace at different step times; only the one that slows down fires.
    ranks = [Rank(r, [(ONSET, STEP), (END, 1.6 * STEP)], job="llm") for r in range(2)]
    ranks += [Rank(r, [(END, 3 * STEP)], job="vision", seed=7) for r in range(2)]
    check(tmp_path, ranks, [ever_fired(END, {f'alertname="{SLOW}",job="llm"': 1}, by="alertname, job")])
