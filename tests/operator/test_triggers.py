"""The ProfileTrigger's pure transition (stepscope.operator.triggers.policy) driven poll by poll: which
fires create a session, which the cooldown, the hourly cap or suspend hold back, and what a
restarted operator restores from the status."""
from __future__ import annotations

import pytest

from stepscope import detection
from stepscope.contracts.session import SessionSpec
from stepscope.operator.triggers import policy as triggers
from stepscope.operator.triggers.policy import CreateSession, HoldBack, Observation, Policy, State, step

POLL_S = 5.0
T0 = 1_764_000_000.0  # 2025-11-24T16:00:00Z


def telemetry(t: float, steps: int, step_s: float, world: int = 2) -> detection.Observation:
    """Each rank made `steps` steps of `step_s` by time `t`; the latest 8 are shown."""
    recent = tuple((s, step_s) for s in range(max(1, steps - 7), steps + 1))
    return detection.Observation(t, {r: detection.RankSample(steps, 0.01, recent) for r in range(world)})


def drive(policy: Policy, step_s_at, seconds: float, state: State | None = None, start: float = T0) -> tuple[State, list[tuple[float, triggers.Action]]]:
    state = state or State()
    done = []
    steps = 0
    for n in range(int(seconds / POLL_S)):
        t = start + (n + 1) * POLL_S
        steps += 10
        state, actions = step(state, Observation(t, telemetry(t, steps, step_s_at(t - start))), policy)
        done += [(t - start, a) for a in actions]
    return state, done


FAST = Policy("train-watch", detection.Conditions(sustained_s=20, baseline_window_s=120, min_baseline_polls=5), cooldown_s=60, max_per_hour=2)


def slow_after(t0: float, factor: float = 2.0):
    return lambda t: 0.1 * factor if t >= t0 else 0.1


def test_a_sustained_slowdown_creates_one_named_session_then_the_cooldown_holds_back() -> None:
    state, done = drive(FAST, slow_after(100), 300)
    created = [(t, a) for t, a in done if isinstance(a, CreateSession)]
    assert len(created) == 1, done
    t, action = created[0]
    assert t == 120 and action.condition == detection.SLOWDOWN and action.ranks == (0, 1)
    assert action.name == triggers.session_name("train-watch", T0 + t) == "train-watch-20251124160200"
    assert state.sessions_created == 1 and state.last_fired.session == action.name
    assert triggers.phase(state, FAST, T0 + t + 1) == triggers.COOLING_DOWN
    assert triggers.phase(state, FAST, T0 + t + 61) == triggers.WATCHING


def test_a_healthy_job_learns_then_watches_and_fires_nothing() -> None:
    state, done = drive(FAST, lambda t: 0.1, 20)
    assert triggers.phase(state, FAST, T0 + 20) == triggers.LEARNING
    state, done = drive(FAST, lambda t: 0.1, 600)
    assert done == [] and triggers.phase(state, FAST, T0 + 600) == triggers.WATCHING
    assert state.detection.baseline == pytest.approx(0.1)


def alert(state: State, t: float, policy: Policy = FAST) -> tuple[State, list[triggers.Action]]:
    return step(state, Observation(T0 + t, None, ("GPU throttled on node-3",)), policy)


def test_alerts_fire_within_the_cooldown_and_the_hourly_cap() -> None:
    state, [first] = alert(State(), 0)
    assert isinstance(first, CreateSession) and first.condition == triggers.ALERT and "GPU throttled" in first.reason
    state, [held] = alert(state, 30)
    assert isinstance(held, HoldBack) and held.why.startswith("cooling down") and "cooldownSeconds=60" in held.why
    assert state.last_fired.session is None and state.sessions_created == 1
    state, [second] = alert(state, 100)
    assert isinstance(second, CreateSession) and second.name != first.name
    state, [capped] = alert(state, 200)
    assert isinstance(capped, HoldBack) and "maxSessionsPerHour=2" in capped.why
    assert triggers.phase(state, FAST, T0 + 200) == triggers.CAPPED
    state, [third] = alert(state, 3601)  # the first left the hour
    assert isinstance(third, CreateSession) and state.sessions_created == 3


def test_suspend_and_disabled_conditions_create_nothing() -> None:
    suspended = Policy("t", FAST.conditions, suspended=True)
    state, [held] = alert(State(), 0, suspended)
    assert isinstance(held, HoldBack) and "spec.suspend" in held.why
    assert triggers.phase(state, suspended, T0) == triggers.SUSPENDED
    no_slowdown = Policy("t", FAST.conditions, enabled=frozenset({detection.HANG, detection.DIVERGENCE}), cooldown_s=0)
    _, done = drive(no_slowdown, slow_after(100), 300)
    assert done == []


def test_conditions_firing_together_share_one_session() -> None:
    state, _ = drive(FAST, lambda t: 0.1, 100)
    t = T0 + 200
    hung = detection.Observation(t, {r: detection.RankSample(200, 400.0, ()) for r in range(2)})
    policy = Policy("t", detection.Conditions(sustained_s=20, baseline_window_s=120, min_baseline_polls=5, hang_after_s=60), cooldown_s=0)
    state, actions = step(state, Observation(t, hung, ("job stalled",)), policy)
    assert len(actions) == 1 and actions[0].condition == f"{detection.HANG}, {triggers.ALERT}"
    assert "no step on any rank" in actions[0].reason and "job stalled" in actions[0].reason


