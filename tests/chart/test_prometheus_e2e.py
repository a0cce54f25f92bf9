"""The chart's PodMonitor relabeling and PrometheusRule in a real Prometheus (the `prometheus`
binary, started here on 127.0.0.1) that scrapes a real sidecar every second, in front of two real
gloo ranks of workload.py started the zero-code way. The rules are rendered by the real helm with
their windows scaled down through the chart's values (scrape 1 s, sustainedSeconds 5 s, a
15-second baseline); the scrape configuration is the one the Prometheus Operator generates for the
PodMonitor (pkg/prometheus/promcfg.go: its namespace, pod and default job relabelings, then the
endpoint's), with file-based discovery standing in for the Kubernetes API: each target carries the
`__meta_kubernetes_*` labels Kubernetes discovery gives a pod.

One rank slows down 1.6x after a baseline: the slowdown must fire within sustainedSeconds + two
scrapes + two evaluations of the slow steps' start. Then both ranks restart in place (exec: the
same pids, as a restarted container's processes get): their series must start over."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest
import yaml

from stepscope.contracts import wire
from stepscope.local.launch import free_port, launch_ranks
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar.telemetry import Ring, read_ring
from stepscope.testing.polling import wait_for
from tests.chart.conftest import render_templates
from tests.chart.promtool import binary, write_rules
from tests.sidecar.test_telemetry_endpoint import metrics

SCRAPE_S, SUSTAINED_S = 1, 5
BUDGET_S = SUSTAINED_S + 2 * SCRAPE_S + 2 * SCRAPE_S  # evaluations every scrape interval
VALUES = {"enabled": True, "scrapeInterval": f"{SCRAPE_S}s",
          "conditions": {"stepTime": {"factor": 1.5, "baselineMinutes": 0.25, "sustainedSeconds": SUSTAINED_S},
                         "rankDivergence": {"factor": 1.5, "sustainedSeconds": SUSTAINED_S}, "hang": {"noStepSeconds": 60}}}
# ~100 ms steps, nearly all of them sleep (steady under load); from step 200 rank 1 sleeps 65 ms
# more a step, which the all-reduce passes on to rank 0: the job's steps take ~1.6x as long.
SLOW_FROM, RESTART_AT = 200, 330
WORKLOAD = ["--steps", "0", "--hidden", "16", "--batch-size", "8", "--step-sleep-ms", "100", "--slow-rank", "1", "--fault", "sleep",
            "--slow-ms", "65", "--slow-from-step", str(SLOW_FROM), "--restart-at-step", str(RESTART_AT)]

# Pods as Kubernetes discovery describes them: (labels, the `job` they must get).
PYTORCHJOB_POD = ({"__meta_kubernetes_namespace": "train", "__meta_kubernetes_pod_name": "resnet-ddp-worker-0",
                   "__meta_kubernetes_pod_label_training_kubeflow_org_job_name": "resnet-ddp",
                   "__meta_kubernetes_pod_label_training_kubeflow_org_replica_type": "worker",
                   "__meta_kubernetes_pod_controller_kind": "PyTorchJob", "__meta_kubernetes_pod_controller_name": "resnet-ddp"}, "resnet-ddp")
OTHER_PODS = [
    ({"__meta_kubernetes_pod_name": "bench-x7k2p", "__meta_kubernetes_pod_label_batch_kubernetes_io_job_name": "bench",
      "__meta_kubernetes_pod_controller_kind": "Job", "__meta_kubernetes_pod_controller_name": "bench"}, "bench"),
    ({"__meta_kubernetes_pod_name": "llm-workers-0-1-abcde", "__meta_kubernetes_pod_label_jobset_sigs_k8s_io_jobset_name": "llm",
      "__meta_kubernetes_pod_label_batch_kubernetes_io_job_name": "llm-workers-0",
      "__meta_kubernetes_pod_controller_kind": "Job", "__meta_kubernetes_pod_controller_name": "llm-workers-0"}, "llm"),
    ({"__meta_kubernetes_pod_name": "trainer-1", "__meta_kubernetes_pod_label_apps_kubernetes_io_pod_index": "1",
      "__meta_kubernetes_pod_controller_kind": "StatefulSet", "__meta_kubernetes_pod_controller_name": "trainer"}, "trainer"),
    ({"__meta_kubernetes_pod_name": "exp-3-rank-0", "__meta_kubernetes_pod_label_stepscope_io_job": "exp-3",
      "__meta_kubernetes_pod_label_batch_kubernetes_io_job_name": "exp-3-rank-0"}, "exp-3"),
    ({"__meta_kubernetes_pod_name": "scratch"}, "scratch"),
]


def scrape_config(name: str, relabelings: list[dict[str, Any]], targets: Path) -> dict[str, Any]:
    """The scrape job the Prometheus Operator writes for the PodMonitor's endpoint (its own
    relabelings first, the endpoint's after), targets from `targets` instead of the API."""
    own = [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
           {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
           {"target_label": "job", "replacement": f"stepscope/{name}"}]
    # The operator's field names, in Prometheus' spelling.
    spelling = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    chart = [{spelling.get(k, k): v for k, v in r.items()} for r in relabelings]
    return {"job_name": f"podMonitor/stepscope/{name}/0", "metrics_path": "/metrics", "honor_labels": False,
            "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}], "relabel_configs": own + chart}


class Prometheus:
    def __init__(self, folder: Path, sidecar_address: str) -> None:
        docs = render_templates("prometheus.yaml", namespace="stepscope", prometheus=VALUES)
        kinds = {d["kind"]: d for d in docs}
        rules = write_rules(folder, kinds["PrometheusRule"]["spec"]["groups"])
        self.summary = {r["alert"]: r["annotations"]["summary"] for r in kinds["PrometheusRule"]["spec"]["groups"][0]["rules"] if "alert" in r}
        monitor = kinds["PodMonitor"]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["interval"] == f"{SCRAPE_S}s"
        training = folder / "training.json"
        training.write_text(json.dumps([{"targets": [sidecar_address], "labels": PYTORCHJOB_POD[0]}]))
        # The other pods' sidecars are not there (a closed port): only their labels are looked at.
        others = folder / "others.json"
        closed = f"127.0.0.1:{free_port()}"
        others.write_text(json.dumps([{"targets": [closed], "labels": {"__meta_kubernetes_namespace": "train", **labels}}
                                      for labels, _ in OTHER_PODS]))
        config = {"global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
                  "rule_files": [str(rules)],
                  "scrape_configs": [scrape_config(monitor["metadata"]["name"], endpoint["relabelings"], training),
                                     scrape_config("others", endpoint["relabelings"], others)]}
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(folder / "prometheus.log", "wb")
        self.process = subprocess.Popen([binary("prometheus"), f"--config.file={folder / 'prometheus.yml'}",
                                         f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address={self.url[len('http://'):]}",
                                         "--log.level=warn"], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._ready, 30, "Prometheus ready")

    def _ready(self) -> bool:
        assert self.process.poll() is None, (Path(self.log.name)).read_text()
        try:
            with urlopen(self.url + "/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def api(self, path: str, **query: str) -> Any:
        with urlopen(f"{self.url}/api/v1/{path}?{urlencode(query)}", timeout=5) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def firing(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"]

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def rings_now(run_dir: Path) -> dict[int, Ring]:
    """Each rank's step ring as the sidecar reads it."""
    found = {rank: read_ring(run_dir / wire.TELEMETRY_FOLDER / wire.telemetry_file(rank)) for rank in (0, 1)}
    assert None not in found.values(), found
    return {rank: r for rank, r in found.items() if r is not None}


@pytest.fixture()
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    running = Sidecar(tmp_path / "run", b"e2e-key-0123456789abcdef0123456789", host="127.0.0.1", port=0, pod="resnet-ddp-worker-0",
                      node="node-a", poll_interval_s=0.05, stale_after_s=2.0).start()
    yield running
    running.shutdown(5)


@pytest.mark.slow
def test_a_real_prometheus_fires_the_slowdown_in_time_and_sees_a_restart_with_the_same_pids(tmp_path: Path, sidecar: Sidecar) -> None:
    binary("prometheus")
    run_dir = tmp_path / "run"
    prometheus = Prometheus(tmp_path, sidecar.url[len("http://"):])
    job = launch_ranks(2, run_dir, WORKLOAD, log_dir=tmp_path / "logs")
    try:
        # The PodMonitor's relabeling names each pod's job (Prometheus' own view of its targets).
        def jobs() -> dict[str, str] | None:
            active = {t["labels"]["pod"]: t["labels"]["job"] for t in prometheus.api("targets", state="active")["activeTargets"]}
            return active if len(active) == 1 + len(OTHER_PODS) else None

        named = wait_for(jobs, 30, "every target discovered")
        assert named == {labels["__meta_kubernetes_pod_name"]: job_name for labels, job_name in [PYTORCHJOB_POD, *OTHER_PODS]}

        slow = wait_for(lambda: prometheus.firing("StepscopeStepTimeSlowdown"), 60, "the slowdown firing")
        seen = time.time()
        rings = rings_now(run_dir)
        ring = rings[0]
        by_step = {step: (end, seconds) for step, end, seconds in ring.steps}
        # Step SLOW_FROM + 1 (1-based) is the first slow one: it starts when step SLOW_FROM ends.
        onset = by_step[SLOW_FROM][0] + ring.clock_offset
        before = [by_step[s][1] for s in range(SLOW_FROM - 50, SLOW_FROM + 1)]
        after = [by_step[s][1] for s in range(SLOW_FROM + 1, max(by_step) + 1)]
        factor = (sum(after) / len(after)) / (sum(before) / len(before))
        delay = seen - onset
        print(f"slowdown {factor:.2f}x, seen firing {delay:.1f} s after its first slow step started (budget {BUDGET_S} s)")
        assert factor > 1.5, f"the workload slowed only {factor:.2f}x (a loaded machine?)"
        assert SUSTAINED_S <= delay <= BUDGET_S, f"fired {delay:.1f} s after the slowdown started; budget {BUDGET_S} s"
        (alert,) = slow
        assert alert["labels"]["job"] == "resnet-ddp" and alert["labels"]["stepscope_namespace"] == "train"
        assert re.fullmatch(r"job resnet-ddp: step time 0\.\d{3} s, over 1\.5x its baseline 0\.\d{3} s for 5 s",
                            alert["annotations"]["summary"]), alert["annotations"]["summary"]

        # Both ranks restart in place after step RESTART_AT: the same pids, new runs.
        def new_runs() -> dict[int, Ring] | None:
            fresh = {rank: r for rank, r in rings_now(run_dir).items() if r.run != rings[rank].run}
            return fresh if len(fresh) == 2 else None

        fresh = wait_for(new_runs, 60, f"both ranks restarted after step {RESTART_AT}")
        assert {rank: r.pid for rank, r in fresh.items()} == {rank: r.pid for rank, r in rings.items()}

        def started_over() -> dict[str, dict[tuple[str, ...], float]] | None:
            samples = metrics(sidecar)
            total, since = samples.get("stepscope_steps_total", {}), samples.get("stepscope_seconds_since_last_step", {})
            back = len(total) == len(since) == 2 and all(0 < n < RESTART_AT for n in total.values())
            return samples if back and all(s < 2 for s in since.values()) else None

        wait_for(started_over, 30, "both ranks' series started over: fewer steps than before the restart, the latest just now")
        # Prometheus sees each rank's counter go back (a reset), not a rank that stopped.
        resets = wait_for(lambda: prometheus.api("query", query='resets(stepscope_steps_total{job="resnet-ddp"}[2m]) > 0')["result"], 10,
                          "Prometheus seeing the counters reset")
        assert sorted(r["metric"]["rank"] for r in resets) == ["0", "1"]
    finally:
        job.terminate()
        prometheus.close()
