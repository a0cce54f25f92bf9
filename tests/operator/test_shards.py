"""Raw traces summarised by a Kubernetes Indexed Job: the shard plan and the deal of ranks, the
real `stepscope analyze --session --shards` in each pod of the Job (run by the Job controller
double of stepscope/testing/kube/job_controller.py, as the chart's analysis ServiceAccount under RBAC, into
moto's S3 over HTTP), a failed shard retried by the Job's own backoffLimitPerIndex, the operator
going from the shard Job to the analysis Job, and a report and diagnosis identical to the
single-process analysis of the same traces."""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import kubernetes
import msgspec
import pytest

from stepscope import analysis
from stepscope.analysis.gathering.shards import shard_of
from stepscope.contracts import layout
from stepscope.contracts.session import SessionSpec
from stepscope.operator.credentials import secret_key_names
from stepscope.operator.sessions import jobs
from stepscope.operator.sessions.record import destination
from stepscope.operator.settings import GROUP, PLURAL, VERSION, OperatorSettings
from stepscope.storage import open_store
from stepscope.testing.kube.fixtures import Kube
from stepscope.testing.kube.helpers import wait_for
from stepscope.testing.kube.job_controller import (
    FAILURE_COUNT_ANNOTATION,
    INDEX_ANNOTATION,
    JobController,
    ProcessKubelet,
)
from tests.chart.conftest import RELEASE_NAMESPACE, apply_rbac, helm, render  # noqa: F401 (helm is a fixture)
from tests.operator.conftest import CREDENTIALS
from tests.operator.harness import BUCKET, NAMESPACE, OperatorHarness, Pods, port_of, session_spec

# Small real traces of different programs, one a rank (the shared folder's; never copied here).
TRACES = (
    "hta__trace_filter_2rank/sampled_rank-0.json.gz",
    "hta__trace_filter_2rank/sampled_rank-1.json.gz",
    "hta__critical_path_alexnet",
    "hta__with_gpu_user_annotation",
    "hta__rank_non_gpu",
    "hta__distributed_info_unavailable",
)
STEPSCOPE = [str(Path(sys.executable).with_name("stepscope"))]
EMPTY = kubernetes.client.V1JobStatus()


@pytest.mark.parametrize(
    ("ranks", "requested", "limit", "plan"),
    [
        (0, 4, 16, None),  # every rank has its summary
        (1, 4, 16, None),  # one rank: the analysis Job alone
        (50, 1, 16, None),  # spec.analysis.parallelism 1: the analysis Job alone
        (6, 4, 16, (4, 4)),  # one shard a pod, when that keeps shards within RANKS_PER_SHARD
        (3, 8, 16, (3, 3)),  # never more shards, or pods, than ranks
        (100, 8, 4, (13, 4)),  # the chart's limit caps the spec's parallelism; shards of at most RANKS_PER_SHARD
        (10_240, 16, 16, (1280, 16)),
    ],
)
def test_the_shard_plan(ranks: int, requested: int, limit: int, plan: tuple[int, int] | None) -> None:
    assert jobs.shard_plan(ranks, requested, limit) == plan
    if plan:
        assert plan[0] * jobs.RANKS_PER_SHARD >= ranks


def test_every_rank_is_dealt_to_one_shard_whatever_has_a_summary() -> None:
    ranks = [0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89]
    shards = [shard_of(ranks, i, 4) for i in range(4)]
    assert sorted(r for s in shards for r in s) == ranks and max(map(len, shards)) - min(map(len, shards)) <= 1
    assert shard_of(reversed(ranks), 2, 4) == shards[2]
    with pytest.raises(ValueError, match="not in 0..3"):
        shard_of(ranks, 4, 4)


