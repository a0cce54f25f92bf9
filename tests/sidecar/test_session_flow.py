"""A session through the real sidecar: simulated ranks advance their state files, the sidecar
reports progress over HTTP and uploads real traces' artifacts to a file:// store."""
from __future__ import annotations

import gzip
import json
import logging
import threading
import time
from pathlib import Path

import pytest

from stepscope.analysis.model import decode_summary
from stepscope.contracts import layout
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient
from stepscope.testing.nvml.simulated import SimulatedBackend
from tests.sidecar.conftest import KEY, SimulatedRanks, wait_for
from tests.sidecar.test_control_endpoint import trigger_body
from tests.storage.conftest import bucket, moto_endpoint, s3  # noqa: F401 - fixtures
from tests.storage.proxy import Proxy

TRACES = "hta__trace_filter_2rank"


@pytest.fixture()
def real_traces(shared_traces: Path) -> dict[int, Path]:
    folder = shared_traces / TRACES
    return {0: folder / "sampled_rank-0.json.gz", 1: folder / "sampled_rank-1.json.gz"}


def trigger(client: SidecarClient, session: str, store: Path, **spec) -> None:
    """PUT a session and wait until the sidecar counts both simulated ranks."""
    client.put_session(session, trigger_body(session, store.as_uri(), **spec))
    wait_for(client, session, lambda s: s["workers"]["total"] == 2)


def test_progress_is_reported_then_artifacts_uploaded(client: SidecarClient, ranks: SimulatedRanks, stepscope_dir: Path,
                                                      tmp_path: Path, real_traces: dict[int, Path]) -> None:
    store = tmp_path / "store"
    client.put_session("s-1", trigger_body("s-1", store.as_uri(), saveRawTrace="master"))
    status = wait_for(client, "s-1", lambda s: s["workers"]["total"] == 2)
    assert status["phase"] == "Pending" and status["workers"]["triggered"] == 0

    for rank in (0, 1):
        ranks.state("s-1", rank, "waiting")
    status = wait_for(client, "s-1", lambda s: s["workers"]["triggered"] == 2)
    assert status["phase"] == "Pending" and "waiting" in status["message"]

    ranks.state("s-1", 0, "capturing")
    status = wait_for(client, "s-1", lambda s: s["workers"]["capturing"] == 1)
    assert status["phase"] == "Capturing"

    ranks.state("s-1", 0, "done", trace_from=real_traces[0])
    ranks.state("s-1", 1, "capturing")
    status = wait_for(client, "s-1", lambda s: s["workers"]["uploaded"] == 1)
    assert status["phase"] == "Capturing" and status["workers"]["captured"] == 1
    ranks.state("s-1", 1, "done", trace_from=real_traces[1])

    status = wait_for(client, "s-1", lambda s: s["phase"] == "Succeeded")
    assert status["workers"] == {"total": 2, "triggered": 2, "capturing": 0, "captured": 2, "uploaded": 2, "failed": 0}
    assert [r["state"] for r in status["ranks"]] == ["done", "done"] and all(r["uploaded"] for r in status["ranks"])
    assert status["ranks"][0]["startStep"] == 15 and status["ranks"][0]["pid"] == 1000
    # saveRawTrace: master keeps rank 0's raw trace only; summaries are always there.
    expected = [layout.rank_summary(0), layout.rank_summary(1), layout.rank_trace(0)]
    assert status["artifacts"] == sorted(expected)
    assert sorted(p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file()) == sorted(expected)
    assert (store / layout.rank_trace(0)).read_bytes() == real_traces[0].read_bytes()
    for rank in (0, 1):
        summary = decode_summary((store / layout.rank_summary(rank)).read_bytes())
        assert summary.rank == rank and summary.pod == "pod-a" and summary.node == "node-a"
        assert not summary.error and len(summary.steps) == 2
    # Uploaded, so the shared volume is freed.
    assert not list((stepscope_dir / "s-1").glob("*.trace.json.gz"))


