"""Small builders and waits shared by the tests that use the test API server."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client import ApiException

from stepscope.testing.polling import wait_for  # noqa: F401 (imported from here by the tests)

GROUP, VERSION, PLURAL = "stepscope.io", "v1alpha1", "profilesessions"


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "train", "image": "trainer:1"}], **spec}}


def session(name: str, **spec: Any) -> dict[str, Any]:
    """A ProfileSession with a valid minimal spec, overridden by `spec`."""
    body = {"selector": {"matchLabels": {"app": "trainer"}}, "storage": {"uri": "s3://bucket/prefix", "credentialsSecret": "store-credentials"}}
    body.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileSession", "metadata": {"name": name}, "spec": body}


def job(name: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "ownerReferences": owners},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "analyze", "image": "stepscope:1"}]}}}}


def owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def refused(call: Callable[[], Any], code: int) -> dict[str, Any]:
    """Call, expect the API server to answer `code`, return its Status object."""
    with pytest.raises(ApiException) as e:
        call()
    assert e.value.status == code, e.value.body
    return json.loads(e.value.body)