def test_the_shard_job_is_indexed_with_a_per_index_backoff() -> None:
    settings = OperatorSettings()
    job = jobs.shard_job(
        "ns", "s1", "0123456789", settings, "store", {"accessKeyId": "AK"}, completions=25, parallelism=4
    )
    assert (
        job["metadata"]["name"]
        == "s1-shards-01234"
        != jobs.job("ns", "s1", "0123456789", settings, "store", {})["metadata"]["name"]
    )
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimitPerIndex"]) == (
        "Indexed",
        25,
        4,
        jobs.SHARD_RETRIES,
    )
    assert "backoffLimit" not in spec and spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["template"]["spec"]["containers"][0]["command"] == [
        "stepscope",
        "analyze",
        "--session",
        "ns/s1",
        "--shards",
        "25",
    ]


@pytest.mark.parametrize(
    ("argv", "index", "said"),
    [
        (["--session", "ns/s1", "--shards", "3"], None, "JOB_COMPLETION_INDEX in 0..N-1"),
        (["--session", "ns/s1", "--shards", "3"], "3", "got '3'"),
        (["--session", "ns/s1", "--shards", "0"], "0", "N >= 1"),
        (["some/folder", "--shards", "3"], "0", "--shards goes with --session"),
    ],
)
def test_a_shard_without_its_index_is_a_usage_error(
    argv: list[str], index: str | None, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stepscope.cli import main

    if index is None:
        monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    else:
        monkeypatch.setenv("JOB_COMPLETION_INDEX", index)
    assert main(["analyze", *argv]) == 2
    assert said in capsys.readouterr().err


# -- against the API server, with the Job controller double ----------------------------------


def _traces(shared: Path) -> list[Path]:
    found = []
    for name in TRACES:
        path = shared / name
        found.append(path if path.is_file() else sorted(path.glob("*.json*"))[0])
    return found


@pytest.fixture
def s3(s3_endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["accessKeyId"],
        aws_secret_access_key=CREDENTIALS["secretAccessKey"],
    )


@pytest.fixture
def analysis_rbac(cluster: Kube, helm: str) -> Kube:
    """The chart's ServiceAccounts and RBAC, the analysis account in NAMESPACE."""
    cluster.create_namespace(RELEASE_NAMESPACE)
    apply_rbac(cluster.api_client, render(helm, f"operator.namespaces={{{NAMESPACE}}}"))
    return cluster


@pytest.fixture
def controller(analysis_rbac: Kube) -> Iterator[tuple[JobController, ProcessKubelet]]:
    kubelet = ProcessKubelet(
        analysis_rbac.api_client, {"stepscope": STEPSCOPE}, analysis_rbac.service_account_kubeconfig
    )
    with JobController(analysis_rbac.api_client, kubelet) as jc:
        yield jc, kubelet


def _session(cluster: Kube, name: str, s3_endpoint: str, **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProfileSession",
        "metadata": {"name": name},
        "spec": session_spec({"app": name}, s3_endpoint, **spec),
    }
    return kubernetes.client.CustomObjectsApi(cluster.api_client).create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, body
    )


def _upload(s3: Any, dest: str, traces: list[Path], ranks: range) -> None:
    prefix = dest.removeprefix(f"s3://{BUCKET}/")
    for rank in ranks:
        trace = traces[rank % len(traces)]
        data = trace.read_bytes() if trace.suffix == ".gz" else gzip.compress(trace.read_bytes())
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{layout.rank_trace(rank)}", Body=data)


def _keys(s3: Any, dest: str) -> set[str]:
    prefix = dest.removeprefix(f"s3://{BUCKET}/") + "/"
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"].removeprefix(prefix) for page in pages for o in page.get("Contents", [])}


def _job(cluster: Kube, name: str) -> Any:
    return kubernetes.client.BatchV1Api(cluster.api_client).read_namespaced_job(name, NAMESPACE)


def _comparable(store_files: dict[str, bytes], source: str) -> dict[str, Any]:
    """The report's files, with what names the run (its source, its time, where it is) taken out."""
    out: dict[str, Any] = {}
    for key, data in store_files.items():
        if key == layout.REPORT_DIAGNOSIS:
            doc = json.loads(data)
            out[key] = {k: v for k, v in doc.items() if k not in ("source", "generatedAt")}
            out[key]["mergedTrace"]["uri"] = (
                out[key]["mergedTrace"]["uri"].replace(source, "<source>").removeprefix("file://")
            )
        elif key == layout.REPORT_HTML:
            out[key] = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "<time>", data.decode().replace(source, "<source>"))
        elif key.endswith(".gz"):
            out[key] = gzip.decompress(data)
        else:
            out[key] = data
    return out


