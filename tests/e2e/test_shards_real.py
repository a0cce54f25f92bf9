"""The shard Job on a real API server: a session whose ranks arrive partly without a summary is
given an Indexed Job by the operator (as the chart's ServiceAccount, through the real RBAC and the
chart's ValidatingAdmissionPolicy), the real server keeps its Indexed fields, and each completion
index's command, run here as the chart's analysis ServiceAccount (no kubelet runs pods), summarises
its shard into the store."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import boto3
import kubernetes

from stepscope.analysis.gathering.shards import shard_of
from stepscope.contracts import layout
from stepscope.contracts.session import SessionSpec
from stepscope.operator.sessions.record import destination
from stepscope.sidecar.daemon import Sidecar
from stepscope.testing.kube.helpers import wait_for
from tests.e2e.conftest import Cluster, running_pod, session_body
from tests.operator.conftest import CREDENTIALS
from tests.operator.harness import BUCKET, port_of
from tests.operator.test_shards import TRACES

GROUP, VERSION, PLURAL = "stepscope.io", "v1alpha1", "profilesessions"


def test_the_operator_runs_an_indexed_shard_job_that_summarises_each_shard(
    cluster: Cluster, operator: None, sidecar_a: Sidecar, shared_traces: Path
) -> None:
    running_pod(cluster, "train-raw", {"e2e": "raw"}, port_of(sidecar_a))
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client)
    created = custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        cluster.namespace,
        PLURAL,
        session_body(cluster, "raw", {"e2e": "raw"}, analysis={"parallelism": 2}),
    )
    dest = destination(SessionSpec.from_dict(created["spec"]), cluster.namespace, "raw", created["metadata"]["uid"])
    s3 = boto3.client(
        "s3",
        endpoint_url=cluster.s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["accessKeyId"],
        aws_secret_access_key=CREDENTIALS["secretAccessKey"],
    )
    prefix = dest.removeprefix(f"s3://{BUCKET}/")
    for rank, name in zip(range(2, 6), TRACES, strict=False):
        path = shared_traces / name
        trace = path if path.is_file() else sorted(path.glob("*.json*"))[0]
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{layout.rank_trace(rank)}", Body=trace.read_bytes())

    status = wait_for(
        lambda: (
            (
                s := (
                    custom.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "raw").get("status")
                    or {}
                )
            ).get("phase")
            in ("Analyzing", "Failed")
            and s
        ),
        120,
        "the session to reach Analyzing",
    )
    assert status["phase"] == "Analyzing" and status.get("analysisShardJob"), status
    job = kubernetes.client.BatchV1Api(cluster.api_client).read_namespaced_job(
        status["analysisShardJob"], cluster.namespace
    )
    assert (job.spec.completion_mode, job.spec.completions, job.spec.parallelism, job.spec.backoff_limit_per_index) == (
        "Indexed",
        2,
        2,
        2,
    )
    assert job.spec.template.spec.service_account_name == cluster.analysis_account

    core = kubernetes.client.CoreV1Api(cluster.api_client)
    env = {**os.environ, "KUBECONFIG": str(cluster.token_kubeconfig(cluster.namespace, cluster.analysis_account))}
    container = job.spec.template.spec.containers[0]
    for item in container.env or []:
        ref = item.value_from.secret_key_ref
        env[item.name] = base64.b64decode(
            core.read_namespaced_secret(ref.name, cluster.namespace).data[ref.key]
        ).decode()
    assert container.command[:2] == ["stepscope", "analyze"]
    for index in range(job.spec.completions):
        result = subprocess.run(
            [sys.executable, "-m", "stepscope.cli", *container.command[1:]],
            env={**env, "JOB_COMPLETION_INDEX": str(index)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        dealt = shard_of(range(6), index, 2)
        assert f"ranks {','.join(map(str, dealt))}" in result.stdout, result.stdout
    keys = {
        o["Key"].removeprefix(prefix + "/")
        for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
    }
    assert {layout.rank_summary(r) for r in range(6)} <= keys
