"""The injection webhook on the test API server, as a cluster runs it: the chart's own
MutatingWebhookConfiguration, RBAC and ServiceAccount are applied, the operator runs as that
ServiceAccount (not as admin), and pods are created through the API server, which calls the
webhook over HTTPS through the chart's Service (stepscope/testing/kube/admission.py) and applies Pod Security
admission after it."""
from __future__ import annotations

import base64
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kopf.testing import KopfRunner

from stepscope.local.launch import free_port
from stepscope.operator import kube as operator_kube
from stepscope.operator import metrics, registry
from stepscope.operator.injection.injection import BOOTSTRAP_DIR, SIDECAR_NAME, InjectionSettings, inject, reinject
from stepscope.operator.namespace_keys import namespace_key
from stepscope.testing.kube.fixtures import Kube
from stepscope.testing.kube.helpers import wait_for
from tests.chart.conftest import CHART
from tests.chart.conftest import render_templates as render
from tests.operator.harness import KEY, OPERATOR_KEY, OperatorHarness, session_spec

RELEASE_NS = "stepscope"
CONFIG = "stepscope-injector.stepscope.io"
HOOK = f"inject-sidecar.{CONFIG}"
# With the admission policies: the operator's caBundle upkeep goes through the one that pins it.
CHART_TEMPLATES = ("serviceaccount.yaml", "rbac.yaml", "rbac-webhook.yaml", "webhook.yaml", "peering.yaml", "admission-policy.yaml")
INJECT = {"stepscope.io/inject": "true"}


class Chart:
    """The chart's objects in the test API server, and the operator's environment as the
    Deployment sets it, with the operator's ServiceAccount as its identity."""

    def __init__(self, kube: Kube, monkeypatch: pytest.MonkeyPatch, namespaces: list[str],
                 labels: dict[str, dict[str, str]] | None = None) -> None:
        self.kube, self.monkeypatch = kube, monkeypatch
        self.core = kubernetes.client.CoreV1Api(kube.api_client)
        self.admission = kubernetes.client.AdmissionregistrationV1Api(kube.api_client)
        self.namespaces = namespaces
        kube.apply_crd(CHART / "crds" / "kopfpeering.yaml")
        self.docs = render(*CHART_TEMPLATES, namespace=RELEASE_NS, operator={"namespaces": namespaces})
        for ns in [RELEASE_NS, *namespaces]:
            if ns != "default":
                self.core.create_namespace({"metadata": {"name": ns, "labels": (labels or {}).get(ns) or {}}})
        for doc in self.docs:
            if doc["apiVersion"] == "kopf.dev/v1":
                kubernetes.client.CustomObjectsApi(kube.api_client).create_namespaced_custom_object(
                    "kopf.dev", "v1", doc["metadata"]["namespace"], "kopfpeerings", doc)
            else:
                kubernetes.utils.create_from_dict(kube.api_client, doc)
        self.port = free_port()
        kube.server.api.service_endpoints[(RELEASE_NS, "stepscope-webhook")] = ("127.0.0.1", self.port)
        self.kubeconfig = kube.service_account_kubeconfig(RELEASE_NS, "stepscope-operator")
        self.env = {"KUBECONFIG": str(self.kubeconfig), "POD_NAMESPACE": RELEASE_NS, "STEPSCOPE_NAMESPACES": ",".join(namespaces),
                    "STEPSCOPE_WEBHOOK_PORT": str(self.port), "STEPSCOPE_WEBHOOK_ADDR": "127.0.0.1",
                    "STEPSCOPE_WEBHOOK_SERVICE": "stepscope-webhook", "STEPSCOPE_WEBHOOK_NAMESPACE": RELEASE_NS,
                    "STEPSCOPE_WEBHOOK_CONFIG": CONFIG, "STEPSCOPE_IMAGE": "registry.example/stepscope:test",
                    "STEPSCOPE_INJECTION_RESYNC_S": "0.5"}
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)
        operator_kube.reset()

    def operator(self, *peering: str) -> KopfRunner:
        """The operator as the chart's Deployment runs it: webhook on, one --namespace per
        operator.namespaces; standalone unless `peering` options are given."""
        args = [*(peering or ["--standalone"]), *(f"--namespace={ns}" for ns in self.namespaces)]
        return KopfRunner(["run", *args], registry=registry.build(with_webhook=True), timeout=60)

    def chart_hook(self) -> dict[str, Any]:
        (config,) = [d for d in self.docs if d["kind"] == "MutatingWebhookConfiguration"]
        return config["webhooks"][0]

    def stored_hooks(self) -> list[dict[str, Any]]:
        return self.kube.server.call(lambda store: [dict(h) for h in next(
            c for c in store.stored("admissionregistration.k8s.io", "mutatingwebhookconfigurations") if c["metadata"]["name"] == CONFIG)["webhooks"]])

    def ca_bundle(self) -> str | None:
        hooks = self.stored_hooks()
        return hooks[0]["clientConfig"].get("caBundle") if hooks else None

    def create_pod(self, namespace: str, name: str, labels: dict[str, str] | None = None, **spec: Any) -> tuple[dict[str, Any], list[str]]:
        """Create a pod as a user would; the stored pod and the warnings the API server returned."""
        body = {"metadata": {"name": name, "labels": labels if labels is not None else INJECT},
                "spec": {"containers": [{"name": "pytorch", "image": "pytorch/pytorch"}], **spec}}
        response = self.core.create_namespaced_pod(namespace, body, _preload_content=False)
        warnings = [w.split('"', 1)[1].rsplit('"', 1)[0] for w in response.headers.get_all("Warning") or []]
        return self.kube.api_client.sanitize_for_serialization(self.core.read_namespaced_pod(name, namespace)), warnings

    def key_secret(self, namespace: str) -> bytes | None:
        try:
            return base64.b64decode(self.core.read_namespaced_secret("stepscope-hmac", namespace).data["key"])
        except kubernetes.client.ApiException:
            return None

    def events(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.core.list_namespaced_event(namespace).items if e.involved_object.name == pod]