def test_hung_rank_fails_the_session_with_its_reason_and_stacks(client: SidecarClient, ranks: SimulatedRanks, tmp_path: Path,
                                                                real_traces: dict[int, Path]) -> None:
    store = tmp_path / "store"
    trigger(client, "s-h", store)
    ranks.state("s-h", 0, "done", trace_from=real_traces[0])
    ranks.state("s-h", 1, "hung", stacks=True)
    status = wait_for(client, "s-h", lambda s: s["phase"] == "Failed")
    assert status["workers"]["failed"] == 1 and status["workers"]["uploaded"] == 1
    assert "rank 1" in status["message"] and "hung" in status["message"]
    assert json.loads((store / layout.rank_stacks(1)).read_text())["threads"][0]["frames"][0]["function"] == "all_reduce"
    hung = decode_summary((store / layout.rank_summary(1)).read_bytes())
    assert hung.rank == 1 and "hung" in hung.error
    assert (store / layout.rank_trace(0)).exists()


def test_delete_cancels_and_keeps_what_was_captured(client: SidecarClient, ranks: SimulatedRanks, stepscope_dir: Path,
                                                    tmp_path: Path, real_traces: dict[int, Path]) -> None:
    store = tmp_path / "store"
    trigger(client, "s-c", store)
    ranks.state("s-c", 0, "capturing")
    ranks.state("s-c", 1, "waiting")
    wait_for(client, "s-c", lambda s: s["phase"] == "Capturing")
    client.delete_session("s-c")
    request = json.loads((stepscope_dir / "request.json").read_text())
    assert request["session"] == "s-c" and request["action"] == "cancel"
    assert client.get_session("s-c")["phase"] == "Capturing"
    # The agents answer at their next step boundary; rank 0 had captured a step already.
    ranks.state("s-c", 0, "cancelled", trace_from=real_traces[0])
    ranks.state("s-c", 1, "cancelled")
    status = wait_for(client, "s-c", lambda s: s["phase"] == "Cancelled")
    assert status["workers"]["failed"] == 0
    assert (store / layout.rank_trace(0)).exists() and (store / layout.rank_summary(0)).exists()
    assert not (store / layout.rank_summary(1)).exists()
    # A finished session no longer blocks the next one.
    assert client.put_session("s-next", trigger_body("s-next", store.as_uri()))["phase"] == "Pending"


def test_vanished_training_process_fails_its_rank(client: SidecarClient, ranks: SimulatedRanks, tmp_path: Path,
                                                  real_traces: dict[int, Path]) -> None:
    store = tmp_path / "store"
    trigger(client, "s-v", store)
    ranks.state("s-v", 0, "done", trace_from=real_traces[0])
    ranks.state("s-v", 1, "capturing")
    ranks.kill(1)
    status = wait_for(client, "s-v", lambda s: s["phase"] == "Failed")
    rank1 = status["ranks"][1]
    assert rank1["state"] == "failed" and "heartbeat" in rank1["error"]
    assert "heartbeat" in decode_summary((store / layout.rank_summary(1)).read_bytes()).error


def test_failed_upload_keeps_the_local_trace(client: SidecarClient, ranks: SimulatedRanks, stepscope_dir: Path, tmp_path: Path,
                                             real_traces: dict[int, Path]) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder should be")
    trigger(client, "s-f", blocker / "store")
    for rank in (0, 1):
        ranks.state("s-f", rank, "done", trace_from=real_traces[rank])
    status = wait_for(client, "s-f", lambda s: s["phase"] == "Failed")
    assert status["workers"]["failed"] == 2 and status["workers"]["uploaded"] == 0
    assert "cannot write" in status["ranks"][0]["error"]
    for rank in (0, 1):
        assert (stepscope_dir / "s-f" / f"rank-{rank}.trace.json.gz").read_bytes() == real_traces[rank].read_bytes()


def test_request_json_is_replaced_atomically(client: SidecarClient, stepscope_dir: Path, tmp_path: Path) -> None:
    """A reader polling request.json (as the agent does) never sees a partial file."""
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append(json.loads((stepscope_dir / "request.json").read_text())["action"])
            except FileNotFoundError:
                pass

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(15):
            client.put_session(f"s-{i}", trigger_body(f"s-{i}", (tmp_path / "store").as_uri()))
            client.delete_session(f"s-{i}")
            wait_for(client, f"s-{i}", lambda s: s["phase"] == "Cancelled")
    finally:
        stop.set()
        reader.join()
    assert set(seen) == {"capture", "cancel"}
    assert [p.name for p in stepscope_dir.iterdir() if p.name.startswith(".")] == []


