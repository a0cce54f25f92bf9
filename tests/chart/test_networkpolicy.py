"""The chart's NetworkPolicy (templates/networkpolicy.yaml), rendered by the real helm and
evaluated here as networking.k8s.io/v1 defines it: which pods it selects, and from which pods
and to which ports it admits traffic (numeric ports, as the chart writes them)."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.operator.injection.injection import SIDECAR_PORT
from stepscope.operator.sessions import jobs
from stepscope.operator.settings import OperatorSettings
from stepscope.testing.kube.admission import _matches
from tests.chart.conftest import RELEASE_NAMESPACE
from tests.chart.conftest import render_templates as render

TRAINING_NS = "team-a"


def _chart(**values: Any) -> list[dict[str, Any]]:
    return render(
        "networkpolicy.yaml", "deployment.yaml", "webhook.yaml", operator={"namespaces": [TRAINING_NS]}, **values
    )


def _policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return policy


def selects(policy: dict[str, Any], namespace: str, labels: dict[str, str]) -> bool:
    return policy["metadata"]["namespace"] == namespace and _matches(policy["spec"]["podSelector"], labels)


def _peer(peer: dict[str, Any], policy_ns: str, ns: str, ns_labels: dict[str, str], labels: dict[str, str]) -> bool:
    if "ipBlock" in peer:
        return False  # pod traffic here, never an ipBlock's
    in_namespace = _matches(peer["namespaceSelector"], ns_labels) if "namespaceSelector" in peer else ns == policy_ns
    return in_namespace and ("podSelector" not in peer or _matches(peer["podSelector"], labels))


def admits(policy: dict[str, Any], source: tuple[str, dict[str, str]], port: int, protocol: str = "TCP") -> bool:
    """Whether `policy`'s ingress rules admit traffic from pod (namespace, labels) to `port`."""
    ns, labels = source
    ns_labels = {"kubernetes.io/metadata.name": ns}  # the API server labels every namespace so
    for rule in policy["spec"].get("ingress") or []:
        peers = rule.get("from")
        if peers and not any(_peer(p, policy["metadata"]["namespace"], ns, ns_labels, labels) for p in peers):
            continue
        ports = rule.get("ports")
        if not ports or any(
            p.get("protocol", "TCP") == protocol and p["port"] <= port <= p.get("endPort", p["port"]) for p in ports
        ):
            return True
    return False


def _operator_pod(docs: list[dict[str, Any]]) -> tuple[str, dict[str, str]]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return deployment["metadata"]["namespace"], deployment["spec"]["template"]["metadata"]["labels"]


def test_it_selects_the_pods_the_webhook_injects() -> None:
    docs = _chart()
    policy = _policy(docs)
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert policy["spec"]["podSelector"] == config["webhooks"][0]["objectSelector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress untouched
    assert selects(policy, TRAINING_NS, {"stepscope.io/inject": "true", "job-name": "train"})
    assert not selects(policy, TRAINING_NS, {"job-name": "train"}) and not selects(
        policy, "team-b", {"stepscope.io/inject": "true"}
    )


def test_only_the_operator_reaches_the_sidecar_port() -> None:
    docs = _chart()
    policy, operator = _policy(docs), _operator_pod(docs)
    assert admits(policy, operator, SIDECAR_PORT)
    for who in (
        (TRAINING_NS, {"app": "tenant"}),  # a tenant's pod beside the training
        (TRAINING_NS, operator[1]),  # a tenant's pod with the operator's labels
        ("team-b", operator[1]),
        (RELEASE_NAMESPACE, {"app": "other"}),  # another pod of the release namespace
        (TRAINING_NS, {"app.kubernetes.io/name": "prometheus"}),
    ):  # no scraping without prometheus.enabled
        assert not admits(policy, who, SIDECAR_PORT), who


@pytest.mark.parametrize(
    ("port", "protocol"),
    [
        (29500, "TCP"),
        (SIDECAR_PORT - 1, "TCP"),
        (SIDECAR_PORT + 1, "TCP"),
        (65535, "TCP"),
        (1, "TCP"),
        (29500, "UDP"),
        (SIDECAR_PORT, "UDP"),
        (4791, "UDP"),
        (9000, "SCTP"),
    ],
)
def test_the_trainings_own_traffic_stays_open(port: int, protocol: str) -> None:
    """Selecting a pod denies all ingress no policy admits: every other port of the training
    (torch.distributed's rendezvous, NCCL, gloo) is admitted from anywhere."""
    assert admits(_policy(_chart()), ("team-b", {"app": "anyone"}), port, protocol)


def test_prometheus_scrapes_the_sidecars_only_when_enabled() -> None:
    prometheus = ("monitoring", {"app.kubernetes.io/name": "prometheus"})
    assert not admits(_policy(_chart()), prometheus, SIDECAR_PORT)
    policy = _policy(_chart(prometheus={"enabled": True}))
    assert admits(policy, prometheus, SIDECAR_PORT) and admits(policy, _operator_pod(_chart()), SIDECAR_PORT)
    assert not admits(policy, (TRAINING_NS, {"app": "tenant"}), SIDECAR_PORT)
    narrowed = _policy(
        _chart(
            prometheus={"enabled": True},
            networkPolicy={
                "scrapers": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                        "podSelector": {},
                    }
                ]
            },
        )
    )
    assert admits(narrowed, ("monitoring", {"any": "pod"}), SIDECAR_PORT) and not admits(
        narrowed, ("team-b", prometheus[1]), SIDECAR_PORT
    )


def test_it_can_be_turned_off() -> None:
    assert not [d for d in _chart(networkPolicy={"enabled": False}) if d["kind"] == "NetworkPolicy"]


def test_the_policy_names_the_sidecars_port() -> None:
    """values.networkPolicy.sidecarPort is the port injection gives the sidecar."""
    rules = _policy(_chart())["spec"]["ingress"]
    assert rules[0]["ports"] == [{"protocol": "TCP", "port": SIDECAR_PORT}]


def test_the_analysis_jobs_pods_are_not_its_business() -> None:
    """Neither the analysis Job's pod nor a shard Job's (with the labels the Job controller adds)
    is selected: their traffic to the API server and the store is as without the policy."""
    policy = _policy(_chart())
    for job in (
        jobs.job(TRAINING_NS, "s1", "0123456789", OperatorSettings(), None, {}),
        jobs.shard_job(TRAINING_NS, "s1", "0123456789", OperatorSettings(), None, {}, completions=4, parallelism=2),
    ):
        labels = {
            **job["spec"]["template"]["metadata"]["labels"],
            "batch.kubernetes.io/job-name": job["metadata"]["name"],
            "batch.kubernetes.io/job-completion-index": "0",
        }
        assert not selects(policy, TRAINING_NS, labels)