def test_raw_traces_are_summarised_by_shards_the_job_retries_and_the_report_is_the_single_process_one(
    cluster: Kube,
    controller: tuple[JobController, ProcessKubelet],
    s3_endpoint: str,
    s3: Any,
    shared_traces: Path,
    tmp_path: Path,
) -> None:
    jc, kubelet = controller
    created = _session(cluster, "raw", s3_endpoint)
    uid = created["metadata"]["uid"]
    spec = SessionSpec.from_dict(created["spec"])
    dest = destination(spec, NAMESPACE, "raw", uid)
    traces = _traces(shared_traces)
    _upload(s3, dest, traces, range(7))
    kubelet.fail_next = {1: 1}  # shard 1's first pod fails: the Job's backoffLimitPerIndex retries it
    name = jobs.create_shards(
        NAMESPACE,
        "raw",
        uid,
        OperatorSettings(),
        "s3-credentials",
        secret_key_names(CREDENTIALS),
        completions=3,
        parallelism=2,
    )

    wait_for(
        lambda: any(
            c.type == "Complete" and c.status == "True" for c in (_job(cluster, name).status or EMPTY).conditions or []
        ),
        240,
        f"the shard Job to complete ({_job(cluster, name).status}; {kubelet.output})",
    )
    status = _job(cluster, name).status
    assert (status.completed_indexes, status.failed_indexes, status.succeeded, status.failed) == ("0-2", "", 3, 1)
    pods = [(int(p["metadata"]["annotations"][INDEX_ANNOTATION]), p) for p in jc.pods]
    assert sorted(i for i, _ in pods) == [0, 1, 1, 2]
    assert [p["metadata"]["annotations"][FAILURE_COUNT_ANNOTATION] for i, p in pods if i == 1] == ["0", "1"]
    for index, pod in pods:
        assert pod["spec"]["serviceAccountName"] == OperatorSettings().analysis_account
        if kubelet.output[pod["metadata"]["name"]].startswith("failed before"):
            continue
        dealt = shard_of(range(7), index, 3)
        assert (
            f"shard {index} of 3: ranks {','.join(map(str, dealt))}; summarised {','.join(map(str, dealt))}"
            in kubelet.output[pod["metadata"]["name"]]
        )
    assert {layout.rank_summary(r) for r in range(7)} <= _keys(s3, dest)

    # The reduce, as the analysis Job runs it, reads the shards' summaries; the same traces in a
    # folder, summarised by the single-process analysis, give the same diagnosis and report.
    creds = {"accessKeyId": CREDENTIALS["accessKeyId"], "secretAccessKey": CREDENTIALS["secretAccessKey"]}
    assert analysis.unsummarised_ranks(_store(dest, s3_endpoint, creds)) == []
    sharded = analysis.report(
        dest, endpoint=s3_endpoint, region="us-east-1", credentials=creds, progress=False, ambient_credentials=False
    )
    folder = tmp_path / "single"
    for rank in range(7):
        (folder / "ranks").mkdir(parents=True, exist_ok=True)
        trace = traces[rank % len(traces)]
        (folder / layout.rank_trace(rank)).write_bytes(
            trace.read_bytes() if trace.suffix == ".gz" else gzip.compress(trace.read_bytes())
        )
    single = analysis.report(str(folder), progress=False)
    assert msgspec.to_builtins(sharded) == msgspec.to_builtins(single)
    prefix = dest.removeprefix(f"s3://{BUCKET}/") + "/"
    remote = {
        k: s3.get_object(Bucket=BUCKET, Key=prefix + k)["Body"].read()
        for k in _keys(s3, dest)
        if k.startswith("report/")
    }
    local = {str(p.relative_to(folder)): p.read_bytes() for p in (folder / "report").rglob("*") if p.is_file()}
    assert set(remote) == set(local) and layout.REPORT_HTML in local
    assert _comparable(remote, dest) == _comparable(local, str(folder))