def _shifted_trace(source: Path, target: Path, start_us: float) -> None:
    """The real trace moved in time so that its steps fall inside this test's recording window."""
    trace = json.loads(gzip.decompress(source.read_bytes()))
    first = min(e["ts"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep"))
    for event in trace["traceEvents"]:
        if "ts" in event:
            event["ts"] = event["ts"] - first + start_us
    target.write_bytes(gzip.compress(json.dumps(trace).encode()))


def test_gpu_metrics_are_recorded_uploaded_and_joined_to_the_summaries(stepscope_dir: Path, ranks: SimulatedRanks, tmp_path: Path,
                                                                      real_traces: dict[int, Path]) -> None:
    # The sidecar sees the node's four GPUs; the pod's ranks compute on its GPUs 2 and 3 (the
    # simulation throttles GPU 3), which they call cuda:0 and cuda:1, as their traces do.
    backend = SimulatedBackend(gpus=4, throttle={3: "thermal"})
    gpus = {0: (0, "sim-0002"), 1: (1, "sim-0003")}
    sidecar = Sidecar(stepscope_dir, KEY, host="127.0.0.1", port=0, pod="pod-a", node="node-a", nvml_backend=backend,
                      poll_interval_s=0.05, upload_attempts=2, upload_base_delay_s=0.05).start()
    try:
        client = SidecarClient(sidecar.url, KEY)
        store = tmp_path / "store"
        trigger(client, "s-g", store, hardwareMetrics={"enabled": True, "intervalMicroseconds": 2000})
        for rank in (0, 1):
            ranks.state("s-g", rank, "capturing", gpu=gpus[rank])
        wait_for(client, "s-g", lambda s: s["phase"] == "Capturing")
        start_us = time.time() * 1e6 + 100_000
        traces = {}
        for rank in (0, 1):
            traces[rank] = tmp_path / f"shifted-{rank}.json.gz"
            _shifted_trace(real_traces[rank], traces[rank], start_us)
        time.sleep(1.4)  # the two real steps last ~1.2 s
        for rank in (0, 1):
            ranks.state("s-g", rank, "done", trace_from=traces[rank], gpu=gpus[rank])
        status = wait_for(client, "s-g", lambda s: s["phase"] == "Succeeded")
    finally:
        sidecar.shutdown(5)
    assert layout.node_metrics("pod-a") in status["artifacts"]
    from stepscope.analysis.loading.gpu_samples import read_metrics

    metrics = read_metrics(store / layout.node_metrics("pod-a"))
    assert set(metrics["gpu"].unique()) == {0.0, 1.0} and len(metrics) > 100
    clocks = {}
    for rank in (0, 1):
        summary = decode_summary((store / layout.rank_summary(rank)).read_bytes())
        assert summary.gpu == rank and summary.hardware and len(summary.hardware["smClockMHzMean"]) == len(summary.steps) == 2
        clocks[rank] = summary.hardware["smClockMHzMean"]
    assert clocks == {0: [1980.0, 1980.0], 1: [1100.0, 1100.0]}


def test_no_gpu_metrics_are_uploaded_when_no_rank_names_its_gpu(stepscope_dir: Path, ranks: SimulatedRanks, tmp_path: Path,
                                                                 real_traces: dict[int, Path]) -> None:
    """The sidecar samples the node's four GPUs (NVIDIA_VISIBLE_DEVICES=all), other tenants'
    among them; ranks that name no GPU get none of them uploaded, and the session says why."""
    backend = SimulatedBackend(gpus=4)
    sidecar = Sidecar(stepscope_dir, KEY, host="127.0.0.1", port=0, pod="pod-c", node="node-a", nvml_backend=backend,
                      poll_interval_s=0.05, upload_attempts=2, upload_base_delay_s=0.05).start()
    try:
        client = SidecarClient(sidecar.url, KEY)
        store = tmp_path / "store"
        trigger(client, "s-c", store, hardwareMetrics={"enabled": True, "intervalMicroseconds": 2000})
        for rank in (0, 1):
            ranks.state("s-c", rank, "capturing")
        wait_for(client, "s-c", lambda s: s["phase"] == "Capturing")
        time.sleep(0.3)
        for rank in (0, 1):
            ranks.state("s-c", rank, "done", trace_from=real_traces[rank])
        status = wait_for(client, "s-c", lambda s: s["phase"] in ("Succeeded", "Failed"))
    finally:
        sidecar.shutdown(5)
    assert status["phase"] == "Succeeded", status
    assert layout.node_metrics("pod-c") not in status["artifacts"] and not (store / layout.node_metrics("pod-c")).exists()
    assert "GPU metrics not uploaded: no rank of this pod named the GPU it computes on" in status["message"]
    assert not list(stepscope_dir.rglob("*gpu-metrics*")), "nothing of the node's GPUs is left on the shared volume either"
    for rank in (0, 1):
        assert not decode_summary((store / layout.rank_summary(rank)).read_bytes()).hardware


def test_uploads_to_s3_with_the_triggers_credentials_which_never_leak(client: SidecarClient, ranks: SimulatedRanks, moto_endpoint: str,
                                                                      s3, real_traces: dict[int, Path], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    s3.create_bucket(Bucket="sidecar-uploads")
    secret = "body-secret-never-shown"
    with Proxy(moto_endpoint.removeprefix("http://")) as proxy:
        body = trigger_body("s-s3", "s3://sidecar-uploads/team/default/run-1a2b3c4d",
                            storage={"uri": "s3://sidecar-uploads/team", "endpoint": proxy.url})
        body["credentials"] = {"accessKeyId": "AKIDFROMTRIGGER", "secretAccessKey": secret, "sessionToken": None}
        accepted = client.put_session("s-s3", body)
        wait_for(client, "s-s3", lambda s: s["workers"]["total"] == 2)
        for rank in (0, 1):
            ranks.state("s-s3", rank, "done", trace_from=real_traces[rank])
        status = wait_for(client, "s-s3", lambda s: s["phase"] in ("Succeeded", "Failed"))
    assert status["phase"] == "Succeeded", status
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="sidecar-uploads")["Contents"])
    assert keys == sorted(f"team/default/run-1a2b3c4d/{k}" for k in status["artifacts"]) and len(keys) == 4
    assert proxy.headers and all("Credential=AKIDFROMTRIGGER/" in h["authorization"] for h in proxy.headers)
    for text in (json.dumps(accepted), json.dumps(status), caplog.text):
        assert secret not in text and "AKIDFROMTRIGGER" not in text


def test_s3_without_the_sessions_credentials_is_refused_whatever_the_pod_may_reach(client: SidecarClient, moto_endpoint: str, s3,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar's own environment (keys, IRSA, the node's role) is never the session's storage
    identity: a trigger without the session's credentials is refused before anything is written."""
    from stepscope.sidecar_client import SidecarError

    s3.create_bucket(Bucket="sidecar-ambient")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSIDECARPOD")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pod-secret")
    body = trigger_body("s-amb", "s3://sidecar-ambient/team/default/run-1a2b3c4d",
                        storage={"uri": "s3://sidecar-ambient/team", "endpoint": moto_endpoint})
    with pytest.raises(SidecarError) as raised:
        client.put_session("s-amb", body)
    assert raised.value.status == 400 and "no credentials for s3:// from spec.storage.credentialsSecret" in raised.value.message
    assert "Contents" not in s3.list_objects_v2(Bucket="sidecar-ambient")