def _listening(port: int) -> bool:
    """What the Deployment's readinessProbe (tcpSocket) checks before the Service sends requests."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _ready(chart: Chart, *namespaces: str) -> None:
    wait_for(lambda: chart.ca_bundle(), 30, "the operator to put its CA into the chart's webhook configuration")
    wait_for(lambda: _listening(chart.port), 30, "the webhook to listen")
    for ns in namespaces:
        wait_for(lambda ns=ns: chart.key_secret(ns), 30, f"the key Secret in namespace {ns}")


@pytest.fixture
def chart(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> Chart:
    return Chart(cluster, monkeypatch, ["default", "secure"], labels={"secure": {"pod-security.kubernetes.io/enforce": "restricted"}})


@pytest.fixture
def injecting(chart: Chart) -> Iterator[Chart]:
    with chart.operator():
        _ready(chart, "default")
        yield chart


def _sidecar(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in pod["spec"].get("initContainers") or [] if c["name"] == SIDECAR_NAME), None)


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def test_a_labelled_pod_gets_the_sidecar_through_the_api_server(injecting: Chart) -> None:
    containers = [{"name": "pytorch", "image": "pytorch/pytorch", "env": [{"name": "PYTHONPATH", "value": "/app/lib"}]},
                  {"name": "logger", "image": "busybox"}]
    pod, warnings = injecting.create_pod("default", "trainer-0", containers=containers)
    assert warnings == []
    sidecar = _sidecar(pod)
    assert sidecar is not None and sidecar["image"] == "registry.example/stepscope:test" and sidecar["restartPolicy"] == "Always"
    assert pod["metadata"]["annotations"]["stepscope.io/injected"] == "true"
    assert _env(sidecar)["STEPSCOPE_HMAC_KEY"] == {"secretKeyRef": {"name": "stepscope-hmac", "key": "key", "optional": True}}
    # The address the operator's requests are signed for (docs/wire.md): the pod's IP, from the downward API.
    assert _env(sidecar)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    training, logger = pod["spec"]["containers"]
    assert _env(training)["PYTHONPATH"] == f"{BOOTSTRAP_DIR}:/app/lib" and _env(logger)["PYTHONPATH"] == BOOTSTRAP_DIR
    unlabelled, warnings = injecting.create_pod("default", "web-0", labels={"app": "web"})
    assert _sidecar(unlabelled) is None and "annotations" not in unlabelled["metadata"] and warnings == []


def test_point1_5_the_operator_runs_under_the_chart_rbac_and_leaves_the_chart_fields_alone(injecting: Chart) -> None:
    """kopf's managed mode needed validating configurations (Forbidden under the chart's RBAC,
    then a crash) and rewrote timeoutSeconds, review versions and selectors."""
    (hook,) = injecting.stored_hooks()
    wanted = injecting.chart_hook()
    assert {k: v for k, v in hook.items() if k != "clientConfig"} == {k: v for k, v in wanted.items() if k != "clientConfig"}
    assert hook["clientConfig"] == {**wanted["clientConfig"], "caBundle": hook["clientConfig"]["caBundle"]}
    paths = [path for _, path in injecting.kube.server.requests()]
    assert not [p for p in paths if "validatingwebhookconfigurations" in p]
    # A second round of upkeep changes nothing more (no write fights with the chart).
    writes = [r for r in injecting.kube.server.requests() if r[0] in ("PATCH", "PUT") and "mutatingwebhookconfigurations" in r[1]]
    wait_for(lambda: len([p for p in injecting.kube.server.requests() if "mutatingwebhookconfigurations" in p[1]]) > len(writes) + 2, 10, "more upkeep rounds")
    assert [r for r in injecting.kube.server.requests() if r[0] in ("PATCH", "PUT") and "mutatingwebhookconfigurations" in r[1]] == writes


def test_point1_the_operator_may_touch_its_own_webhook_configuration_only(chart: Chart) -> None:
    """By name (RBAC) and only its caBundle (the chart's admission policy): dropping its selectors,
    which would send every pod of the cluster through the operator, is refused."""
    other = {"metadata": {"name": "someone-elses.example.com"}, "webhooks": []}
    chart.admission.create_mutating_webhook_configuration(other)
    as_operator = kubernetes.client.AdmissionregistrationV1Api(kubernetes.config.new_client_from_config(config_file=str(chart.kubeconfig)))
    as_operator.patch_mutating_webhook_configuration(CONFIG, [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="}])
    for patch in ([{"op": "remove", "path": "/webhooks/0/namespaceSelector"}, {"op": "remove", "path": "/webhooks/0/objectSelector"}],
                  {"metadata": {"labels": {"checked": "yes"}}}):
        with pytest.raises(kubernetes.client.ApiException) as refused:
            as_operator.patch_mutating_webhook_configuration(CONFIG, patch)
        assert refused.value.status == 403 and "ValidatingAdmissionPolicy 'stepscope-webhook-configuration.stepscope.io'" in json.loads(refused.value.body)["message"]
    assert chart.stored_hooks()[0]["namespaceSelector"] == chart.chart_hook()["namespaceSelector"]
    for call in (lambda: as_operator.read_mutating_webhook_configuration(other["metadata"]["name"]),
                 lambda: as_operator.patch_mutating_webhook_configuration(other["metadata"]["name"], {"metadata": {"labels": {"x": "y"}}}),
                 lambda: as_operator.create_mutating_webhook_configuration({"metadata": {"name": "new.example.com"}, "webhooks": []}),
                 lambda: as_operator.delete_mutating_webhook_configuration(CONFIG)):
        with pytest.raises(kubernetes.client.ApiException) as refused:
            call()
        assert refused.value.status == 403


def test_point2_a_failure_beside_admission_admits_the_pod_as_is_with_a_warning_and_an_event(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key Secret cannot be written in team-b: a stale one is there and the operator may not
    patch it (an RBAC gap: its RoleBinding there is missing). Before, the webhook copied the
    Secret during admission and denied the pod with a raw 403 dump."""
    chart = Chart(cluster, monkeypatch, ["default", "team-b"])
    rbac = kubernetes.client.RbacAuthorizationV1Api(cluster.api_client)
    rbac.delete_namespaced_role_binding("stepscope-injection", "team-b")
    chart.core.create_namespaced_secret("team-b", {"metadata": {"name": "stepscope-hmac"}, "stringData": {"key": "stale"}})
    before = metrics.value("stepscope_pods_not_injected_total")
    with chart.operator():
        _ready(chart, "default")
        pod, warnings = chart.create_pod("team-b", "trainer-0")
        assert _sidecar(pod) is None and "stepscope.io/injected" not in (pod["metadata"].get("annotations") or {})
        (warning,) = warnings
        assert warning.startswith("stepscope: pod admitted WITHOUT the profiling sidecar: the key Secret stepscope-hmac of namespace team-b is not ready")
        assert "403 Forbidden" in warning and "HTTPHeaderDict" not in warning
        (event,) = wait_for(lambda: chart.events("team-b", "trainer-0"), 30, "the SidecarNotInjected event")
        assert event["reason"] == "SidecarNotInjected" and event["type"] == "Warning" and "403 Forbidden" in event["message"]
        wait_for(lambda: metrics.value("stepscope_pods_not_injected_total") == before + 1, 10, "the metric to count the pod")
        # Once the gap is fixed the namespace gets its key and the next pods their sidecar.
        for doc in chart.docs:
            if doc["kind"] == "RoleBinding" and doc["metadata"]["namespace"] == "team-b" and doc["metadata"]["name"] == "stepscope-injection":
                rbac.create_namespaced_role_binding("team-b", doc)
        wait_for(lambda: chart.key_secret("team-b") == namespace_key(OPERATOR_KEY, "team-b"), 30, "the key in team-b once the RoleBinding is back")
        pod, warnings = chart.create_pod("team-b", "trainer-1")
        assert _sidecar(pod) is not None and warnings == [], warnings


def test_point3_an_injected_pod_is_admitted_under_pod_security_restricted(injecting: Chart) -> None:
    wait_for(lambda: injecting.key_secret("secure"), 30, "the key Secret in the restricted namespace")
    restricted = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                  "seccompProfile": {"type": "RuntimeDefault"}}
    pod, _ = injecting.create_pod("secure", "trainer-0", containers=[{"name": "pytorch", "image": "pytorch/pytorch", "securityContext": restricted}])
    sidecar = _sidecar(pod)
    assert sidecar is not None and sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in sidecar["volumeMounts"]} == {"/var/run/stepscope", "/tmp"}
    # The check is real: a container without the restricted settings is refused in that namespace.
    with pytest.raises(kubernetes.client.ApiException) as refused:
        injecting.create_pod("secure", "loose-0")
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 403 and message.startswith('pods "loose-0" is forbidden: violates PodSecurity "restricted:latest": ')
    assert 'container "pytorch"' in message and SIDECAR_NAME not in message