def test_a_restarted_operator_keeps_the_cooldown_and_the_count_from_the_status() -> None:
    state, [created] = alert(State(), 0)
    status = triggers.status_fields(state, FAST, T0 + 1)
    assert status["recentSessions"][0]["name"] == created.name and status["sessionsCreated"] == 1
    assert status["lastFired"]["session"] == created.name and status["lastFired"]["time"] == "2025-11-24T16:00:00Z"
    restored = triggers.restored(status)
    assert restored.sessions_created == 1 and restored.recent == state.recent and restored.last_fired == state.last_fired
    _, [held] = alert(restored, 30)
    assert isinstance(held, HoldBack)


def test_policy_reads_each_condition_of_the_spec() -> None:
    policy = Policy.from_spec("t", {"conditions": {"stepTime": {"factor": 2, "baselineMinutes": 0.5, "sustainedSeconds": 5},
                                                   "rankDivergence": {"factor": 3, "sustainedSeconds": 7, "enabled": False},
                                                   "hang": {"noStepSeconds": 9}},
                                    "cooldownSeconds": 0, "maxSessionsPerHour": 3, "suspend": True})
    c = policy.conditions
    assert (c.slowdown_factor, c.baseline_window_s, c.sustained_s, c.divergence_factor, c.divergence_sustained_s, c.hang_after_s) == (2, 30, 5, 3, 7, 9)
    assert policy.enabled == {detection.SLOWDOWN, detection.HANG}
    assert (policy.cooldown_s, policy.max_per_hour, policy.suspended) == (0, 3, True)
    with pytest.raises(ValueError, match=r"spec\.conditions\.stepTime\.factor must be within \(1, 1,000\]"):
        Policy.from_spec("t", {"conditions": {"stepTime": {"factor": 1}}})


def test_session_body_is_owned_by_the_trigger_and_uses_its_selector() -> None:
    trigger = {"metadata": {"name": "train-watch", "uid": "u-1"},
               "spec": {"selector": {"matchLabels": {"job": "a"}}, "sessionTemplate": {"storage": {"uri": "s3://b/p"}, "capture": {"steps": 3}}}}
    body = triggers.session_body(trigger, CreateSession("train-watch-20251124160200", detection.HANG, "no step", (0, 1)))
    # The template is the session's spec type: what the session gets is that spec, its defaults filled in.
    template = SessionSpec.from_dict({"storage": {"uri": "s3://b/p"}, "capture": {"steps": 3}})
    assert body["spec"] == {**template.to_dict(), "selector": {"matchLabels": {"job": "a"}}}
    assert body["spec"]["capture"]["steps"] == 3 and body["spec"]["capture"]["waitSteps"] == 5 and body["spec"]["timeoutSeconds"] == 1800
    [owner] = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("ProfileTrigger", "train-watch", "u-1", True)
    assert body["metadata"]["labels"][triggers.TRIGGER_LABEL] == "train-watch"
    assert body["metadata"]["annotations"][triggers.REASON_ANNOTATION] == "Hang: no step"
    long = {**trigger, "metadata": {"name": "a" * 250, "uid": "u"}}
    body = triggers.session_body(long, CreateSession(triggers.session_name("a" * 250, T0), detection.HANG, "x", ()))
    assert triggers.TRIGGER_LABEL not in body["metadata"]["labels"] and len(body["metadata"]["name"]) == 253


def test_rank_divergence_fires_after_its_own_sustain_window() -> None:
    """spec.conditions.rankDivergence.sustainedSeconds, not stepTime's, times the divergence."""
    policy = Policy.from_spec("t", {"conditions": {"stepTime": {"sustainedSeconds": 600}, "rankDivergence": {"sustainedSeconds": 10}}, "cooldownSeconds": 0})
    state = State()
    fired_at = []
    for n in range(1, 13):
        t = T0 + n * POLL_S
        ranks = {0: detection.RankSample(10 * n, 0.01, tuple((s, 0.1) for s in range(10 * n - 7, 10 * n + 1))),
                 1: detection.RankSample(5 * n, 0.01, tuple((s, 0.3) for s in range(5 * n - 4, 5 * n + 1)))}
        state, actions = step(state, Observation(t, detection.Observation(t, ranks)), policy)
        fired_at += [(n * POLL_S, a.condition, a.ranks) for a in actions]
    assert fired_at == [(15.0, detection.DIVERGENCE, (1,))]


def test_the_divergence_reading_is_the_largest_ratio_to_the_peers_median() -> None:
    """detection finds the diverging rank with one median (not one per rank: 8,000 ranks took
    seconds a poll); the reading equals the brute-force maximum over every rank."""
    import random
    import statistics
    rng = random.Random(1)
    for world in (2, 3, 8, 33):
        times = {r: rng.choice([0.1, 0.1, 0.12, rng.uniform(0.05, 0.4)]) for r in range(world)}
        observation = detection.Observation(10.0, {r: detection.RankSample(5, 0.01, ((5, t),)) for r, t in times.items()})
        state, _ = detection.detect(detection.State(), observation, detection.Conditions())
        brute = max(t / statistics.median(o for q, o in times.items() if q != r) for r, t in times.items())
        assert state.current[detection.DIVERGENCE] == pytest.approx(brute)
