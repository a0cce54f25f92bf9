"""Driving the real operator in tests: start/stop kopf, pods the test marks Running (no kubelet
here), ProfileSessions and waiting on their status, and running the analysis Job's command."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
from kopf.testing import KopfRunner

from stepscope.contracts.wire import PORT_NAME as SIDECAR_PORT_NAME
from stepscope.operator import registry
from stepscope.operator.namespace_keys import namespace_key
from stepscope.operator.sessions.lifecycle import SessionRunner, Stopped
from stepscope.operator.settings import GROUP, PLURAL, VERSION
from stepscope.testing.kube.helpers import wait_for

NAMESPACE = "default"
OPERATOR_KEY = b"operator-test-hmac-key-0123456789"
# What the sidecars of NAMESPACE hold: the operator signs with its namespace's key.
KEY = namespace_key(OPERATOR_KEY, NAMESPACE)
BUCKET = "stepscope-test"


class OperatorHarness:
    """The operator as `stepscope operator` runs it (kopf, standalone), in a thread of this process."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube
        self.runner: KopfRunner | None = None
        self.custom = kubernetes.client.CustomObjectsApi(kube.api_client)
        self.batch = kubernetes.client.BatchV1Api(kube.api_client)

    def start(self) -> None:
        self.runner = KopfRunner(["run", "--standalone", "--all-namespaces"], registry=registry.build(), timeout=60)
        self.runner.__enter__()

    def stop(self) -> None:
        """Stop it (kopf cancels the daemons, as on SIGTERM); a no-op when it is not running."""
        if self.runner is not None:
            runner, self.runner = self.runner, None
            runner.__exit__(None, None, None)

    # -- sessions --------------------------------------------------------------------------

    def create_session(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileSession", "metadata": {"name": name}, "spec": spec}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def wait_phase(self, name: str, phases: tuple[str, ...], timeout: float = 30) -> dict[str, Any]:
        return wait_for(
            lambda: (s := self.status(name)).get("phase") in phases and s,
            timeout,
            f"{name} to reach {phases} (now {self.status(name)})",
        )

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)

    def gone(self, name: str) -> bool:
        try:
            self.get(name)
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    def run_analysis_job(self, name: str) -> tuple[int, dict[str, Any]]:
        """Do what a kubelet would: run the Job's container command here (same code path, with the
        env its secretKeyRefs give), then record the Job's outcome in its status."""
        from stepscope.cli import main

        job_name = self.status(name)["analysisJob"]
        job = self.batch.read_namespaced_job(job_name, NAMESPACE).to_dict()
        container = job["spec"]["template"]["spec"]["containers"][0]
        core = kubernetes.client.CoreV1Api(self.kube.api_client)
        env = {}
        for item in container["env"] or []:
            ref = item["value_from"]["secret_key_ref"]
            secret = core.read_namespaced_secret(ref["name"], NAMESPACE)
            data = {
                **{k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()},
                **(secret.string_data or {}),
            }
            env[item["name"]] = data[ref["key"]]
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            assert container["command"][:2] == ["stepscope", "analyze"], container["command"]
            code = main(container["command"][1:])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        condition = {
            "type": "Complete" if code == 0 else "Failed",
            "status": "True",
            "reason": "" if code == 0 else "BackoffLimitExceeded",
            "message": "" if code == 0 else "Job has reached the specified backoff limit",
        }
        status = {"succeeded": 1} if code == 0 else {"failed": 1}
        self.batch.patch_namespaced_job_status(job_name, NAMESPACE, {"status": {**status, "conditions": [condition]}})
        return code, job


class Pods:
    """Pod objects the test moves to Running with a podIP, as a kubelet would."""

    def __init__(self, core: kubernetes.client.CoreV1Api) -> None:
        self.core = core

    def create(
        self, name: str, labels: dict[str, str], port: int | None, ip: str = "127.0.0.1", running: bool = True
    ) -> None:
        sidecar = {"name": "stepscope-sidecar", "image": "stepscope", "restartPolicy": "Always"}
        if port is not None:
            sidecar["ports"] = [{"name": SIDECAR_PORT_NAME, "containerPort": port}]
        body = {
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "initContainers": [sidecar],
                "containers": [{"name": "train", "image": "pytorch"}],
                "nodeName": "node-1",
            },
        }
        self.core.create_namespaced_pod(NAMESPACE, body)
        if running:
            self.core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {"phase": "Running", "podIP": ip}})

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, NAMESPACE)


def stop_before_capturing(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make session daemons stop after writing the pod record but before the Capturing status, as an
    operator killed there would; returns what puts the real transition back (for a restart)."""
    transition = SessionRunner._transition

    async def stop_there(self: SessionRunner, phase: str, *args: Any, **fields: Any) -> None:
        if phase == "Capturing":
            await self.stopped.wait()
            raise Stopped()
        await transition(self, phase, *args, **fields)

    monkeypatch.setattr(SessionRunner, "_transition", stop_there)
    return lambda: monkeypatch.setattr(SessionRunner, "_transition", transition)


def port_of(sidecar: Any) -> int:
    """The port a test's Sidecar listens on (what its pod declares as the `stepscope` port)."""
    return sidecar.server.server_address[1]


def session_spec(selector: dict[str, str], s3_endpoint: str, **overrides: Any) -> dict[str, Any]:
    spec = {
        "selector": {"matchLabels": selector},
        "capture": {"waitSteps": 3, "steps": 2, "activities": ["CPU"]},
        "hardwareMetrics": {"enabled": False},
        "storage": {
            "uri": f"s3://{BUCKET}/sessions",
            "endpoint": s3_endpoint,
            "region": "us-east-1",
            "credentialsSecret": "s3-credentials",
        },
        "timeoutSeconds": 60,
        "hangTimeoutSeconds": 30,
    }
    spec.update(overrides)
    return spec
