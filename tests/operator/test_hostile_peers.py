"""What anyone on the pod network can do to the operator, over real sockets on loopback: send the
Alertmanager endpoint an endless body, hold its connections or flood it, and answer the
operator's requests from a selected pod's port with an endless or dripping reply. Each is cut off
with bounded memory and time, and the operator keeps answering the others."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from stepscope.bounded_http import BoundedHTTPServer
from stepscope.operator.sessions import fanout
from stepscope.operator.sessions.selection import Target
from stepscope.operator.triggers import alerts as triggers_alerts
from stepscope.sidecar_client import MAX_REPLY, SidecarClient, SidecarError
from stepscope.testing.kube.helpers import wait_for

KEY = b"alerts-test-namespace-key"
PATH = "/v1/alerts/default/train-watch"
RESOLVED = b'{"version": "4", "status": "resolved", "alerts": []}'


@pytest.fixture
def alerts() -> Iterator[BoundedHTTPServer]:
    server = triggers_alerts.serve("127.0.0.1", 0, lambda namespace: KEY)
    yield server
    server.shutdown()
    server.server_close()


def post(port: int, head: str, source: str = "127.0.0.1") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    conn.sendall(head.encode())
    return conn


def answer_of(conn: socket.socket, within: float) -> bytes:
    conn.settimeout(within)
    data = b""
    try:
        while chunk := conn.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    except OSError:
        pass  # reset after the answer: the server closed with our unread bytes
    return data


def push(conn: socket.socket, total: int) -> int:
    """Send up to `total` bytes; how many went before the server closed the connection."""
    sent, chunk = 0, b"x" * (1 << 20)
    conn.settimeout(5)
    try:
        while sent < total:
            conn.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    return sent


@pytest.mark.parametrize("length", ["-1", "abc", "1 2"])
def test_a_bad_content_length_without_a_token_is_refused_before_any_body_is_read(
    alerts: BoundedHTTPServer, length: str
) -> None:
    """Content-Length: -1 used to be read to the end of the stream: 300 MiB took the operator to
    670 MB. Now the answer comes after the headers, and the connection is gone after a few MiB."""
    port = alerts.server_address[1]
    began = time.monotonic()
    conn = post(port, f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n")
    with conn:
        answer = answer_of(conn, 3)
        answered_in = time.monotonic() - began
        assert answer.split(b" ", 2)[1] in (b"400", b"401"), answer[:200]
        pushed = push(conn, 300 << 20)
    assert answered_in < 2 and pushed < 32 << 20, (answered_in, pushed)


def test_a_large_body_without_a_token_is_refused_unread(alerts: BoundedHTTPServer) -> None:
    port = alerts.server_address[1]
    with post(port, f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {300 << 20}\r\n\r\n") as conn:
        assert answer_of(conn, 3).startswith(b"HTTP/1.0 401"), "the token is checked before the body"
        assert push(conn, 300 << 20) < 32 << 20
    token = triggers_alerts.alert_token(KEY)
    with post(
        port, f"POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {300 << 20}\r\n\r\n"
    ) as conn:
        assert answer_of(conn, 3).startswith(b"HTTP/1.0 413")


def test_a_client_that_sends_headers_and_then_nothing_is_cut_off_at_the_deadline(alerts: BoundedHTTPServer) -> None:
    port = alerts.server_address[1]
    began = time.monotonic()
    with post(port, f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nAuthorization: Bearer ") as conn:
        answer_of(conn, triggers_alerts.DEADLINE_S + 5)
    assert time.monotonic() - began < triggers_alerts.DEADLINE_S + 2
    wait_for(lambda: alerts.connections() == 0, 2, "the handler thread to end")


def test_connections_past_the_cap_are_refused_while_others_are_answered(alerts: BoundedHTTPServer) -> None:
    port = alerts.server_address[1]
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"  # never finished
    held = [post(port, head, source="127.0.0.2") for _ in range(3 * triggers_alerts.MAX_PER_PEER)]
    try:
        answers = [answer_of(conn, 0.3) for conn in held]
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) == 2 * triggers_alerts.MAX_PER_PEER, [a[:20] for a in answers]
        token = triggers_alerts.alert_token(KEY)
        began = time.monotonic()
        with post(
            port,
            f"POST {PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: "
            f"{len(RESOLVED)}\r\n\r\n" + RESOLVED.decode(),
        ) as conn:
            assert answer_of(conn, 3).startswith(b"HTTP/1.0 200")
        assert time.monotonic() - began < 1
    finally:
        for conn in held:
            conn.close()


class HostilePod:
    """What answers on a selected pod's `stepscope` port: `mode` "flood" sends a reply of 400 MB,
    "drip" a byte every `drip_s` seconds. It counts what it managed to send."""

    def __init__(self, mode: str, drip_s: float = 1.0) -> None:
        self.mode, self.drip_s = mode, drip_s
        self.sent = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            try:
                if self.mode == "flood":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
                    chunk = b" " * (1 << 20)
                    while self.sent < 400 << 20 and not self._stop.is_set():
                        conn.sendall(chunk)
                        self.sent += len(chunk)
                else:
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}":
                        if self._stop.wait(self.drip_s):
                            return
                        conn.sendall(bytes([byte]))
                        self.sent += 1
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self.listener.close()


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[HostilePod]:
    pod = HostilePod(request.param)
    yield pod
    pod.close()


def _get_session(port: int, timeout: float, how: str) -> dict:
    """GET /v1/sessions/s-1 with the blocking client or its event-loop form (the operator's fan-out)."""
    client = SidecarClient(f"http://127.0.0.1:{port}", KEY, timeout=timeout)
    if how == "blocking":
        return client.get_session("s-1")
    return asyncio.run(client.request_async("GET", SidecarClient.session_path("s-1")))


@pytest.mark.parametrize("how", ["blocking", "async"])
@pytest.mark.parametrize("hostile", ["flood"], indirect=True)
def test_a_reply_without_end_is_refused_past_the_cap(hostile: HostilePod, how: str) -> None:
    """400 MB from a pod's port took the operator to 1.2 GB; now the client stops at MAX_REPLY."""
    began = time.monotonic()
    with pytest.raises(SidecarError, match=f"over {MAX_REPLY} bytes"):
        _get_session(hostile.port, 5, how)
    assert time.monotonic() - began < 3
    time.sleep(0.3)
    assert hostile.sent < MAX_REPLY + (32 << 20), hostile.sent


@pytest.mark.parametrize("how", ["blocking", "async"])
@pytest.mark.parametrize("hostile", ["drip"], indirect=True)
def test_a_reply_dripping_a_byte_a_second_ends_at_the_total_deadline(hostile: HostilePod, how: str) -> None:
    """Each byte comes within the 2 s timeout, so only a total deadline ends the request."""
    began = time.monotonic()
    with pytest.raises(SidecarError, match="no complete answer within 2 s"):
        _get_session(hostile.port, 2, how)
    assert time.monotonic() - began < 3


@pytest.mark.parametrize("hostile", ["drip"], indirect=True)
def test_slow_pods_hold_the_sidecar_limit_not_the_default_executor(hostile: HostilePod) -> None:
    """kopf and every session's status writes run on asyncio's default executor: a poll of
    dripping pods must leave it free, and end at the deadline."""

    async def scenario() -> tuple[list[fanout.Outcome], float]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        targets = [Target(f"p{i}", "127.0.0.1", hostile.port) for i in range(4)]
        polling = asyncio.create_task(fanout.poll(targets, "s-1", KEY, limit=fanout.Limit(4), timeout=2))
        await asyncio.sleep(0.2)
        began = time.monotonic()
        await asyncio.wait_for(asyncio.to_thread(time.sleep, 0), 1)
        free_in = time.monotonic() - began
        return await polling, free_in

    outcomes, default_free_in = asyncio.run(scenario())
    assert default_free_in < 0.5
    assert [o.ok for o in outcomes] == [False] * 4 and all("no complete answer" in o.error for o in outcomes)


class Admission:
    """The operator's admission HTTPS server (InjectionServer) on 127.0.0.1, in a loop of its own;
    what it calls for a review answers allowed, so that only the server's bounds are under test."""

    def __init__(self, **bounds: float) -> None:
        from stepscope.operator.injection import certs
        from stepscope.operator.injection.webhook import InjectionServer

        self.cert = certs.generate(["127.0.0.1"])
        self.server = InjectionServer(self.cert, addr="127.0.0.1", port=0, host="127.0.0.1", **bounds)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def allow(review: dict, **_: object) -> dict:
            return {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True},
            }

        self.serving = self.server(allow)
        config = asyncio.run_coroutine_threadsafe(self.serving.__anext__(), self.loop).result(10)
        self.port = int(config["url"].rsplit(":", 1)[1])
        self.context = ssl.create_default_context(cadata=self.cert.ca_pem.decode())

    def connect(self, source: str = "127.0.0.1") -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=(source, 0))
        return self.context.wrap_socket(raw, server_hostname="127.0.0.1")

    def review(self, size: int, source: str = "127.0.0.1") -> bytes:
        body = b'{"request": {"uid": "u-1", "object": {"pad": "' + b"x" * size + b'"}}}'
        with self.connect(source) as conn:
            conn.sendall(
                b"POST /inject-sidecar HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            return answer_of(conn, 5)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.serving.aclose(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def admission(request: pytest.FixtureRequest) -> Iterator[Admission]:
    server = Admission(**getattr(request, "param", {}))
    yield server
    server.close()


def test_an_admission_review_of_a_large_pod_is_taken_and_a_larger_body_refused(admission: Admission) -> None:
    """A pod update's review carries the pod twice, each up to etcd's 1.5 MiB: aiohttp's default
    1 MiB refused it (and failurePolicy Ignore admitted the pod without its injected env)."""
    from stepscope.operator.injection.webhook import MAX_REVIEW_BYTES

    assert admission.review(3 << 20).startswith(b"HTTP/1.1 200")
    assert admission.review(MAX_REVIEW_BYTES + 1).startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize("admission", [{"max_per_peer": 4, "connection_s": 1.0, "grace_s": 1.0}], indirect=True)
def test_admission_connections_are_capped_per_address_and_live_a_bounded_time(admission: Admission) -> None:
    began = time.monotonic()
    held = [admission.connect("127.0.0.2") for _ in range(4)]
    try:
        for conn in held:
            conn.sendall(b"POST /inject-sidecar HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        with pytest.raises(OSError):  # the fifth from that address is cut during or right after the handshake
            extra = admission.connect("127.0.0.2")
            extra.sendall(b"GET / HTTP/1.1\r\n\r\n")
            if not answer_of(extra, 2):
                raise ConnectionResetError("closed at once")
        assert admission.review(1000).startswith(b"HTTP/1.1 200"), "another address is still answered"
        for conn in held:
            answer_of(conn, 5)  # returns when the server closes it
        assert time.monotonic() - began < 1.0 + 1.0 + 1.0, "the held connections end at their lifetime"
    finally:
        for conn in held:
            conn.close()