def test_malformed_agent_files_neither_crash_nor_stall_the_sidecar(client: SidecarClient, ranks: SimulatedRanks, stepscope_dir: Path,
                                                                  tmp_path: Path, real_traces: dict[int, Path]) -> None:
    store = tmp_path / "store"
    trigger(client, "s-m", store)
    (stepscope_dir / "s-m").mkdir()
    (stepscope_dir / "s-m" / "rank-0.state.json").write_text('{"version": 1, "session": "s-m", "ra')
    (stepscope_dir / "s-m" / "rank-1.state.json").write_text(json.dumps(
        {"session": "s-m", "rank": 1, "state": "capturing", "localRank": "one", "pid": None, "updatedAt": "soon"}))
    (stepscope_dir / "agents" / "rank-7.json").write_text("[1, 2")
    status = wait_for(client, "s-m", lambda s: s["ranks"][1]["state"] == "capturing")
    assert status["phase"] == "Capturing" and status["workers"]["total"] == 2 and status["ranks"][1]["pid"] == 1001
    for rank in (0, 1):
        ranks.state("s-m", rank, "done", trace_from=real_traces[rank])
    assert wait_for(client, "s-m", lambda s: s["phase"] in ("Succeeded", "Failed"))["phase"] == "Succeeded"


def test_a_truncated_trace_is_uploaded_and_fails_only_its_rank(client: SidecarClient, ranks: SimulatedRanks, tmp_path: Path,
                                                               real_traces: dict[int, Path]) -> None:
    store = tmp_path / "store"
    truncated = tmp_path / "truncated.json.gz"
    truncated.write_bytes(real_traces[1].read_bytes()[:5000])
    trigger(client, "s-t", store)
    ranks.state("s-t", 0, "done", trace_from=real_traces[0])
    ranks.state("s-t", 1, "done", trace_from=truncated)
    status = wait_for(client, "s-t", lambda s: s["phase"] in ("Succeeded", "Failed"))
    assert status["phase"] == "Failed" and status["workers"]["uploaded"] == 2 and status["workers"]["failed"] == 1
    assert "trace not summarised" in status["ranks"][1]["error"] and status["ranks"][0]["error"] is None
    assert "rank 1" in status["message"] and "trace not summarised" in status["message"]
    assert decode_summary((store / layout.rank_summary(1)).read_bytes()).error
    assert (store / layout.rank_trace(1)).read_bytes() == truncated.read_bytes()


