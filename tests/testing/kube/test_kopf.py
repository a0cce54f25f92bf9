"""Real kopf against the test API server: the path the operator's tests take."""
from __future__ import annotations

import kopf
import kubernetes
import pytest
from kopf.testing import KopfRunner
from kubernetes.client import ApiException

from stepscope.testing.kube.helpers import GROUP, PLURAL, VERSION, session, wait_for


def _registry() -> kopf.OperatorRegistry:
    """A tiny operator: counts workers on create, follows spec updates, cleans up on delete."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs):
        # A fresh registry has none of kopf's default login handlers; this one reads KUBECONFIG.
        return kopf.login_via_client(**kwargs)

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    def created(body, spec, patch, **_):
        kopf.info(body, reason="Triggered", message="session created, capturing")
        patch.status["phase"] = "Capturing"
        patch.status["workersReady"] = f"0/{len(spec['selector']['matchLabels'])}"

    @kopf.on.update(GROUP, VERSION, PLURAL, field="metadata.labels", registry=registry)
    def relabelled(new, patch, meta, **_):
        patch.status["observedGeneration"] = meta["generation"]
        patch.status["workersReady"] = f"{len(new or {})}/1"

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    def deleted(name, namespace, **_):
        kubernetes.client.CoreV1Api().create_namespaced_config_map(
            namespace, {"metadata": {"name": f"{name}-cleaned"}, "data": {"by": "kopf"}})

    return registry


@pytest.mark.timeout(120)
@pytest.mark.parametrize("listing", ["list-then-watch", "chunked-list", "initial-events-stream"])
def test_kopf_handlers_react_to_a_profile_session(kube, listing):
    kube.apply_crd()
    custom = kubernetes.client.CustomObjectsApi(kube.api_client)
    core = kubernetes.client.CoreV1Api(kube.api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, session("before"))
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 2  # short watches: kopf resumes from resourceVersion often
    settings.watching.chunk_size = 1 if listing == "chunked-list" else None
    settings.watching.initial_streaming = listing == "initial-events-stream"
    args = ["run", "--standalone", "--all-namespaces"]
    with KopfRunner(args, registry=_registry(), settings=settings, timeout=60) as runner:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, session("s"))

        def status() -> dict:
            return custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s").get("status") or {}

        wait_for(lambda: status().get("phase") == "Capturing", what="the create handler's status")
        assert status()["workersReady"] == "0/1"
        before = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "before")
        assert before["status"]["phase"] == "Capturing", "an object that existed before kopf started is handled too"
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s")
        assert obj["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]

        custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s", {"metadata": {"labels": {"team": "a"}}})
        wait_for(lambda: status().get("workersReady") == "1/1", what="the update handler's status")
        assert status()["observedGeneration"] == 1

        def handler_events() -> list[str]:
            events = core.list_namespaced_event("default", field_selector="involvedObject.name=s").items
            return [e.message for e in events if e.reason == "Triggered"]

        wait_for(handler_events, what="kopf's event about the create handler")

        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s")

        def gone() -> bool:
            try:
                custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s")
            except ApiException as e:
                return e.status == 404
            return False

        wait_for(gone, what="kopf to remove its finalizer")
        assert core.read_namespaced_config_map("s-cleaned", "default").data == {"by": "kopf"}
    listed = [path for method, path in kube.server.requests() if method == "GET" and f"/{PLURAL}?" in path]
    if listing == "chunked-list":
        assert any("limit=1" in p and "continue=" in p for p in listed), listed
    if listing == "initial-events-stream":
        assert any("sendInitialEvents=true" in p for p in listed), listed
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None
    assert "Patching failed" not in runner.output
