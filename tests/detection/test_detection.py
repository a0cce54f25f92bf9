"""The capture conditions (stepscope.detection) driven poll by poll with simulated ranks: each rank
steps with its own step time (seeded jitter, occasional one-off spikes), and every poll shows what
a sidecar's GET /v1/telemetry shows (steps, seconds since the latest, the last 64 step times)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest

from stepscope.detection import (
    DIVERGENCE,
    HANG,
    SLOWDOWN,
    Conditions,
    Fire,
    Observation,
    RankSample,
    State,
    detect,
    observe,
)

POLL_S = 5.0
StepTime = Callable[[int, float], float | None]  # (rank, time) -> seconds of a step starting then; None: no step (hung)


class Job:
    def __init__(self, world: int, step_time: StepTime, seed: int = 0) -> None:
        self.world, self.step_time, self.random = world, step_time, random.Random(seed)
        self.t = 0.0
        self.steps = dict.fromkeys(range(world), 0)
        self.ends = dict.fromkeys(range(world), 0.0)
        self.starts = dict.fromkeys(range(world), 0.0)
        self.recent: dict[int, list[tuple[int, float]]] = {r: [] for r in range(world)}

    def poll(self) -> Observation:
        self.t += POLL_S
        for rank in range(self.world):
            while True:
                start = self.starts[rank]
                seconds = self.step_time(rank, start)
                if seconds is None:  # blocked: time passes without a step
                    if start + 1.0 > self.t:
                        break
                    self.starts[rank] = start + 1.0
                    continue
                end = start + seconds * self.random.uniform(0.9, 1.1)
                if end > self.t:
                    break
                self.steps[rank] += 1
                # As the agent times it: from the previous step's end, a hang included.
                self.recent[rank] = [*self.recent[rank], (self.steps[rank], end - self.ends[rank])][-64:]
                self.ends[rank] = self.starts[rank] = end
        return Observation(
            self.t,
            {
                r: RankSample(self.steps[r], self.t - self.ends[r] if self.steps[r] else None, tuple(self.recent[r]))
                for r in range(self.world)
            },
        )


def run(
    job: Job, conditions: Conditions, seconds: float, state: State | None = None
) -> tuple[State, list[tuple[float, Fire]]]:
    state = state or State()
    fired = []
    for _ in range(int(seconds / POLL_S)):
        observation = job.poll()
        state, fires = detect(state, observation, conditions)
        fired += [(observation.time, f) for f in fires]
    return state, fired


def healthy(step_s: float = 0.1, spikes_every_s: float = 600.0, spike_s: float = 20.0) -> StepTime:
    """Steps of `step_s`, and one `spike_s` step (a checkpoint) every `spikes_every_s`."""

    def step(rank: int, t: float) -> float:
        return spike_s if t % spikes_every_s < step_s and t > step_s else step_s

    return step


def test_a_healthy_job_with_jitter_and_checkpoints_fires_nothing_in_an_hour() -> None:
    for seed in range(3):
        state, fired = run(Job(4, healthy(), seed), Conditions(), 3600)
        assert fired == [] and state.baseline == pytest.approx(0.1, rel=0.05)
        assert state.current[SLOWDOWN] == pytest.approx(1.0, abs=0.1) and state.current[HANG] < 1


def test_a_sustained_slowdown_fires_once_against_the_baseline_learned_before_it() -> None:
    slow_from = 900.0
    job = Job(4, lambda rank, t: 0.25 if slow_from <= t < 1500 or t >= 2400 else 0.1)
    conditions = Conditions(sustained_s=60)
    state, fired = run(job, conditions, 1400)
    ((when, fire),) = fired
    assert fire.condition == SLOWDOWN and fire.ranks == (0, 1, 2, 3)
    assert slow_from + 60 <= when <= slow_from + 60 + 2 * POLL_S
    assert re.search(r"is 2\.[3-7]\dx the job's baseline 0\.1 s \(over 1\.5x\) for 6\d s", fire.reason), fire.reason
    # The slow steps were not learned into the baseline; once over, a second slowdown fires again.
    assert state.baseline == pytest.approx(0.1, rel=0.05)
    state, fired = run(job, conditions, 1100, state)
    assert [f.condition for _, f in fired] == [SLOWDOWN] and fired[0][0] >= 2400 + 60


def test_a_job_slow_from_its_start_is_its_own_baseline() -> None:
    state, fired = run(Job(2, lambda rank, t: 0.5), Conditions(), 1200)
    assert fired == [] and state.baseline == pytest.approx(0.5, rel=0.05)


def test_one_rank_out_of_step_with_its_peers_is_named() -> None:
    job = Job(4, lambda rank, t: 0.3 if rank == 2 and t >= 300 else 0.1, seed=1)
    state, fired = run(job, Conditions(sustained_s=60), 900)
    assert [(f.condition, f.ranks) for _, f in fired] == [(DIVERGENCE, (2,))]
    assert "rank 2" in fired[0][1].reason and state.current[DIVERGENCE] == pytest.approx(3.0, rel=0.15)


def test_a_hang_fires_once_and_again_after_the_job_stepped() -> None:
    def step(rank: int, t: float) -> float | None:
        return None if 600 <= t < 1200 or 1500 <= t < 2200 else 0.1

    state, fired = run(Job(2, step), Conditions(hang_after_s=300), 2400)
    hangs = [(when, f) for when, f in fired if f.condition == HANG]
    assert [round(when) for when, _ in hangs] == [905, 1805]
    assert hangs[0][1].ranks == (0, 1) and "no step on any rank for 30" in hangs[0][1].reason
    assert all(f.condition == HANG for _, f in fired)  # no steps: neither slowdown nor divergence is judged


def test_a_rank_taken_over_by_a_new_process_starts_over() -> None:
    state, _ = detect(State(), Observation(10.0, {0: RankSample(500, 0.1, ((499, 0.1), (500, 0.1)))}), Conditions())
    state, _ = detect(state, Observation(15.0, {0: RankSample(3, 0.1, ((2, 0.4), (3, 0.2)))}), Conditions())
    assert state.seen == {0: 3} and state.history[-1] == (15.0, pytest.approx(0.3))


@pytest.mark.parametrize(
    "field, value",
    [
        ("slowdown_factor", 1.0),
        ("divergence_factor", 0.5),
        ("sustained_s", 0),
        ("hang_after_s", -1),
        ("baseline_window_s", 0),
        ("min_baseline_polls", 0),
        ("wait_share_gap", 0.0),
        ("wait_share_gap", 1.0),
    ],
)
def test_conditions_that_cannot_work_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Conditions(**{field: value})


def test_an_observation_from_sidecar_answers_keeps_live_ranks_and_skips_what_is_not_telemetry() -> None:
    answers = [
        {
            "pod": "a",
            "ranks": [
                {
                    "rank": 0,
                    "alive": True,
                    "steps": 5,
                    "secondsSinceStep": 0.2,
                    "recent": [[4, 0.1], [5, 0.3]],
                    "waitShare": 0.4,
                },
                {"rank": 1, "alive": False, "steps": 9, "secondsSinceStep": 99.0, "recent": []},
            ],
        },
        {
            "pod": "b",
            "ranks": [
                {"rank": 2, "alive": True, "steps": 0, "secondsSinceStep": None, "recent": []},
                {"rank": 3, "alive": True, "steps": "many"},
                "not a rank",
                {"alive": True},
            ],
        },
        {"error": "no such endpoint"},
    ]
    observation = observe(7.0, answers)
    assert observation.time == 7.0
    assert observation.ranks == {0: RankSample(5, 0.2, ((4, 0.1), (5, 0.3)), 0.4), 2: RankSample(0, None, ())}


def lockstep(polls: int, shares: Callable[[int, int], float | None], world: int = 4) -> list[tuple[float, Fire]]:
    """Ranks in lockstep (the same 0.1 s steps, as DDP's all-reduce makes them), each with the
    wait share `shares(poll, rank)`; the fires of `polls` polls 5 s apart."""
    state, fired = State(), []
    for poll in range(1, polls + 1):
        steps = poll * 50
        ranks = {
            r: RankSample(steps, 0.05, tuple((s, 0.1) for s in range(steps - 49, steps + 1)), shares(poll, r))
            for r in range(world)
        }
        state, fires = detect(state, Observation(poll * POLL_S, ranks), Conditions(sustained_s=30.0))
        fired += [(poll * POLL_S, f) for f in fires]
    return fired


def test_the_rank_its_lockstep_peers_wait_for_is_named_by_its_wait_share() -> None:
    # From poll 20 on, rank 2 holds the job back: its peers wait 60 % of each step, it waits 5 %.
    fired = lockstep(40, lambda poll, rank: 0.05 if poll >= 20 and rank == 2 else (0.6 if poll >= 20 else 0.1))
    assert [(t, f.condition, f.ranks) for t, f in fired] == [(130.0, DIVERGENCE, (2,))]
    assert re.match(
        r"rank 2 waits 5% of its step in collectives, its peers 60%: they wait for it .* for 30 s$", fired[0][1].reason
    )


def test_wait_shares_that_jitter_alike_or_briefly_fire_nothing() -> None:
    rng = random.Random(1)
    # Healthy: every rank's share jitters between 10 % and 40 %; and one 20-s spell of a 50-point gap.
    assert lockstep(100, lambda poll, rank: rng.uniform(0.1, 0.4)) == []
    assert lockstep(40, lambda poll, rank: 0.0 if 10 <= poll < 14 and rank == 1 else 0.5) == []
    # Without DDP there is no share, and step times alike fire nothing either.
    assert lockstep(40, lambda poll, rank: None) == []
