"""A test double of the Job controller for Indexed Jobs, with a kubelet stand-in that runs each
pod's container command as a local process. It talks to the API server (stepscope/testing/kube, or any) only
through the API, as kube-controller-manager does.

What it does, as the real controller does it (kubernetes.io/docs/concepts/workloads/controllers/job,
"Completion mode", "Backoff limit per index", "Job termination and cleanup"):
- for a Job with `completionMode: Indexed`, indexes 0..completions-1, at most `parallelism` pods
  at once, lowest pending index first;
- each pod is created through the API, owned by the Job (controller reference), labelled
  `batch.kubernetes.io/job-name`, `job-name`, `batch.kubernetes.io/controller-uid` and
  `batch.kubernetes.io/job-completion-index`, annotated `batch.kubernetes.io/job-completion-index`
  and (with backoffLimitPerIndex) `batch.kubernetes.io/job-index-failure-count`, named
  `<job>-<index>-<suffix>`, and every container gets `JOB_COMPLETION_INDEX` from that annotation
  (a fieldRef, resolved by the kubelet stand-in);
- a failed pod's index is retried by a new pod: with `backoffLimitPerIndex`, until that index failed
  more than that many times (then it is in `status.failedIndexes` and the other indexes still run);
  without it, until the Job's failures exceed `backoffLimit` (default 6), which fails the Job
  (`BackoffLimitExceeded`) and starts nothing more;
- `status.active`, `succeeded`, `failed`, `completedIndexes` and `failedIndexes` in the interval
  form ("1,3-5"), and at the end the conditions `SuccessCriteriaMet` + `Complete`, or
  `FailureTarget` + `Failed` with reason `FailedIndexes` or `BackoffLimitExceeded` (1.31+).

What it does NOT do: NonIndexed Jobs; the exponential delay before a retry (10 s, doubling, up to
6 min: here a failed index is retried at the next tick); `podFailurePolicy`, `successPolicy`,
`maxFailedIndexes`, `activeDeadlineSeconds`, `suspend`, `podReplacementPolicy`,
`ttlSecondsAfterFinished`, `startTime`/`completionTime`, finalizer-based pod tracking
(`uncountedTerminatedPods`); the pod name's random suffix (a counter here); scheduling, images,
resource requests and limits, Pod Security at run time (the kubelet stand-in runs the command on
this machine as this user, with the container's env, its secretKeyRefs and fieldRefs resolved and
the token of the pod's ServiceAccount as its kubeconfig); pods are not deleted when the Job is,
and a Job deleted while its pods run has their outcome dropped.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes

log = logging.getLogger(__name__)
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
FAILURE_COUNT_ANNOTATION = "batch.kubernetes.io/job-index-failure-count"
DEFAULT_BACKOFF_LIMIT = 6


def intervals(indexes: Iterable[int]) -> str:
    """Indexes in the Job status' interval form: "0-2,5"."""
    spans: list[list[int]] = []
    for i in sorted(set(indexes)):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


@dataclass
class _JobRun:
    pending: list[int]
    running: set[int] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    failed_indexes: set[int] = field(default_factory=set)
    failures: dict[int, int] = field(default_factory=dict)
    succeeded_pods: int = 0
    failed_pods: int = 0
    finished: bool = False


# What runs a pod: (the Pod as created, a dict in the API's camelCase) -> its container's exit code.
Kubelet = Callable[[dict[str, Any]], int]


