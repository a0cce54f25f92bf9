"""request.json's startStep (docs/wire.md): an absolute step at which every rank of a job begins
capturing, so that ranks that read the request at different steps still capture the same steps.
The agent runs in this process, stepped by hand, with the real profiler (CPU, no stacks)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.agent import agent as agent_module
from stepscope.agent.session import Session
from stepscope.agent.vocabulary import capture_request
from tests.agent.protocol import read_state, stepscope_dir, wait_for_state, write_request  # noqa: F401  (fixture)


@pytest.fixture
def agent(stepscope_dir: Path) -> Iterator[agent_module.Agent]:
    a = agent_module.Agent(str(stepscope_dir))
    yield a
    a._stopping.set()  # ends its watchdog thread


def _step(a: agent_module.Agent, times: int = 1) -> None:
    for _ in range(times):
        time.sleep(agent_module.REQUEST_POLL_SECONDS * 2)  # an idle agent stats request.json at most this often
        a.manual_step()


def _capture(directory: Path, a: agent_module.Agent, session: str, start_step: int | None, wait_steps: int) -> dict:
    write_request(directory, session, start_step=start_step, waitSteps=wait_steps, steps=1, activities=["CPU"], withStack=False)
    while (read_state(directory, session, 0) or {}).get("state") not in ("done", "failed"):
        _step(a)
        assert a.step_count < 40, read_state(directory, session, 0)
    return wait_for_state(directory, session, 0, ("done",), timeout=10)


def test_a_rank_before_start_step_waits_for_it_and_one_past_it_starts_at_its_next_step(stepscope_dir: Path, agent: agent_module.Agent) -> None:
    _step(agent, 3)
    before = _capture(stepscope_dir, agent, "s-before", start_step=8, wait_steps=0)  # waitSteps alone would start at once
    assert (before["triggerStep"], before["startStep"], before["endStep"]) == (4, 8, 9), before
    past = _capture(stepscope_dir, agent, "s-past", start_step=2, wait_steps=5)  # already past it: at the step it reads it
    trigger = past["triggerStep"]
    assert trigger > 9 and (past["startStep"], past["endStep"]) == (trigger, trigger + 1), past
    plain = _capture(stepscope_dir, agent, "s-plain", start_step=None, wait_steps=2)  # no startStep: waitSteps after the trigger
    assert plain["startStep"] == plain["triggerStep"] + 2, plain
    # A rank whose count restarted cannot wait for its peers' step: it waits as if none were given.
    far = _capture(stepscope_dir, agent, "s-far", start_step=plain["triggerStep"] + 10_000, wait_steps=1)
    assert far["startStep"] == far["triggerStep"] + 1, far


def test_a_hand_written_request_gets_the_specs_defaults_for_what_it_leaves_out() -> None:
    """One home for the capture's defaults (stepscope.contracts.wire): the spec and the agent agree, and only
    a missing field takes one (waitSteps 0 is a choice)."""
    from stepscope.contracts.session import SessionSpec
    from stepscope.contracts.wire import DEFAULT_ACTIVITIES

    spec = SessionSpec()
    bare = Session(capture_request(b'{"session": "s-bare"}'), 3, "unused")
    assert (bare.wait_steps, bare.steps, bare.hang_timeout) == (spec.capture.waitSteps, spec.capture.steps, spec.hangTimeoutSeconds)
    assert bare.capture == spec.capture and tuple(bare.capture.activities) == DEFAULT_ACTIVITIES and bare.start_at == 3 + spec.capture.waitSteps
    assert Session(capture_request(b'{"session": "s-now", "capture": {"waitSteps": 0}}'), 3, "unused").start_at == 3