def test_point4_a_graceful_stop_keeps_the_webhook_and_pods_let_through_meanwhile_are_reported(chart: Chart, tmp_path: Path) -> None:
    """SIGTERM to `stepscope operator --webhook` (every rollout, drain, eviction). Before, kopf's
    cleanup emptied the webhook list and the next labelled pods started without a sidecar, silently."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, **chart.env, "STEPSCOPE_HMAC_KEY": OPERATOR_KEY.decode(), "TMPDIR": str(scratch)}
    command = [sys.executable, "-m", "stepscope.cli", "operator", "--webhook", "--metrics-port", "0", "-n", "default", "-n", "secure",
               f"--liveness=http://127.0.0.1:{free_port()}/healthz"]
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _ready(chart, "default")
            hooks = chart.stored_hooks()
            pod, _ = chart.create_pod("default", "trainer-0")
            assert _sidecar(pod) is not None
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]
    assert chart.stored_hooks() == hooks, "a stop leaves the webhook configuration as it was"
    assert list(scratch.iterdir()) == [], "no certificate or private key left on disk"
    # With the operator stopped, failurePolicy Ignore lets a labelled pod through without a sidecar ...
    pod, _ = chart.create_pod("default", "trainer-1")
    assert _sidecar(pod) is None
    # ... and the operator, once back, says so on the pod. It serves the same certificate as
    # before (a Secret shares it between processes), so the caBundle never goes stale.
    with chart.operator():
        (event,) = wait_for(lambda: chart.events("default", "trainer-1"), 30, "the SidecarNotInjected event")
        assert chart.stored_hooks() == hooks
    assert event["reason"] == "SidecarNotInjected" and "not reached" in event["message"]
    assert chart.events("default", "trainer-0") == []


def test_point6_kube_system_the_release_namespace_and_unlisted_namespaces_are_never_injected(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    chart = Chart(cluster, monkeypatch, ["team-a"])
    cluster.create_namespace("team-c")
    with chart.operator():
        _ready(chart, "team-a")
        assert _sidecar(chart.create_pod("team-a", "trainer-0")[0]) is not None
        for ns in ("kube-system", RELEASE_NS, "team-c", "default"):
            pod, warnings = chart.create_pod(ns, "trainer-0")
            assert _sidecar(pod) is None and warnings == [], f"{ns}: the namespaceSelector keeps the webhook out"
            assert chart.key_secret(ns) is None, f"no key Secret in {ns}"


def test_point7_each_namespace_has_its_own_key_and_the_operator_signs_with_it(cluster: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    chart = Chart(cluster, monkeypatch, ["default", "team-a"])
    with chart.operator():
        _ready(chart, "default", "team-a")
    default_key, team_key = chart.key_secret("default"), chart.key_secret("team-a")
    assert default_key == KEY == namespace_key(OPERATOR_KEY, "default")  # the sessions' tests sign with it
    assert team_key == namespace_key(OPERATOR_KEY, "team-a") and team_key != default_key and OPERATOR_KEY not in (default_key, team_key)
    assert chart.key_secret(RELEASE_NS) is None or chart.key_secret(RELEASE_NS) != default_key


def test_point8_re_applying_a_bare_pod_that_declares_pythonpath_succeeds(injecting: Chart) -> None:
    """`kubectl apply` of the same manifest again sends a three-way strategic merge patch that puts
    the manifest's PYTHONPATH back over the injected one; kube-apiserver refuses any such change
    of a pod's spec, unless the webhook (called on UPDATE) puts the bootstrap back first."""
    containers = [{"name": "pytorch", "image": "pytorch/pytorch", "env": [{"name": "PYTHONPATH", "value": "/app/lib"}]},
                  {"name": "logger", "image": "busybox"}]
    pod, _ = injecting.create_pod("default", "trainer-0", containers=containers)
    reapply = {"spec": {"$setElementOrder/containers": [{"name": "pytorch"}, {"name": "logger"}],
                        "containers": [{"$setElementOrder/env": [{"name": "PYTHONPATH"}], "env": [{"name": "PYTHONPATH", "value": "/app/lib"}],
                                        "name": "pytorch"}]}}
    patched = injecting.kube.api_client.sanitize_for_serialization(injecting.core.patch_namespaced_pod(
        "trainer-0", "default", reapply, _content_type="application/strategic-merge-patch+json"))
    assert patched["spec"] == pod["spec"] and _env(patched["spec"]["containers"][0])["PYTHONPATH"] == f"{BOOTSTRAP_DIR}:/app/lib"
    # A pod that was not injected is left to the pod update rules: its PYTHONPATH change is refused as before.
    injecting.create_pod("default", "web-0", labels={"app": "web"}, containers=containers)
    other = {"spec": {"containers": [{"name": "pytorch", "env": [{"name": "PYTHONPATH", "value": "/elsewhere"}]}]}}
    with pytest.raises(kubernetes.client.ApiException) as refused:
        injecting.core.patch_namespaced_pod("web-0", "default", other, _content_type="application/strategic-merge-patch+json")
    assert refused.value.status == 422 and "pod updates may not change fields" in refused.value.body