def _store(dest: str, endpoint: str, creds: dict[str, str]) -> Any:
    return open_store(dest, endpoint=endpoint, region="us-east-1", credentials=creds, ambient_credentials=False)


@pytest.fixture
def patient(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> Kube:
    """The sidecar's 2 s of the cluster fixture, raised: this machine is shared, and the sidecar
    answers the trigger while the shard Job's processes summarise."""
    monkeypatch.setenv("STEPSCOPE_SIDECAR_TIMEOUT_S", "10")
    return cluster


@pytest.mark.parametrize("given_up", [False, True], ids=["every-shard", "a-shard-given-up"])
def test_a_session_whose_ranks_have_no_summary_runs_the_shard_job_then_the_analysis_job(
    patient: Kube,
    controller: tuple[JobController, ProcessKubelet],
    operator: OperatorHarness,
    sidecar_a: Any,
    s3_endpoint: str,
    s3: Any,
    shared_traces: Path,
    given_up: bool,
) -> None:
    """The real sidecar uploads its two ranks with their summaries; four more ranks arrive as raw
    traces alone (a sidecar that could not summarise them). The operator deals those four to the
    shard Job, then runs the analysis Job over all six. A shard that fails past its
    backoffLimitPerIndex leaves its ranks to the analysis Job, which summarises them itself."""
    cluster = patient
    if given_up:
        controller[1].fail_next = {0: jobs.SHARD_RETRIES + 1}
    Pods(kubernetes.client.CoreV1Api(cluster.api_client)).create("train-a", {"app": "mixed"}, port_of(sidecar_a))
    # 100 steps of 40 ms before the capture: room to upload the raw ranks before it ends.
    created = _session(
        cluster,
        "mixed",
        s3_endpoint,
        analysis={"parallelism": 2},
        capture={"waitSteps": 100, "steps": 2, "activities": ["CPU"]},
    )
    dest = destination(SessionSpec.from_dict(created["spec"]), NAMESPACE, "mixed", created["metadata"]["uid"])
    _upload(s3, dest, _traces(shared_traces), range(2, 6))
    status = operator.wait_phase("mixed", ("Analyzing", "Failed"), timeout=120)
    assert (
        status["phase"] == "Analyzing"
        and status["analysisShardJob"] == "mixed-shards-" + created["metadata"]["uid"][:5]
    ), status
    assert "4 rank(s) have no summary" in status["message"] and "in 2 shard(s), 2 at a time" in status["message"], (
        status["message"]
    )
    wait_for(
        lambda: operator.status("mixed").get("analysisJob"),
        240,
        f"the analysis Job after the shards ({operator.status('mixed')})",
    )
    status = operator.status("mixed")
    left = {2, 4} if given_up else set()  # the raw ranks of shard 0 (ranks 0, 2, 4; 0 is the sidecar's)
    if given_up:
        assert (
            status["message"].startswith(f"shard Job {status['analysisShardJob']} gave up on shards 0 (")
            and "FailedIndexes" in status["message"]
        )
        assert "the analysis Job summarises the ranks left itself" in status["message"], status["message"]
    else:
        assert status["message"].startswith(f"shard Job {status['analysisShardJob']} summarised every shard"), status[
            "message"
        ]
    summaries = {r for r in range(6) if layout.rank_summary(r) in _keys(s3, dest)}
    assert summaries == set(range(6)) - left
    code, _ = operator.run_analysis_job("mixed")
    assert code == 0
    final = operator.wait_phase("mixed", ("Succeeded", "Failed"), timeout=60)
    assert final["phase"] == "Succeeded", final
    report = json.loads(
        s3.get_object(Bucket=BUCKET, Key=dest.removeprefix(f"s3://{BUCKET}/") + "/" + layout.REPORT_DIAGNOSIS)[
            "Body"
        ].read()
    )
    assert report["ranks"]["total"] == 6 and report["ranks"]["failed"] == [], report["ranks"]
