"""A real cluster for end-to-end tests, only when STEPSCOPE_E2E_KUBECONFIG is set.

The cluster must have the chart installed (helm install stepscope helm/stepscope). Further env:
STEPSCOPE_E2E_STORAGE_URI (s3://bucket/prefix the cluster can write), STEPSCOPE_E2E_STORAGE_ENDPOINT
and STEPSCOPE_E2E_STORAGE_REGION (optional), STEPSCOPE_E2E_CREDENTIALS_SECRET (a Secret with
accessKeyId/secretAccessKey in STEPSCOPE_E2E_NAMESPACE, default "default"), and
STEPSCOPE_E2E_TRAINING_IMAGE (an image with torch and stepscope, which runs stepscope.workload)."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import kubernetes
import pytest


@dataclass
class Cluster:
    api_client: kubernetes.client.ApiClient
    namespace: str
    storage: dict[str, str]
    training_image: str
    run_id: str


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    kubeconfig = os.environ.get("STEPSCOPE_E2E_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("STEPSCOPE_E2E_KUBECONFIG is not set: end-to-end tests need a real cluster with the chart installed")
    missing = [v for v in ("STEPSCOPE_E2E_STORAGE_URI", "STEPSCOPE_E2E_TRAINING_IMAGE") if not os.environ.get(v)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not set (see tests/e2e/conftest.py)")
    storage = {"uri": os.environ["STEPSCOPE_E2E_STORAGE_URI"]}
    for key, env in (("endpoint", "STEPSCOPE_E2E_STORAGE_ENDPOINT"), ("region", "STEPSCOPE_E2E_STORAGE_REGION"), ("credentialsSecret", "STEPSCOPE_E2E_CREDENTIALS_SECRET")):
        if os.environ.get(env):
            storage[key] = os.environ[env]
    api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    yield Cluster(api_client, os.environ.get("STEPSCOPE_E2E_NAMESPACE", "default"), storage, os.environ["STEPSCOPE_E2E_TRAINING_IMAGE"], uuid.uuid4().hex[:6])
    api_client.close()
