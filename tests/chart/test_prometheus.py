"""The chart's optional Prometheus Operator objects (values.prometheus), rendered by the real helm.

Their fields are checked against the Prometheus Operator's CRD schemas as the API server applies
them (tests.kube.schema: no field pruned as unknown, every value valid): PodMonitor and
PrometheusRule are monitoring.coreos.com/v1, AlertmanagerConfig monitoring.coreos.com/v1alpha1
(https://prometheus-operator.dev/docs/api-reference/api/); an AlertmanagerConfig's child routes,
which the API server keeps as they come, against the Route schema the operator applies to them.
prometheus_operator_schemas.json holds
the part of those schemas the chart uses, taken from prometheus-operator v0.93.0's
example/prometheus-operator-crd/monitoring.coreos.com_{podmonitors,prometheusrules,alertmanagerconfigs}.yaml
(commit 6adcebc5); a field the chart adds that is not in it fails here as unknown, and the whole
CRDs accepted every object when the file was taken. What it does not check: the PromQL itself
(no Prometheus here) and the CRDs' CEL rules (none on the fields used)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from stepscope import detection
from stepscope.operator.settings import INJECT_LABEL
from stepscope.wire import PORT_NAME
from tests.chart.conftest import RELEASE_NAMESPACE, render_templates
from tests.kube.schema import prune, validate_value

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
    assert monitor["podMetricsEndpoints"] == [{"port": PORT_NAME, "path": "/metrics", "interval": "15s"}]
    assert monitor["jobLabel"] == "batch.kubernetes.io/job-name"


def test_the_rules_follow_the_conditions_and_name_the_trigger_to_fire() -> None:
    conditions = {"stepTime": {"factor": 2, "baselineMinutes": 0.5, "sustainedSeconds": 90},
                  "rankDivergence": {"factor": 1.25, "sustainedSeconds": 30}, "hang": {"noStepSeconds": 120}}
    rules = _by_kind(render_templates("prometheus.yaml", prometheus={"enabled": True, "trigger": "watch-llm", "conditions": conditions},
                                      operator={"namespaces": ["team-a"]}))["PrometheusRule"]["spec"]["groups"][0]["rules"]
    alerts = {r["alert"]: r for r in rules}
    slow, drift, hang = alerts["StepscopeStepTimeSlowdown"], alerts["StepscopeRankDivergence"], alerts["StepscopeHang"]
    assert re.search(r"\) > 2 \* \(", slow["expr"]) and "[30s] offset 2m" in slow["expr"] and slow["for"] == "90s"
    assert drift["expr"].endswith("> 1.25") and "quantile by (namespace, job) (0.5," in drift["expr"] and drift["for"] == "30s"
    assert hang["expr"] == "min by (namespace, job) (stepscope_seconds_since_last_step) > 120" and "for" not in hang
    for rule in rules:
        assert rule["labels"] == {"severity": "warning", "namespace": RELEASE_NAMESPACE,
                                  "stepscope_namespace": "{{ $labels.namespace }}", "stepscope_trigger": "watch-llm"}
        assert "{{ $labels.job }}" in rule["annotations"]["summary"]
        # Every metric a rule reads is one the sidecar serves (stepscope.sidecar.metrics).
        assert set(re.findall(r"stepscope_\w+", rule["expr"])) <= {
            "stepscope_step_duration_seconds_sum", "stepscope_step_duration_seconds_count", "stepscope_seconds_since_last_step"}


def test_the_values_defaults_are_detections() -> None:
    conditions = _by_kind(render_templates("prometheus.yaml", **ON))["PrometheusRule"]["spec"]["groups"][0]["rules"]
    base = detection.Conditions()
    slow, drift, hang = conditions
    assert f"> {base.slowdown_factor:g} * (" in slow["expr"] and f"[{base.baseline_window_s:.0f}s]" in slow["expr"]
    assert slow["for"] == drift["for"] == f"{base.sustained_s:.0f}s"
    assert drift["expr"].endswith(f"> {base.divergence_factor:g}") and hang["expr"].endswith(f"> {base.hang_after_s:.0f}")


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
        # operator/triggers_alerts.py (issue 15 part A): POST /v1/alerts/<namespace>/<trigger> on the
        # Service <release>-alerts, port 80, with the namespace's bearer token.
        assert hook["url"] == f"http://stepscope-alerts.{RELEASE_NAMESPACE}.svc:80/v1/alerts/{namespace}/watch-llm"
        assert hook["httpConfig"] == {"authorization": {"type": "Bearer", "credentials": {"name": "tokens", "key": namespace}}}
        assert hook["sendResolved"] is False
    service = _by_kind(docs).get("Service")
    if service is not None:  # templates/alerts-service.yaml comes with part A's branch
        assert service["metadata"]["name"] == "stepscope-alerts" and service["spec"]["ports"][0]["port"] == 80
