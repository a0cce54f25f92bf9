"""The chart's optional Prometheus Operator objects (values.prometheus), rendered by the real helm.

Their fields are checked against the Prometheus Operator's CRD schemas as the API server applies
them (stepscope.testing.kube.schema: no field pruned as unknown, every value valid): PodMonitor and
PrometheusRule are monitoring.coreos.com/v1, AlertmanagerConfig monitoring.coreos.com/v1alpha1
(https://prometheus-operator.dev/docs/api-reference/api/); an AlertmanagerConfig's child routes,
which the API server keeps as they come, against the Route schema the operator applies to them.
prometheus_operator_schemas.json holds
the part of those schemas the chart uses, taken from prometheus-operator v0.93.0's
example/prometheus-operator-crd/monitoring.coreos.com_{podmonitors,prometheusrules,alertmanagerconfigs}.yaml
(commit 6adcebc5); a field the chart adds that is not in it fails here as unknown, and the whole
CRDs accepted every object when the file was taken (PodMetricsEndpoint's relabelings and Rule's
record from the same files). What it does not check: the CRDs' CEL rules (none on the fields
used). The PromQL is checked by the real promtool and Prometheus: test_prometheus_rules.py and
test_prometheus_e2e.py."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from stepscope import detection
from stepscope.contracts.wire import PORT_NAME
from stepscope.operator.settings import INJECT_LABEL
from stepscope.testing.kube.schema import prune, validate_value
from tests.chart.conftest import RELEASE_NAMESPACE, Failed, render_templates

SCHEMAS = json.loads((Path(__file__).parent / "prometheus_operator_schemas.json").read_text())
ON = {"prometheus": {"enabled": True}}


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def test_off_by_default() -> None:
    assert render_templates("prometheus.yaml") == []


def test_each_object_is_valid_against_the_prometheus_operator_schema() -> None:
    docs = render_templates("prometheus.yaml", **ON)
    assert sorted(d["kind"] for d in docs) == ["AlertmanagerConfig", "PodMonitor", "PrometheusRule"]
    for doc in docs:
        schema = SCHEMAS[f"{doc['apiVersion']}/{doc['kind']}"]
        assert validate_value(doc, schema, root=True) == [], doc["kind"]
        assert prune(doc, schema, root=True) == doc, f"{doc['kind']}: fields the CRD does not know"


def test_the_pod_monitor_scrapes_the_sidecars_of_the_operators_namespaces() -> None:
    monitor = _by_kind(render_templates("prometheus.yaml", operator={"namespaces": ["team-a", "team-b"]}, **ON))["PodMonitor"]["spec"]
    assert monitor["selector"] == {"matchLabels": {INJECT_LABEL: "true"}}
    assert monitor["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert {k: endpoint[k] for k in ("port", "path", "interval")} == {"port": PORT_NAME, "path": "/metrics", "interval": "15s"}


def test_the_job_label_is_the_first_job_name_the_pod_has() -> None:
    # The PodMonitor's jobLabel takes one label (and the operator's default job, one for the whole
    # PodMonitor, where a pod lacks it); the relabeling takes the first of several. What Prometheus
    # makes of it on real targets: tests/chart/test_prometheus_e2e.py.
    (endpoint,) = _by_kind(render_templates("prometheus.yaml", prometheus={"enabled": True, "jobLabels": ["team.io/run", "batch.kubernetes.io/job-name"]}))[
        "PodMonitor"]["spec"]["podMetricsEndpoints"]
    (relabel,) = endpoint["relabelings"]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_team_io_run", "__meta_kubernetes_pod_label_batch_kubernetes_io_job_name",
                                       "__meta_kubernetes_pod_controller_name", "__meta_kubernetes_pod_name"]
    assert relabel["targetLabel"] == "job" and relabel["separator"] == ";"
    # Prometheus anchors the regex; an absent label joins as an empty value.
    joined = ["run-7;job-a;ctrl;pod", ";;sts;sts-0", ";;;bare", ";job-a;job-a;job-a-xyz12"]
    assert [m.group(1) for m in map(re.compile(relabel["regex"]).fullmatch, joined) if m] == ["run-7", "sts", "bare", "job-a"]
    defaults = _by_kind(render_templates("prometheus.yaml", **ON))["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
    assert defaults["sourceLabels"][:4] == ["__meta_kubernetes_pod_label_stepscope_io_job", "__meta_kubernetes_pod_label_training_kubeflow_org_job_name",
                                            "__meta_kubernetes_pod_label_jobset_sigs_k8s_io_jobset_name",
                                            "__meta_kubernetes_pod_label_batch_kubernetes_io_job_name"]


def test_a_scrape_interval_that_is_not_whole_seconds_is_refused() -> None:
    with pytest.raises(Failed, match="prometheus.scrapeInterval must be a whole number of seconds such as 15s, got 1m"):
        render_templates("prometheus.yaml", prometheus={"enabled": True, "scrapeInterval": "1m"})


def _rules(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each rule by its alert or record name (two alerts share the divergence's name)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for rule in _by_kind(docs)["PrometheusRule"]["spec"]["groups"][0]["rules"]:
        by_name.setdefault(rule.get("alert") or rule["record"], []).append(rule)
    return by_name


def test_the_rules_follow_the_conditions_and_name_the_trigger_to_fire() -> None:
    conditions = {"stepTime": {"factor": 2, "baselineMinutes": 0.5, "sustainedSeconds": 90},
                  "rankDivergence": {"factor": 1.25, "sustainedSeconds": 30}, "hang": {"noStepSeconds": 120}}
    rules = _rules(render_templates("prometheus.yaml", prometheus={"enabled": True, "trigger": "watch-llm", "conditions": conditions,
                                                                   "scrapeInterval": "10s"}, operator={"namespaces": ["team-a"]}))
    (slow,), drifts, (hang,) = rules["StepscopeStepTimeSlowdown"], rules["StepscopeRankDivergence"], rules["StepscopeHang"]
    assert slow["expr"] == "stepscope:job_step_seconds:latest > 2 * stepscope:job_step_seconds:baseline" and slow["for"] == "90s"
    # A reading holds for less than sustainedSeconds; irate's range is four scrape intervals.
    assert rules["stepscope:job_step_seconds:latest"][0]["expr"].endswith("[89s])")
    assert rules["stepscope:rank_step_seconds:latest"][0]["expr"].endswith("[29s])")
    assert "[40s]" in rules["stepscope:rank_step_seconds:interval"][0]["expr"]
    assert rules["stepscope:job_step_seconds:baseline"][0]["expr"].count("[30s]") == 3
    assert "> 2 * stepscope:job_step_seconds:baseline" in rules["stepscope:job_step_seconds:calm"][0]["expr"]
    by_ratio, by_wait = drifts
    assert by_ratio["expr"].endswith("> 1.25") and by_wait["expr"].endswith(">= 0.25") and by_ratio["for"] == by_wait["for"] == "30s"
    assert hang["expr"] == "min by (namespace, job) (stepscope_seconds_since_last_step) > 120" and "for" not in hang
    alerts = [slow, *drifts, hang]
    for rule in alerts:
        assert rule["labels"] == {"severity": "warning", "namespace": RELEASE_NAMESPACE,
                                  "stepscope_namespace": "{{ $labels.namespace }}", "stepscope_trigger": "watch-llm"}
        assert "{{ $labels.job }}" in rule["annotations"]["summary"] and "humanize " not in rule["annotations"]["summary"]
    # Every metric a rule reads is one the sidecar serves (stepscope.sidecar.prometheus) or one the group records.
    recorded = {name for name in rules if name.startswith("stepscope:")}
    for rule in [r for group in rules.values() for r in group]:
        assert set(re.findall(r"stepscope[_:][\w:]+", rule["expr"])) <= recorded | {
            "stepscope_step_duration_seconds_sum", "stepscope_step_duration_seconds_count", "stepscope_seconds_since_last_step",
            "stepscope_collective_wait_share"}, rule


def test_the_values_defaults_are_detections() -> None:
    rules = _rules(render_templates("prometheus.yaml", **ON))
    base = detection.Conditions()
    (slow,), drifts, (hang,) = rules["StepscopeStepTimeSlowdown"], rules["StepscopeRankDivergence"], rules["StepscopeHang"]
    assert f"> {base.slowdown_factor:g} * " in slow["expr"] and slow["for"] == f"{base.sustained_s:.0f}s"
    baseline = rules["stepscope:job_step_seconds:baseline"][0]["expr"]
    assert f"[{base.baseline_window_s:.0f}s]" in baseline and f">= {base.min_baseline_polls})" in baseline
    assert drifts[0]["expr"].endswith(f"> {base.divergence_factor:g}") and drifts[1]["expr"].endswith(f">= {base.wait_share_gap:g}")
    assert all(d["for"] == f"{base.sustained_s:.0f}s" for d in drifts) and hang["expr"].endswith(f"> {base.hang_after_s:.0f}")


def test_each_namespaces_alerts_go_to_its_trigger_on_the_operators_alerts_endpoint_with_its_token() -> None:
    docs = render_templates("prometheus.yaml", "alerts-service.yaml", operator={"namespaces": ["team-a", "team-b"]},
                            prometheus={"enabled": True, "trigger": "watch-llm", "alertTokensSecret": "tokens"})
    spec = _by_kind(docs)["AlertmanagerConfig"]["spec"]
    route = spec["route"]
    assert route["matchers"] == [{"name": "stepscope_trigger", "matchType": "=", "value": "watch-llm"}]
    # Child routes are not checked by the API server (the CRD keeps them as they come) but by the
    # Prometheus Operator, as Routes: the parent route's schema.
    route_schema = SCHEMAS["monitoring.coreos.com/v1alpha1/AlertmanagerConfig"]["properties"]["spec"]["properties"]["route"]
    receivers = {r["name"]: r for r in spec["receivers"]}
    assert route["receiver"] in receivers and "webhookConfigs" not in receivers[route["receiver"]]
    for child, namespace in zip(route["routes"], ("team-a", "team-b"), strict=True):
        assert validate_value(child, route_schema) == [] and prune(child, route_schema) == child
        assert child["matchers"] == [{"name": "stepscope_namespace", "matchType": "=", "value": namespace}]
        (hook,) = receivers[child["receiver"]]["webhookConfigs"]
        # operator/triggers/alerts.py: POST /v1/alerts/<namespace>/<trigger> on the
        # Service <release>-alerts, port 80, with the namespace's bearer token.
        assert hook["url"] == f"http://stepscope-alerts.{RELEASE_NAMESPACE}.svc:80/v1/alerts/{namespace}/watch-llm"
        assert hook["httpConfig"] == {"authorization": {"type": "Bearer", "credentials": {"name": "tokens", "key": namespace}}}
        assert hook["sendResolved"] is False
    service = _by_kind(docs).get("Service")
    if service is not None:  # templates/alerts-service.yaml comes with part A's branch
        assert service["metadata"]["name"] == "stepscope-alerts" and service["spec"]["ports"][0]["port"] == 80