def test_point8_reinject_puts_back_only_what_injection_changed() -> None:
    spec = {"containers": [{"name": "pytorch", "image": "i", "env": [{"name": "PYTHONPATH", "value": "/app"}, {"name": "A", "value": "1"}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "initContainers": [{"name": "setup", "image": "busybox"}], "volumes": [{"name": "data", "emptyDir": {}}]}
    injected = {**spec, **inject(spec, InjectionSettings("stepscope:test", "IfNotPresent", "stepscope-hmac", "key"))}
    assert reinject(injected) is None  # idempotent: the stored pod needs nothing
    reverted = json.loads(json.dumps(injected))
    reverted["containers"][0]["env"][0]["value"] = "/app"  # what the re-applied manifest says
    assert reinject(reverted) == {"containers": injected["containers"]}  # never a volume, never the sidecar


def test_point8_pythonpath_from_valuefrom_is_named_in_a_warning(injecting: Chart) -> None:
    env = [{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "paths", "key": "python"}}}]
    pod, warnings = injecting.create_pod("default", "trainer-0", containers=[{"name": "pytorch", "image": "pytorch/pytorch", "env": env}])
    assert _sidecar(pod) is not None
    (warning,) = warnings
    assert "container pytorch sets PYTHONPATH from valueFrom" in warning and BOOTSTRAP_DIR in warning
    # A Job's pods are created by its controller, which shows nobody the warning: the pod keeps it.
    assert pod["metadata"]["annotations"]["stepscope.io/injection-warning"] == warning
    (event,) = wait_for(lambda: injecting.events("default", "trainer-0"), 30, "the SidecarInjectionWarning event")
    assert event["reason"] == "SidecarInjectionWarning" and event["message"] == warning


def test_an_operator_outside_the_cluster_is_reached_by_url(chart: Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    """STEPSCOPE_WEBHOOK_URL (a local run, the e2e tests): the operator points its webhook there.
    The chart's admission policy refuses that to the chart's operator (its webhook goes to its
    Service only): a local run goes without it."""
    chart.admission.delete_validating_admission_policy_binding("stepscope-webhook-configuration.stepscope.io")
    monkeypatch.delenv("STEPSCOPE_WEBHOOK_SERVICE")
    monkeypatch.setenv("STEPSCOPE_WEBHOOK_URL", f"https://127.0.0.1:{chart.port}")
    with chart.operator():
        _ready(chart, "default")
        (hook,) = chart.stored_hooks()
        assert hook["clientConfig"]["url"] == f"https://127.0.0.1:{chart.port}/inject-sidecar" and "service" not in hook["clientConfig"]
        assert _sidecar(chart.create_pod("default", "trainer-0")[0]) is not None


def test_two_replicas_elect_one_to_handle_sessions_and_both_serve_the_webhook(chart: Chart, monkeypatch: pytest.MonkeyPatch,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """operator.replicas: 2 (the chart's default): kopf's peering keeps the lower priority replica
    paused (a peering replica starts paused and resumes only when no higher one is alive), which
    still answers admission; when the other stops, it takes over the sessions."""
    caplog.set_level(logging.INFO, logger="kopf")

    def resumed() -> int:  # kopf logs one per served namespace when a replica starts handling it
        return sum("Resuming operations after the pause" in r.getMessage() for r in caplog.records)

    with chart.operator("--peering=stepscope", "--priority=20") as first:
        _ready(chart, "default")
        wait_for(lambda: resumed() == len(chart.namespaces), 30, "the first replica to handle its namespaces")
        monkeypatch.setenv("STEPSCOPE_WEBHOOK_PORT", str(second_port := free_port()))
        with chart.operator("--peering=stepscope", "--priority=10"):
            wait_for(lambda: _listening(second_port), 30, "the second replica's webhook")
            chart.kube.server.api.service_endpoints[(RELEASE_NS, "stepscope-webhook")] = ("127.0.0.1", second_port)
            pod, warnings = chart.create_pod("default", "trainer-0")
            assert _sidecar(pod) is not None and warnings == [], "the paused replica serves admission"
            peers = kubernetes.client.CustomObjectsApi(chart.kube.api_client).get_namespaced_custom_object("kopf.dev", "v1", "default", "kopfpeerings", "stepscope")
            assert sorted(p["priority"] for p in peers["status"].values()) == [10, 20]
            assert resumed() == len(chart.namespaces), "the second replica stays paused"
            first.__exit__(None, None, None)  # the leader goes (a rollout, a drain)
            wait_for(lambda: resumed() == 2 * len(chart.namespaces), 60, "the second replica to take over")
            harness = OperatorHarness(chart.kube)
            harness.create_session("after-failover", session_spec({"app": "none"}, "http://127.0.0.1:1"))
            harness.wait_phase("after-failover", ("Failed",), timeout=60)  # (the store is unreachable): it was handled


def test_a_session_that_selects_pods_started_without_the_sidecar_says_so(chart: Chart, s3_endpoint: str) -> None:
    pod, _ = chart.create_pod("default", "trainer-0", labels={**INJECT, "job": "resnet"})  # no operator: failurePolicy Ignore
    assert _sidecar(pod) is None
    chart.core.patch_namespaced_pod_status("trainer-0", "default", {"status": {"phase": "Running", "podIP": "127.0.0.1"}})
    with chart.operator():
        harness = OperatorHarness(chart.kube)
        harness.create_session("resnet", session_spec({"job": "resnet"}, s3_endpoint))
        status = harness.wait_phase("resnet", ("Failed",), timeout=30)
    assert "not profiled: pod(s) trainer-0 asked for the sidecar (stepscope.io/inject=true) but started without it" in status["message"], status


def test_point8_uninstalling_the_webhook_configuration_takes_the_key_secrets_along(injecting: Chart) -> None:
    owner = injecting.core.read_namespaced_secret("stepscope-hmac", "default").metadata.owner_references
    assert [(o.kind, o.name) for o in owner or []] == [("MutatingWebhookConfiguration", CONFIG)]
    injecting.admission.delete_mutating_webhook_configuration(CONFIG)  # what `helm uninstall` does
    wait_for(lambda: injecting.key_secret("default") is None and injecting.key_secret("secure") is None, 10, "the garbage collector")


def test_a_broken_sidecar_never_holds_the_training_containers(tmp_path: Path) -> None:
    """The kubelet starts a pod's containers only once each native sidecar before them has started:
    with a startupProbe only once that passes, with a postStart hook only once that has finished. A
    sidecar that cannot come up (its key Secret missing, a crash) must not hold the training: no
    startupProbe, the key optional (a missing Secret would stop the pod at
    CreateContainerConfigError), and the one postStart hook, which puts the bootstrap in place
    before the training's Python starts, succeeds whatever happens (a failing hook restarts the
    sidecar and holds the training meanwhile)."""
    fields = inject({"containers": [{"name": "pytorch", "image": "pytorch/pytorch"}]},
                    InjectionSettings("registry.example/stepscope:test", "IfNotPresent", "stepscope-hmac", "key"))
    assert fields is not None
    (sidecar,) = fields["initContainers"]
    assert "startupProbe" not in sidecar
    hook = sidecar["lifecycle"]["postStart"]["exec"]["command"]
    env = {"PATH": os.environ["PATH"], "STEPSCOPE_DIR": str(tmp_path / "shared")}  # no key: the Secret is missing
    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).parent / hook[0]), *hook[1:]], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert {"sitecustomize.py", "stepscope_agent"} <= {p.name for p in (tmp_path / "shared" / "bootstrap").iterdir()}
    (tmp_path / "file").write_text("")
    blocked = subprocess.run([str(Path(sys.executable).parent / hook[0]), *hook[1:]], env={**env, "STEPSCOPE_DIR": str(tmp_path / "file" / "x")},
                             capture_output=True, text=True, timeout=60)
    assert blocked.returncode == 0 and "no bootstrap installed" in blocked.stderr
    assert time.monotonic() - started < 30
    refs = [e["valueFrom"][kind] for c in fields["initContainers"] + fields["containers"] for e in c.get("env") or []
            for kind in ("secretKeyRef", "configMapKeyRef") if kind in e.get("valueFrom", {})]
    assert refs and all(ref.get("optional") is True for ref in refs)
    assert all("envFrom" not in c for c in fields["initContainers"])
