"""The sidecar's control endpoint over real HTTP: signatures, idempotent triggers, conflicts."""
from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from stepscope.contracts.session import SessionSpec
from stepscope.contracts.sidecar_api import CaptureRequest, SessionRequest
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient, SidecarError
from stepscope.signing import sign, target
from tests.sidecar.conftest import KEY


def trigger_body(session: str, destination: str, **spec: Any) -> dict[str, Any]:
    spec = {"capture": {"waitSteps": 1, "steps": 2}, "storage": {"uri": destination}, **spec}
    return {"session": session, "namespace": "default", "name": "t", "destination": destination, "spec": spec}


def to(sidecar: Sidecar) -> str:
    """The address a request to `sidecar` is signed for (what SidecarClient signs)."""
    parts = urlsplit(sidecar.url)
    assert parts.hostname and parts.port
    return target(parts.hostname, parts.port)


def raw(sidecar: Sidecar, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """One request exactly as given, so tests can send what SidecarClient never would."""
    conn = http.client.HTTPConnection(urlsplit(sidecar.url).netloc, timeout=5)
    conn.request(method, path, body=body or None, headers=headers or {})
    response = conn.getresponse()
    payload = json.loads(response.read() or b"{}")
    conn.close()
    return response.status, payload


def test_healthz_needs_no_signature(sidecar: Sidecar) -> None:
    assert raw(sidecar, "GET", "/healthz") == (200, {"ok": True})
    assert SidecarClient(sidecar.url, b"any key").healthz()
    assert not SidecarClient("http://127.0.0.1:9", KEY, timeout=1).healthz()


def test_signed_trigger_is_accepted_then_idempotent(client: SidecarClient, tmp_path: Path, stepscope_dir: Path) -> None:
    body = trigger_body("s-1", (tmp_path / "store").as_uri())
    first = client.put_session("s-1", body)
    assert first["session"] == "s-1" and first["phase"] == "Pending"
    request = json.loads((stepscope_dir / "request.json").read_text())
    assert (stepscope_dir / "request.json").stat().st_mode & 0o777 == 0o644  # readable by a training container's other user
    assert request["session"] == "s-1" and request["action"] == "capture" and request["version"] == 1
    assert request["capture"]["steps"] == 2 and request["capture"]["waitSteps"] == 1
    assert "startStep" not in request  # no rank has stepped yet: each starts waitSteps after it reads the request
    issued = request["issuedAt"]
    # The same id again (an operator restart) changes nothing.
    again = client.put_session("s-1", body)
    assert again["session"] == "s-1"
    assert json.loads((stepscope_dir / "request.json").read_text())["issuedAt"] == issued
    assert client.get_session("s-1")["phase"] == "Pending"


def test_second_session_while_one_is_active_is_refused(client: SidecarClient, tmp_path: Path) -> None:
    client.put_session("s-1", trigger_body("s-1", (tmp_path / "a").as_uri()))
    with pytest.raises(SidecarError) as raised:
        client.put_session("s-2", trigger_body("s-2", (tmp_path / "b").as_uri()))
    assert raised.value.status == 409 and "s-1" in raised.value.message


@pytest.mark.parametrize("case", ["missing", "wrong-key", "stale", "future", "tampered-body", "other-path"])
def test_bad_signatures_get_401(sidecar: Sidecar, tmp_path: Path, case: str) -> None:
    path = "/v1/sessions/s-1"
    body = json.dumps(trigger_body("s-1", (tmp_path / "s").as_uri())).encode()
    headers = {
        "missing": {},
        "wrong-key": sign(b"not the key", "PUT", path, body, to=to(sidecar)),
        "stale": sign(KEY, "PUT", path, body, to=to(sidecar), now=time.time() - 301),
        "future": sign(KEY, "PUT", path, body, to=to(sidecar), now=time.time() + 301),
        "tampered-body": sign(KEY, "PUT", path, body.replace(b'"steps": 2', b'"steps": 9'), to=to(sidecar)),
        "other-path": sign(KEY, "PUT", "/v1/sessions/s-2", body, to=to(sidecar)),
    }[case]
    status, payload = raw(sidecar, "PUT", path, body, headers)
    assert status == 401 and payload["error"]
    assert not (sidecar.dir / "request.json").exists()


def test_replayed_request_gets_401(sidecar: Sidecar, tmp_path: Path) -> None:
    path = "/v1/sessions/s-1"
    body = json.dumps(trigger_body("s-1", (tmp_path / "s").as_uri())).encode()
    headers = sign(KEY, "PUT", path, body, to=to(sidecar))
    assert raw(sidecar, "PUT", path, body, headers)[0] == 201
    status, payload = raw(sidecar, "PUT", path, body, headers)
    assert status == 401 and "replayed" in payload["error"]
    get_headers = sign(KEY, "GET", path, b"", to=to(sidecar))
    assert raw(sidecar, "GET", path, b"", get_headers)[0] == 200
    assert raw(sidecar, "GET", path, b"", get_headers)[0] == 401


def test_client_reports_401_and_unreachable(sidecar: Sidecar) -> None:
    with pytest.raises(SidecarError) as raised:
        SidecarClient(sidecar.url, b"wrong").get_session("x")
    assert raised.value.status == 401 and "signature" in raised.value.message
    with pytest.raises(SidecarError) as raised:
        SidecarClient("http://127.0.0.1:9", KEY, timeout=1).get_session("x")
    assert raised.value.status == 0 and "unreachable" in raised.value.message


@pytest.mark.parametrize(("session", "body", "message"), [
    ("s-1", {"session": "s-1", "spec": {"capture": {"steps": 2}, "storage": {"uri": "file:///tmp/x"}}}, "destination"),
    ("s-1", {"destination": "file:///tmp/x", "spec": {"capture": {"steps": 99}, "storage": {"uri": "file:///tmp/x"}}}, "1..50"),
    ("s-1", {"destination": "gs://b/p", "spec": {"storage": {"uri": "s3://b/p"}}}, "scheme"),
    ("s-1", {"session": "s-9", "destination": "file:///tmp/x", "spec": {"storage": {"uri": "file:///tmp/x"}}}, "does not match"),
    ("..", {"destination": "file:///tmp/x", "spec": {"storage": {"uri": "file:///tmp/x"}}}, "invalid session id"),
    ("s-1", {"destination": "file:///tmp/x", "startStep": -1, "spec": {"storage": {"uri": "file:///tmp/x"}}}, "startStep"),
])
def test_bad_triggers_get_400_with_a_reason(client: SidecarClient, session: str, body: dict[str, Any], message: str) -> None:
    with pytest.raises(SidecarError) as raised:
        client.put_session(session, body)
    assert raised.value.status == 400 and message in raised.value.message


def test_unknown_session_and_endpoint_get_404(client: SidecarClient, sidecar: Sidecar) -> None:
    with pytest.raises(SidecarError) as raised:
        client.get_session("nope")
    assert raised.value.status == 404
    assert raw(sidecar, "GET", "/v2/other", b"", sign(KEY, "GET", "/v2/other", b"", to=to(sidecar)))[0] == 404


def test_client_never_goes_through_an_environment_proxy(sidecar: Sidecar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY set for the object store must not carry signed triggers (and their store
    credentials) to a proxy: the sidecar is always dialled directly."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Proxy(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            seen.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
            self.send_error(502)

        def log_message(self, format: str, *args: object) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        for name in ("HTTP_PROXY", "http_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.server_address[1]}")
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        body = {**trigger_body("s-proxy", (tmp_path / "store").as_uri()), "credentials": {"accessKeyId": "AK", "secretAccessKey": "SECRET"}}
        assert SidecarClient(sidecar.url, KEY).put_session("s-proxy", body)["session"] == "s-proxy"
        assert seen == []
    finally:
        proxy.shutdown()


def test_a_start_step_in_the_body_goes_to_the_ranks_as_it_is(client: SidecarClient, tmp_path: Path, stepscope_dir: Path) -> None:
    """The operator's startStep (the same for every pod of the job) wins over this sidecar's own."""
    client.put_session("s-1", {**trigger_body("s-1", (tmp_path / "store").as_uri()), "startStep": 1234})
    assert json.loads((stepscope_dir / "request.json").read_text())["startStep"] == 1234


def test_the_capture_reaches_request_json_as_the_spec_typed_it(client: SidecarClient, tmp_path: Path, stepscope_dir: Path) -> None:
    """The operator's typed request goes over the wire and into request.json without a hand-made
    dict on the way: what the agent reads back is the very CaptureSpec the session's spec parsed to,
    defaults included; a body past the spec's bounds is refused naming the field."""
    store = (tmp_path / "store").as_uri()
    spec = SessionSpec.from_dict({"capture": {"durationSeconds": 2.5, "limits": {"maxMemoryMB": 64}}, "storage": {"uri": store}})
    client.put_session("s-typed", SessionRequest(session="s-typed", destination=store, spec=spec, startStep=40))
    request = CaptureRequest.from_json((stepscope_dir / "request.json").read_bytes(), "request.json")
    assert request.capture == spec.capture and request.capture.steps is None and request.capture.waitSteps == 5
    assert (request.session, request.action, request.startStep, request.hangTimeoutSeconds) == ("s-typed", "capture", 40, 300)
    client.delete_session("s-typed")
    with pytest.raises(SidecarError, match=r"spec\.capture\.waitSteps must be within 0\.\.100,000"):
        client.put_session("s-big", trigger_body("s-big", store, capture={"waitSteps": 100_001}))
