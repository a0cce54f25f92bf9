"""Fan-out over real HTTP: signed PUTs, retries of what may pass on a second try, no retry of a
final answer, and the bound on requests open at once."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stepscope.contracts.session import SessionSpec
from stepscope.contracts.sidecar_api import SessionRequest
from stepscope.contracts.wire import aligned_start_step
from stepscope.operator.sessions import fanout
from stepscope.operator.sessions.selection import Target
from stepscope.signing import Verifier, target

KEY = b"fanout-test-key"


def limit() -> fanout.Limit:
    """At most 4 requests at once, as the operator's Context bounds them (one per event loop)."""
    return fanout.Limit(4)


class Flaky(ThreadingHTTPServer):
    """Answers 503 to the first PUT of each path, then 201; 409 for paths ending in 'busy'."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.verifier = Verifier(KEY)
        self.puts: dict[str, int] = {}
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    server: Flaky

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        host, port = self.server.server_address[:2]
        self.server.verifier.verify("PUT", self.path, body, self.headers, targets={target(str(host), port)})
        with self.server.lock:
            self.server.puts[self.path] = self.server.puts.get(self.path, 0) + 1
            count = self.server.puts[self.path]
            self.server.active += 1
            self.server.peak = max(self.server.peak, self.server.active)
        threading.Event().wait(0.05)
        with self.server.lock:
            self.server.active -= 1
        code = 409 if self.path.endswith("busy") else (503 if count == 1 else 201)
        payload = json.dumps({"error": "busy"} if code >= 400 else {"session": json.loads(body)["session"]}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Flaky]:
    s = Flaky()
    threading.Thread(target=s.serve_forever, daemon=True).start()
    yield s
    s.shutdown()
    s.server_close()


def _request(session: str) -> SessionRequest:
    return SessionRequest(
        session=session, destination="s3://bucket/p", spec=SessionSpec.from_dict({"storage": {"uri": "s3://bucket/p"}})
    )


def test_trigger_retries_a_transient_failure_within_the_bound(server: Flaky) -> None:
    targets = [Target(f"p{i}", "127.0.0.1", server.server_address[1]) for i in range(12)]
    outcomes = asyncio.run(
        fanout.trigger(targets, _request("s1"), KEY, limit=limit(), timeout=5, attempts=3, backoff_s=0.01)
    )
    assert all(o.ok for o in outcomes) and [o.target.pod for o in outcomes] == [f"p{i}" for i in range(12)]
    assert server.puts == {"/v1/sessions/s1": 13}  # the first attempt got 503, every other one 201
    assert server.peak <= 4


def test_trigger_does_not_retry_a_final_answer(server: Flaky) -> None:
    target = Target("p", "127.0.0.1", server.server_address[1])
    (outcome,) = asyncio.run(
        fanout.trigger([target], _request("busy"), KEY, limit=limit(), timeout=5, attempts=3, backoff_s=0.01)
    )
    assert (outcome.ok, outcome.status, outcome.error) == (False, 409, "busy")
    assert server.puts == {"/v1/sessions/busy": 1}


def test_unreachable_sidecar_is_an_outcome_not_an_exception(server: Flaky) -> None:
    (outcome,) = asyncio.run(fanout.poll([Target("gone", "127.0.0.1", 1)], "s1", KEY, limit=limit(), timeout=1))
    assert not outcome.ok and outcome.status == 0 and "unreachable" in outcome.error


def test_the_start_step_is_wait_steps_after_the_furthest_live_rank_of_any_pod(server: Flaky) -> None:
    """The session body's startStep, from GET /v1/telemetry answers (docs/wire.md); a dead rank's
    count is left out, and without any live rank (an old sidecar answers 501 here) there is none."""

    def pod(name: str, ranks: list[dict]) -> fanout.Outcome:
        return fanout.Outcome(
            Target(name, "127.0.0.1", 1), True, {"pod": name, "node": "n", "time": 0.0, "ranks": ranks}
        )

    answers = [
        pod("a", [{"rank": 0, "alive": True, "steps": 41}, {"rank": 1, "alive": True, "steps": 40}]),
        pod("b", [{"rank": 2, "alive": True, "steps": 42}, {"rank": 3, "alive": False, "steps": 90}]),
        fanout.Outcome(Target("c", "127.0.0.1", 1), False, {}, "unreachable", 0),
    ]
    assert aligned_start_step(fanout.live_step_counts(answers), 5) == 47
    assert aligned_start_step(fanout.live_step_counts(answers[1:]), 0) == 42
    old = asyncio.run(
        fanout.telemetry([Target("old", "127.0.0.1", server.server_address[1])], KEY, limit=limit(), timeout=5)
    )
    assert not old[0].ok and aligned_start_step(fanout.live_step_counts(old), 5) is None
    assert aligned_start_step(fanout.live_step_counts([pod("idle", [])]), 5) is None
