"""The analysis Job end to end at fleet scale: from its start to its result written in the store.

moto's S3 server runs over HTTP and the in-memory API server of stepscope/testing/kube holds the
ProfileSession; a generator uploads N synthetic rank summaries (stepscope/testing/synthetic_ranks.py,
as the sidecars upload them: ranks/rank-<r>.summary.arrow; rank 5's kernels 1.3x longer). The Job
(stepscope.operator.sessions.analysis_job.run_session_analysis, what `stepscope analyze --session` runs)
then runs in a fresh process with the session's credentials in its environment: it lists and
reads the summaries, diagnoses them, writes the report and its result into the store. Measured:
that process's wall time and peak memory (its VmHWM: ru_maxrss would count this generator's memory,
which a child keeps across exec), the size of the status the operator makes of
the report (diagnosed_status; the CRD's budget is 32 KiB) and the report page's. The same is measured at --reference
ranks in the same run.

    .venv/bin/python benchmarks/analysis_job_scale.py [--ranks 10240] [--reference 1024]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the synthetic ranks and the API server live in tests/

import boto3
import kubernetes
import yaml
from botocore.config import Config
from moto.server import ThreadedMotoServer

from stepscope.analysis.model import RankSummary, encode_summary
from stepscope.contracts import layout
from stepscope.contracts.session import SessionSpec
from stepscope.operator.sessions.record import destination
from stepscope.operator.sessions.status import diagnosed_status
from stepscope.operator.settings import GROUP, PLURAL, VERSION
from stepscope.testing.kube.fixtures import CRD_PATH
from stepscope.testing.kube.server import KubeTestServer
from stepscope.testing.synthetic_ranks import iter_summaries

BUCKET = "fleet"
NAMESPACE = "default"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIDFLEETBENCH", "AWS_SECRET_ACCESS_KEY": "fleet-bench-secret"}
GOAL_S = 60.0
STATUS_BUDGET = 32 * 1024
BUILD_AT_ONCE = 512  # ranks made and uploaded at a time, so the generator's memory stays small


def _session(api: kubernetes.client.ApiClient, name: str, endpoint: str) -> str:
    """Create the ProfileSession; returns its store folder."""
    spec = {
        "selector": {"matchLabels": {"job": name}},
        "capture": {"steps": 4},
        "storage": {
            "uri": f"s3://{BUCKET}/sessions",
            "endpoint": endpoint,
            "region": "us-east-1",
            "credentialsSecret": "s3-credentials",
        },
    }
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProfileSession", "metadata": {"name": name}, "spec": spec}
    made = kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, body
    )
    return destination(SessionSpec.from_dict(spec), NAMESPACE, name, made["metadata"]["uid"])


def _upload(s3, dest: str, ranks: int) -> float:
    """The sidecars' part: every rank's summary into the session's folder, made and uploaded a
    few hundred at a time; returns the seconds taken."""
    prefix = dest.removeprefix(f"s3://{BUCKET}/")
    start = time.perf_counter()

    def put(summary: RankSummary) -> None:
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{layout.rank_summary(summary.rank)}", Body=encode_summary(summary))

    made = iter_summaries(ranks, slow_rank=5, kernel_factor=1.3, seed=7, kernels=300, functions=200)
    with ThreadPoolExecutor(16) as threads:
        while part := list(itertools.islice(made, BUILD_AT_ONCE)):
            list(threads.map(put, part))
    return time.perf_counter() - start


def _job(name: str, kubeconfig: Path) -> tuple[float, float, float, int]:
    """Run the Job in a fresh process: its wall seconds, CPU seconds, peak MB and exit code."""
    env = {**os.environ, **CREDENTIALS, "KUBECONFIG": str(kubeconfig)}
    run = (
        "import sys; from stepscope.operator.sessions.analysis_job import run_session_analysis; "
        f"code = run_session_analysis({NAMESPACE!r}, {name!r}); "
        "print(next(line for line in open('/proc/self/status') if line.startswith('VmHWM:')), file=sys.stderr); "
        "sys.exit(code)"
    )
    with tempfile.TemporaryFile("w+") as errors:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", run], env=env, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        said = errors.read()
        if code:
            print(said[-4000:], file=sys.stderr)
    peaks = [int(line.split()[1]) for line in said.splitlines() if line.startswith("VmHWM:")]
    return wall, usage.ru_utime + usage.ru_stime, (peaks[-1] / 1024 if peaks else float("nan")), code


def _measure(name: str, ranks: int, api: kubernetes.client.ApiClient, s3, endpoint: str, kubeconfig: Path) -> dict:
    dest = _session(api, name, endpoint)
    uploaded = _upload(s3, dest, ranks)
    wall, cpu, peak, code = _job(name, kubeconfig)
    prefix = dest.removeprefix(f"s3://{BUCKET}/")
    session = kubernetes.client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, name
    )
    # The Job leaves its result and report in the store; the status is what the operator makes of them.
    report = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{layout.REPORT_DIAGNOSIS}")["Body"].read())
    status = {
        **(session.get("status") or {}),
        **diagnosed_status(session.get("status") or {}, report["diagnosis"], dest, 1),
    }
    page = s3.head_object(Bucket=BUCKET, Key=f"{prefix}/{layout.REPORT_HTML}")["ContentLength"]
    diagnosis = status.get("diagnosis") or {}
    return {
        "ranks": ranks,
        "upload_s": uploaded,
        "job_s": wall,
        "cpu_s": cpu,
        "peak_mb": peak,
        "exit": code,
        "status_bytes": len(json.dumps(status).encode()),
        "page_bytes": page,
        "slow": [w["rank"] for w in diagnosis.get("slowWorkers") or []],
        "summary": diagnosis.get("summary", ""),
    }


def main() -> int:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=10240)
    parser.add_argument("--reference", type=int, default=1024, help="ranks of the reference measured in the same run")
    args = parser.parse_args()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3 = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        config=Config(max_pool_connections=16),
    )
    s3.create_bucket(Bucket=BUCKET)
    try:
        with KubeTestServer() as server, tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp:
            kubeconfig = server.write_kubeconfig(Path(tmp) / "kubeconfig")
            api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
            kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(
                yaml.safe_load(CRD_PATH.read_text())
            )
            results = [_measure(f"fleet-{n}", n, api, s3, endpoint, kubeconfig) for n in (args.reference, args.ranks)]
    finally:
        moto.stop()
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; generator peak "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB"
    )
    for r in results:
        print(
            f"{r['ranks']:>6,} ranks: Job start to its result written {r['job_s']:6.1f} s ({r['cpu_s']:.1f} s of "
            f"CPU), peak {r['peak_mb']:6,.0f} MB, "
            f"status {r['status_bytes']:,} B, "
            f"report page {r['page_bytes'] / 1024:,.0f} KiB (uploads took {r['upload_s']:.0f} s); slow workers "
            f"{r['slow']}"
        )
    ref, big = results
    print(
        f"ratio {big['ranks'] // ref['ranks']}x the ranks: time {big['job_s'] / ref['job_s']:.2f}x, CPU "
        f"{big['cpu_s'] / ref['cpu_s']:.2f}x, peak memory {big['peak_mb'] / ref['peak_mb']:.2f}x; "
        f"goal {GOAL_S:.0f} s -> {big['job_s'] / GOAL_S:.2f}x, status {big['status_bytes'] / STATUS_BUDGET:.2f}x of "
        "32 KiB"
    )
    print(f"summary: {big['summary']}")
    ok = all(r["exit"] == 0 and r["slow"] == [5] and r["status_bytes"] < STATUS_BUDGET for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
