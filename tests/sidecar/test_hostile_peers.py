"""What anyone on the pod network can do to a sidecar, over real sockets on loopback addresses:
replay a captured request to another sidecar, sign for ever, hold connections, drip bytes, flood
it from one address. Each is refused with bounded memory, threads and time."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.bounded_http import RateLimitedLog
from stepscope.local.launch import free_port
from stepscope.sidecar.control import DEADLINE_S, MAX_BODY, MAX_PER_PEER
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient, SidecarError
from stepscope.signing import HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP
from tests.sidecar.conftest import KEY
from tests.sidecar.test_control_endpoint import trigger_body


def record_one_request(host: str, port: int, answer: bytes) -> tuple[threading.Thread, list[bytes]]:
    """A listener that records the bytes of one request (what a sniffer on the path sees) and answers it."""
    listener = socket.create_server((host, port))
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
            while len(body) < length:
                body += conn.recv(65536)
            seen.append(head + b"\r\n\r\n" + body)
            conn.sendall(
                b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(answer), answer)
            )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, seen


def send_raw(host: str, port: int, data: bytes, source: str = "127.0.0.1") -> bytes:
    with socket.create_connection((host, port), timeout=5, source_address=(source, 0)) as conn:
        conn.sendall(data)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_request_captured_on_its_way_to_one_sidecar_is_refused_by_another(tmp_path: Path) -> None:
    """Two pods' sidecars on the same port of different addresses (as on a pod network): the
    trigger the operator signed for pod A, with the store credentials in it, does not start a
    capture on pod B."""
    port = free_port()
    body = trigger_body("s-1", (tmp_path / "store").as_uri())
    recorder, seen = record_one_request("127.0.0.2", port, json.dumps({"session": "s-1", "phase": "Pending"}).encode())
    SidecarClient(f"http://127.0.0.2:{port}", KEY, timeout=5).put_session("s-1", body)
    recorder.join(5)
    (captured,) = seen
    other = Sidecar(tmp_path / "b", KEY, host="127.0.0.3", port=port, pod="pod-b", pod_ip="127.0.0.3").start()
    try:
        answer = send_raw("127.0.0.3", port, captured.replace(b"127.0.0.2", b"127.0.0.3"))
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"signed for another address" in answer
        assert other.manager.get("s-1") is None and not (tmp_path / "b" / "request.json").exists()
        # The same request signed for pod B's address is taken.
        assert SidecarClient(f"http://127.0.0.3:{port}", KEY).put_session("s-1", body)["session"] == "s-1"
    finally:
        other.shutdown(2)


@pytest.mark.parametrize("timestamp", ["nan", "inf", "-inf", "NaN", "{now}.5", "+{now}", "{now}e0"])
def test_a_timestamp_that_is_not_whole_seconds_is_refused_even_when_signed(sidecar: Sidecar, timestamp: str) -> None:
    """`nan` compares as neither stale nor fresh: a request signed with it would never expire."""
    timestamp = timestamp.format(now=int(time.time()))
    host, port = sidecar.server.server_address[:2]
    path, nonce = "/v1/telemetry", "0" * 32
    message = "\n".join(("GET", f"{host}:{port}", path, timestamp, nonce, hashlib.sha256(b"").hexdigest())).encode()
    headers = {
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: hmac.new(KEY, message, hashlib.sha256).hexdigest(),
    }
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + "\r\n"
    )
    answer = send_raw(host, port, request.encode())
    assert answer.startswith(b"HTTP/1.1 401") and b"whole Unix seconds" in answer, answer[:300]


def test_a_client_that_drips_bytes_is_cut_off_at_the_deadline(sidecar: Sidecar) -> None:
    """A byte a second never trips a per-read timeout; the total deadline ends it."""
    host, port = sidecar.server.server_address[:2]
    began = time.monotonic()
    with socket.create_connection((host, port), timeout=DEADLINE_S + 5) as conn:
        conn.settimeout(1.0)
        closed = None
        for byte in b"PUT /v1/sessions/s-1 HTTP/1.1\r\n" * 4:
            try:
                conn.sendall(bytes([byte]))
                if conn.recv(1024) == b"":
                    closed = time.monotonic() - began
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = time.monotonic() - began
                break
            if time.monotonic() - began > DEADLINE_S + 4:
                break
    assert closed is not None and closed <= DEADLINE_S + 2, f"still open after {time.monotonic() - began:.1f} s"


def _status(pid: int) -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"rss_kb": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"])}


@pytest.fixture
def sidecar_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    env = {**os.environ, "STEPSCOPE_HMAC_KEY": KEY.decode()}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepscope.cli",
            "sidecar",
            "--dir",
            str(tmp_path / "run"),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--pod",
            "pod-a",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"listening on (http://\S+)", line)
    assert match, line
    yield process, match.group(1)
    process.terminate()
    process.wait(10)


def test_six_hundred_held_connections_from_one_pod_cost_the_sidecar_little_and_shut_out_no_one(
    sidecar_process: tuple[subprocess.Popen[str], str],
) -> None:
    """600 connections from one address (127.0.0.2), each sending a fresh timestamp, a wrong
    signature and then part of a body of the largest size taken: the sidecar holds MAX_PER_PEER of
    them, refuses the rest at once (503, closed), and answers a signed request from another address all the while."""
    process, url = sidecar_process
    port = int(url.rsplit(":", 1)[1])
    client = SidecarClient(url, KEY, timeout=5)
    assert client.get_telemetry()["pod"] == "pod-a"
    before = _status(process.pid)
    head = (
        f"PUT /v1/sessions/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {MAX_BODY}\r\n"
        f"{HEADER_TIMESTAMP}: {int(time.time())}\r\n{HEADER_NONCE}: {'1' * 32}\r\n{HEADER_SIGNATURE}: "
        f"{'0' * 64}\r\n\r\n"
    ).encode()
    held: list[socket.socket] = []
    refused = 0
    try:
        for _ in range(600):
            conn = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0))
            held.append(conn)
            try:
                conn.sendall(head + b"x" * 65536)
            except OSError:
                pass  # already closed by the sidecar: counted below
        time.sleep(0.5)
        still_open = len(held)
        for conn in held:
            conn.setblocking(False)
            try:
                answer = conn.recv(4096)
            except BlockingIOError:
                continue  # still held by the sidecar
            except OSError:
                answer = b""  # reset: closed with our unread bytes in its buffer
            refused += answer == b"" or answer.startswith(b"HTTP/1.1 503")
            still_open -= 1
        during = _status(process.pid)
        began = time.monotonic()
        assert client.get_telemetry()["pod"] == "pod-a"
        answered_in = time.monotonic() - began
    finally:
        for conn in held:
            conn.close()
    assert still_open <= MAX_PER_PEER and refused >= 600 - MAX_PER_PEER, (still_open, refused)
    assert during["threads"] - before["threads"] <= MAX_PER_PEER + 2, (before, during)
    assert during["rss_kb"] - before["rss_kb"] < 20_000, (before, during)
    assert answered_in < 2.0


def test_refusals_are_logged_at_most_once_per_interval(sidecar: Sidecar, caplog: pytest.LogCaptureFixture) -> None:
    """A flood of bad requests must not become a flood of log lines: one line, then one per
    interval saying how many were left out."""
    client = SidecarClient(sidecar.url, b"not the key", timeout=5)
    with caplog.at_level("WARNING", logger="stepscope.sidecar.control"):
        for _ in range(50):
            with pytest.raises(SidecarError):
                client.get_telemetry()
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1

    caplog.clear()
    clock = [0.0]
    refusals = RateLimitedLog(logging.getLogger("tests.refusals"), interval_s=10, clock=lambda: clock[0])
    with caplog.at_level("WARNING", logger="tests.refusals"):
        for t in (0, 1, 2, 9.9, 10, 10.5, 25):
            clock[0] = t
            refusals.warning("refused %s", "x")
    assert [r.getMessage() for r in caplog.records] == [
        "refused x",
        "refused x (3 more since the last such line)",
        "refused x (1 more since the last such line)",
    ]
