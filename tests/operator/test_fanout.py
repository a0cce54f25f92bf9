"""Fan-out over real HTTP: signed PUTs, retries of what may pass on a second try, no retry of a
final answer, and the bound on requests open at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest

from stepscope.contracts.session import SessionSpec
from stepscope.contracts.sidecar_api import SessionRequest
from stepscope.contracts.wire import aligned_start_step
from stepscope.operator import kube
from stepscope.operator.sessions import fanout, lifecycle
from stepscope.operator.sessions.selection import Target
from stepscope.operator.sessions.status import PodProgress
from stepscope.operator.settings import OperatorSettings
from stepscope.sidecar_client import MAX_HEAD, SidecarClient, SidecarError
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


class RawPeer:
    """What listens on a pod's port, speaking bytes: `answer(conn, request)` is called with each
    connection and the whole request it sent (head and Content-Length body)."""

    def __init__(self, answer: Callable[[socket.socket, bytes], None], host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, 0), family=family)
        self.port = self.listener.getsockname()[1]
        self.answer = answer
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                received = b""
                while b"\r\n\r\n" not in received:
                    received += conn.recv(65536)
                head, _, body = received.partition(b"\r\n\r\n")
                length = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]
                while len(body) < length:
                    body += conn.recv(1 << 20)
                self.requests.append(head + b"\r\n\r\n" + body)
                self.answer(conn, head + b"\r\n\r\n" + body)

    def close(self) -> None:
        self.listener.close()


def _answer_json(payload: dict) -> bytes:
    data = json.dumps(payload).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)


def test_the_fan_out_opens_no_transport_per_request(server: Flaky, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 10,240 pods asyncio's transports and streams were most of the operator's CPU a request
    (docs/benchmarks.md): the fan-out drives each socket with the loop's callbacks instead."""

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the fan-out opened an asyncio transport")

    monkeypatch.setattr(asyncio.BaseEventLoop, "create_connection", refused)
    targets = [Target(f"p{i}", "127.0.0.1", server.server_address[1]) for i in range(6)]
    outcomes = asyncio.run(
        fanout.trigger(targets, _request("s2"), KEY, limit=limit(), timeout=5, attempts=3, backoff_s=0.01)
    )
    assert [o.error for o in outcomes] == [""] * 6 and all(o.ok for o in outcomes)


def test_a_request_larger_than_the_socket_buffers_is_sent_whole() -> None:
    """A body the kernel takes in several sends (8 MiB: the client waits for room between them)
    arrives intact and signed."""
    body = bytes(range(256)) * (32 << 10)

    def count(conn: socket.socket, request: bytes) -> None:
        conn.sendall(_answer_json({"bytes": len(request.partition(b"\r\n\r\n")[2])}))

    peer = RawPeer(count)
    try:
        client = SidecarClient(f"http://127.0.0.1:{peer.port}", KEY, timeout=10)
        answer = asyncio.run(client.request_async("PUT", SidecarClient.session_path("s-1"), body))
    finally:
        peer.close()
    assert answer == {"bytes": len(body)}
    head, _, sent = peer.requests[0].partition(b"\r\n\r\n")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    assert sent == body
    Verifier(KEY).verify("PUT", "/v1/sessions/s-1", sent, headers, targets={target("127.0.0.1", peer.port)})


def test_an_answer_in_pieces_and_an_ipv6_pod_are_read_whole() -> None:
    """The head and the body split across many reads, from a pod on an IPv6 address."""
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback here")

    def in_pieces(conn: socket.socket, request: bytes) -> None:
        for byte in _answer_json({"session": "s-1", "phase": "Capturing"}):
            conn.sendall(bytes([byte]))
            time.sleep(0.001)

    peer = RawPeer(in_pieces, "::1")
    try:
        (outcome,) = asyncio.run(fanout.poll([Target("p", "::1", peer.port)], "s-1", KEY, limit=limit(), timeout=5))
    finally:
        peer.close()
    assert (outcome.ok, outcome.answer) == (True, {"session": "s-1", "phase": "Capturing"})
    assert peer.requests[0].startswith(f"GET /v1/sessions/s-1 HTTP/1.1\r\nHost: [::1]:{peer.port}\r\n".encode())


def test_an_answer_whose_head_never_ends_is_refused_at_the_cap() -> None:
    def endless_head(conn: socket.socket, request: bytes) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (MAX_HEAD * 4))

    peer = RawPeer(endless_head)
    try:
        client = SidecarClient(f"http://127.0.0.1:{peer.port}", KEY, timeout=5)
        with pytest.raises(SidecarError, match=f"head is over {MAX_HEAD} bytes"):
            asyncio.run(client.request_async("GET", SidecarClient.session_path("s-1")))
    finally:
        peer.close()


def _running(name: str, port: int) -> kube.Pod:
    return msgspec.convert(
        {
            "metadata": {"name": name},
            "spec": {"containers": [{"ports": [{"name": "stepscope", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
        },
        kube.Pod,
    )


def test_a_poll_round_lists_the_pods_while_it_asks_the_sidecars(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 10,240 pods the listing and the requests take about a second each: a round after the
    first asks the sidecars the last listing found while it lists again. A pod deleted meanwhile
    is lost as deleted, whatever its sidecar answered."""
    answer_s, list_s = 0.4, 1.5

    def slowly(conn: socket.socket, request: bytes) -> None:
        time.sleep(answer_s)  # one connection at a time: four pods take 1.6 s
        conn.sendall(_answer_json({"session": "uid-1", "phase": "Capturing"}))

    peer = RawPeer(slowly)
    listings = [[_running(f"p{i}", peer.port) for i in range(4)], [_running(f"p{i}", peer.port) for i in range(3)]]

    def list_pods(namespace: str, selector: str) -> list[kube.Pod]:
        time.sleep(list_s)
        return listings.pop(0) if len(listings) > 1 else listings[0]

    monkeypatch.setattr(kube, "list_pods", list_pods)
    obj = {"metadata": {"namespace": "default", "name": "s", "uid": "uid-1"}}
    runner = lifecycle.SessionRunner(obj, lifecycle.Context(OperatorSettings(), KEY), None, logging.getLogger())
    progress = {f"p{i}": PodProgress() for i in range(4)}

    async def rounds() -> list[float]:
        took = []
        for _ in range(2):
            began = time.monotonic()
            await runner._poll("job=big", progress)
            took.append(time.monotonic() - began)
        return took

    try:
        first, second = asyncio.run(rounds())
    finally:
        peer.close()
    assert first >= list_s + 4 * answer_s  # nothing listed before: the listing, then the requests
    # one after the other, the three pods left would take list_s + 3 * answer_s (2.7 s); together 1.6 s
    assert second < list_s + 2 * answer_s, (first, second)
    assert [progress[f"p{i}"].answer.get("phase") for i in range(3)] == ["Capturing"] * 3
    assert progress["p3"].lost == "pod deleted during capture"
    assert len(peer.requests) == 8