def test_a_restarted_sidecar_uploads_what_a_failed_upload_left_behind(sidecar: Sidecar, client: SidecarClient, ranks: SimulatedRanks,
                                                                       stepscope_dir: Path, tmp_path: Path, real_traces: dict[int, Path]) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    trigger(client, "s-r", blocker / "store")
    for rank in (0, 1):
        ranks.state("s-r", rank, "done", trace_from=real_traces[rank])
    assert wait_for(client, "s-r", lambda s: s["phase"] in ("Succeeded", "Failed"))["phase"] == "Failed"
    sidecar.shutdown(5)

    restarted = Sidecar(stepscope_dir, KEY, host="127.0.0.1", port=0, pod="pod-a", node="node-a", poll_interval_s=0.05).start()
    try:
        client = SidecarClient(restarted.url, KEY)
        store = tmp_path / "store"
        # The operator re-sends the same session (idempotent); the ranks' files say they are done.
        client.put_session("s-r", trigger_body("s-r", store.as_uri()))
        status = wait_for(client, "s-r", lambda s: s["phase"] in ("Succeeded", "Failed"))
    finally:
        restarted.shutdown(5)
    assert status["phase"] == "Succeeded", status
    for rank in (0, 1):
        assert (store / layout.rank_trace(rank)).read_bytes() == real_traces[rank].read_bytes()


@pytest.mark.gpu
def test_real_nvml_samples_are_uploaded_for_the_capture_window(stepscope_dir: Path, ranks: SimulatedRanks, tmp_path: Path,
                                                              real_traces: dict[int, Path]) -> None:
    from stepscope.sidecar.nvml import default_backend

    backend = default_backend()
    if backend is None:
        pytest.skip("no NVML or no GPU visible here")
    sidecar = Sidecar(stepscope_dir, KEY, host="127.0.0.1", port=0, pod="pod-gpu", nvml_backend=backend, poll_interval_s=0.05).start()
    try:
        client = SidecarClient(sidecar.url, KEY)
        trigger(client, "s-gpu", tmp_path / "store")
        gpu = (0, backend.devices()[0].uuid)  # both ranks on the first GPU: only its samples are the pod's
        for rank in (0, 1):
            ranks.state("s-gpu", rank, "capturing", gpu=gpu)
        wait_for(client, "s-gpu", lambda s: s["phase"] == "Capturing")
        time.sleep(0.5)
        for rank in (0, 1):
            ranks.state("s-gpu", rank, "done", trace_from=real_traces[rank], gpu=gpu)
        status = wait_for(client, "s-gpu", lambda s: s["phase"] in ("Succeeded", "Failed"))
    finally:
        sidecar.shutdown(5)
    assert layout.node_metrics("pod-gpu") in status["artifacts"], status
    from stepscope.analysis.loading.gpu_samples import read_metrics

    assert len(read_metrics(tmp_path / "store" / layout.node_metrics("pod-gpu"))) > 10