class JobController:
    def __init__(self, api_client: kubernetes.client.ApiClient, kubelet: Kubelet, interval_s: float = 0.1) -> None:
        self.batch = kubernetes.client.BatchV1Api(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.kubelet = kubelet
        self.interval_s = interval_s
        self.runs: dict[str, _JobRun] = {}  # by Job uid
        self.pods: list[dict[str, Any]] = []  # every pod created, in order
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="job-controller")
        self._workers: list[threading.Thread] = []
        self._counter = 0

    def __enter__(self) -> JobController:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for worker in self._workers:
            worker.join(60)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                listed = self.batch.list_job_for_all_namespaces(_preload_content=False)
                for job in json.loads(listed.data)["items"]:
                    self._sync(job)
            except Exception:  # a double's tick that failed is retried at the next one, as a controller's sync
                log.exception("job controller tick failed")

    def _sync(self, job: dict[str, Any]) -> None:
        spec, uid = job["spec"], job["metadata"]["uid"]
        if spec.get("completionMode") != "Indexed":
            return
        with self._lock:
            run = self.runs.setdefault(uid, _JobRun(pending=list(range(spec["completions"]))))
            if run.finished:
                return
            while run.pending and len(run.running) < (spec.get("parallelism") or 1):
                index = run.pending.pop(0)
                run.running.add(index)
                pod = self._pod(job, index, run.failures.get(index, 0))
                worker = threading.Thread(target=self._run, args=(job, pod, index), daemon=True)
                self._workers.append(worker)
                worker.start()
        self._write_status(job, run)

    def _pod(self, job: dict[str, Any], index: int, failures: int) -> dict[str, Any]:
        meta, spec = job["metadata"], job["spec"]
        template = spec["template"]
        self._counter += 1
        labels = {
            **(template.get("metadata") or {}).get("labels", {}),
            "batch.kubernetes.io/job-name": meta["name"],
            "job-name": meta["name"],
            "batch.kubernetes.io/controller-uid": meta["uid"],
            INDEX_ANNOTATION: str(index),
        }
        annotations = {INDEX_ANNOTATION: str(index)}
        if spec.get("backoffLimitPerIndex") is not None:
            annotations[FAILURE_COUNT_ANNOTATION] = str(failures)
        pod_spec = copy.deepcopy(template["spec"])
        for container in pod_spec["containers"]:
            container["env"] = [
                *(container.get("env") or []),
                {
                    "name": "JOB_COMPLETION_INDEX",
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}},
                },
            ]
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        body = {
            "metadata": {
                "name": f"{meta['name']}-{index}-{self._counter:05d}",
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [owner],
            },
            "spec": pod_spec,
        }
        created = self.core.create_namespaced_pod(meta["namespace"], body)
        pod = self.core.api_client.sanitize_for_serialization(created)
        self.pods.append(pod)
        return pod

    def _run(self, job: dict[str, Any], pod: dict[str, Any], index: int) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running"}})
        try:
            code = self.kubelet(pod)
        except Exception:  # a pod the stand-in could not run fails, as one the kubelet cannot start
            log.exception("pod %s/%s could not run", namespace, name)
            code = 128
        self.core.patch_namespaced_pod_status(
            name, namespace, {"status": {"phase": "Succeeded" if code == 0 else "Failed"}}
        )
        spec = job["spec"]
        with self._lock:
            run = self.runs[job["metadata"]["uid"]]
            run.running.discard(index)
            if code == 0:
                run.succeeded_pods += 1
                run.completed.add(index)
                return
            run.failed_pods += 1
            run.failures[index] = run.failures.get(index, 0) + 1
            per_index = spec.get("backoffLimitPerIndex")
            if per_index is not None and run.failures[index] > per_index:
                run.failed_indexes.add(index)
            elif per_index is None and run.failed_pods > (
                spec.get("backoffLimit") if spec.get("backoffLimit") is not None else DEFAULT_BACKOFF_LIMIT
            ):
                run.pending.clear()
            else:
                run.pending.insert(0, index)

    def _write_status(self, job: dict[str, Any], run: _JobRun) -> None:
        with self._lock:
            spec = job["spec"]
            status: dict[str, Any] = {
                "active": len(run.running),
                "succeeded": run.succeeded_pods,
                "failed": run.failed_pods,
                "completedIndexes": intervals(run.completed),
            }
            if spec.get("backoffLimitPerIndex") is not None:
                status["failedIndexes"] = intervals(run.failed_indexes)
            done = len(run.completed) + len(run.failed_indexes) == spec["completions"]
            gave_up = not run.pending and not run.running and not done
            if (done or gave_up) and not run.running:
                run.finished = True
                if run.failed_indexes or gave_up:
                    reason = "FailedIndexes" if run.failed_indexes else "BackoffLimitExceeded"
                    message = (
                        "Job has failed indexes"
                        if run.failed_indexes
                        else "Job has reached the specified backoff limit"
                    )
                    status["conditions"] = [
                        {"type": t, "status": "True", "reason": reason, "message": message}
                        for t in ("FailureTarget", "Failed")
                    ]
                else:
                    status["conditions"] = [
                        {
                            "type": t,
                            "status": "True",
                            "reason": "CompletionsReached",
                            "message": "Reached expected number of succeeded pods",
                        }
                        for t in ("SuccessCriteriaMet", "Complete")
                    ]
        meta = job["metadata"]
        try:
            self.batch.patch_namespaced_job_status(meta["name"], meta["namespace"], {"status": status})
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise


class ProcessKubelet:
    """Runs a pod's first container command here: `commands` maps its first word to what to run
    (e.g. "stepscope" -> [.venv/bin/stepscope]); env from the container (values, secretKeyRefs
    read from the API, fieldRefs of the pod's annotations), and the pod's ServiceAccount token
    as KUBECONFIG (`kubeconfig_for(namespace, account) -> path`). Output is kept by pod name."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        commands: dict[str, list[str]],
        kubeconfig_for: Callable[[str, str], Path],
        timeout_s: float = 300,
    ) -> None:
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.commands, self.kubeconfig_for, self.timeout_s = commands, kubeconfig_for, timeout_s
        self.output: dict[str, str] = {}
        self.fail_next: dict[int, int] = {}  # completion index -> how many of its next pods exit 1 before running

    def __call__(self, pod: dict[str, Any]) -> int:
        meta, spec = pod["metadata"], pod["spec"]
        index = int(meta["annotations"][INDEX_ANNOTATION])
        if self.fail_next.get(index):
            self.fail_next[index] -= 1
            self.output[meta["name"]] = "failed before its command ran (the test's injected failure)"
            return 1
        container = spec["containers"][0]
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/tmp"),
            "KUBECONFIG": str(self.kubeconfig_for(meta["namespace"], spec.get("serviceAccountName") or "default")),
        }
        for item in container.get("env") or []:
            env[item["name"]] = self._value(meta, item)
        command = [*self.commands.get(container["command"][0], container["command"][:1]), *container["command"][1:]]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        self.output[meta["name"]] = result.stdout + result.stderr
        return result.returncode

    def _value(self, meta: dict[str, Any], item: dict[str, Any]) -> str:
        if "value" in item:
            return str(item["value"])
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            key = path.removeprefix("metadata.annotations['").removesuffix("']")
            return str(meta["annotations"][key])
        ref = source["secretKeyRef"]
        secret = self.core.read_namespaced_secret(ref["name"], meta["namespace"])
        return base64.b64decode(secret.data[ref["key"]]).decode()
