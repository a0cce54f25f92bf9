"""Fixtures for the operator's tests: the test API server with the CRD, the real operator (kopf)
in a thread, real sidecars on 127.0.0.1 ports, a real 2-rank gloo training, and moto's S3 server
over HTTP as the object store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from stepscope.local.launch import launch_ranks
from stepscope.operator import kube as operator_kube
from stepscope.sidecar.daemon import Sidecar
from stepscope.testing.kube.fixtures import Kube, kube  # noqa: F401 (the kube fixture)
from stepscope.testing.s3 import moto_s3
from tests.operator.harness import BUCKET, KEY, OPERATOR_KEY, OperatorHarness, Pods

CREDENTIALS = {"accessKeyId": "testing-key-id", "secretAccessKey": "testing-secret"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with moto_s3(BUCKET, CREDENTIALS) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real 2-rank gloo training that runs until the module ends; its pod's shared directory."""
    folder = tmp_path_factory.mktemp("pod-a")
    job = launch_ranks(2, folder, ["--steps", "0", "--step-sleep-ms", "40", "--hidden", "64"], log_dir=folder / "logs")
    yield folder
    job.terminate()


@pytest.fixture(scope="module")
def sidecar_a(training: Path) -> Iterator[Sidecar]:
    sidecar = Sidecar(
        training,
        KEY,
        host="127.0.0.1",
        port=0,
        pod="train-a",
        poll_interval_s=0.2,
        upload_attempts=2,
        upload_base_delay_s=0.2,
    ).start()
    yield sidecar
    sidecar.shutdown(grace_s=2)


@pytest.fixture
def idle(tmp_path: Path) -> Iterator[Sidecar]:
    """A sidecar with no training behind it: it accepts a session and waits for ranks until the
    session is cancelled or times out."""
    sidecar = Sidecar(tmp_path / "idle", KEY, host="127.0.0.1", port=0, pod="idle", poll_interval_s=0.2).start()
    yield sidecar
    sidecar.shutdown(grace_s=1)


@pytest.fixture
def cluster(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> Kube:
    """The API server with the CRD, the operator's key in the env, quick operator timings."""
    kube.apply_crd()
    monkeypatch.setenv("STEPSCOPE_HMAC_KEY", OPERATOR_KEY.decode())
    monkeypatch.setenv("STEPSCOPE_SELECTION_GRACE_S", "1.5")
    monkeypatch.setenv("STEPSCOPE_POLL_INTERVAL_S", "0.3")
    monkeypatch.setenv("STEPSCOPE_UNREACHABLE_POLLS", "3")
    monkeypatch.setenv("STEPSCOPE_TRIGGER_ATTEMPTS", "2")
    monkeypatch.setenv("STEPSCOPE_SIDECAR_TIMEOUT_S", "2")
    operator_kube.reset()
    kubernetes.client.CoreV1Api(kube.api_client).create_namespaced_secret(
        "default", {"metadata": {"name": "s3-credentials"}, "stringData": dict(CREDENTIALS)}
    )
    return kube


@pytest.fixture
def operator(cluster: Kube) -> Iterator[OperatorHarness]:
    harness = OperatorHarness(cluster)
    harness.start()
    yield harness
    harness.stop()


@pytest.fixture
def pods(cluster: Kube) -> Pods:
    return Pods(kubernetes.client.CoreV1Api(cluster.api_client))
