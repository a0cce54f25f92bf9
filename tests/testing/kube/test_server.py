"""The test API server, exercised with the real kubernetes client over HTTP."""
from __future__ import annotations

import contextlib
import json
import socket
from collections import deque
from collections.abc import Iterator
from typing import BinaryIO

import kubernetes
import pytest
import urllib3
from kubernetes.client import ApiException

from stepscope.testing.kube.helpers import GROUP, PLURAL, VERSION, job, owner_ref, pod, refused, session, wait_for


@pytest.fixture
def core(kube):
    return kubernetes.client.CoreV1Api(kube.api_client)


@pytest.fixture
def custom(kube):
    kube.apply_crd()
    return kubernetes.client.CustomObjectsApi(kube.api_client)


def _events(api_call, *args, **kwargs) -> list[tuple[str, str]]:
    """(type, name) of the events a watch with a 1 s server timeout delivers."""
    stream = kubernetes.watch.Watch().stream(api_call, *args, timeout_seconds=1, **kwargs)
    return [(e["type"], (e["object"]["metadata"]["name"] if isinstance(e["object"], dict) else e["object"].metadata.name))
            for e in stream]


def test_discovery_lists_builtin_groups_and_the_crd_once_applied(kube):
    apis = kubernetes.client.ApisApi(kube.api_client)
    groups = {g.name for g in apis.get_api_versions().groups}
    assert {"batch", "apiextensions.k8s.io", "events.k8s.io", "coordination.k8s.io"} <= groups
    assert "stepscope.io" not in groups
    kube.apply_crd()
    assert "stepscope.io" in {g.name for g in apis.get_api_versions().groups}
    response = kube.api_client.call_api(*kube.api_client.param_serialize("GET", f"/apis/{GROUP}/{VERSION}", auth_settings=["BearerToken"]))
    response.read()
    names = {r["name"]: r for r in json.loads(response.data)["resources"]}
    assert names[PLURAL]["kind"] == "ProfileSession" and names[PLURAL]["namespaced"] is True
    assert names[PLURAL]["shortNames"] == ["ps", "profs"]
    assert f"{PLURAL}/status" in names
    core_names = {r.name for r in kubernetes.client.CoreV1Api(kube.api_client).get_api_resources().resources}
    assert {"pods", "pods/status", "events", "secrets", "namespaces"} <= core_names
    assert kubernetes.client.VersionApi(kube.api_client).get_code().major == "1"


def test_requests_without_the_token_are_refused(kube):
    response = urllib3.PoolManager().request("GET", f"{kube.url}/api/v1/namespaces/default/pods")
    assert response.status == 401
    assert json.loads(response.data)["reason"] == "Unauthorized"


def test_crud_with_conflicts_and_not_found(core):
    created = core.create_namespaced_pod("default", pod("p1", {"app": "trainer"}))
    assert created.metadata.uid and created.metadata.generation == 1
    assert created.status.phase == "Pending"
    assert refused(lambda: core.create_namespaced_pod("default", pod("p1")), 409)["reason"] == "AlreadyExists"
    stale = core.read_namespaced_pod("p1", "default")
    core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"x": "1"}}})
    stale.metadata.labels = {"x": "2"}
    assert refused(lambda: core.replace_namespaced_pod("p1", "default", stale), 409)["reason"] == "Conflict"
    stale_patch = {"metadata": {"resourceVersion": stale.metadata.resource_version, "labels": {"x": "4"}}}
    assert refused(lambda: core.patch_namespaced_pod("p1", "default", stale_patch), 409)["reason"] == "Conflict"
    fresh = core.read_namespaced_pod("p1", "default")
    fresh.metadata.labels = {"x": "3"}
    assert core.replace_namespaced_pod("p1", "default", fresh).metadata.labels == {"x": "3"}
    generated = core.create_namespaced_pod("default", {**pod(""), "metadata": {"generateName": "worker-"}})
    assert generated.metadata.name.startswith("worker-") and len(generated.metadata.name) == len("worker-") + 5
    core.delete_namespaced_pod("p1", "default")
    assert refused(lambda: core.read_namespaced_pod("p1", "default"), 404)["message"] == 'pods "p1" not found'
    assert "namespaces" in refused(lambda: core.create_namespaced_pod("nowhere", pod("p2")), 404)["message"]


def test_label_and_field_selectors(core, kube):
    kube.create_namespace("other")
    core.create_namespaced_pod("default", pod("a", {"app": "trainer", "role": "master"}))
    core.create_namespaced_pod("default", pod("b", {"app": "trainer", "role": "worker"}))
    core.create_namespaced_pod("default", pod("c", {"app": "web"}))
    core.create_namespaced_pod("other", pod("d", {"app": "trainer"}))

    def names(**kw) -> list[str]:
        return sorted(p.metadata.name for p in core.list_namespaced_pod("default", **kw).items)

    assert names(label_selector="app=trainer") == ["a", "b"]
    assert names(label_selector="app==trainer,role!=master") == ["b"]
    assert names(label_selector="role in (master, worker)") == ["a", "b"]
    assert names(label_selector="role notin (master)") == ["b", "c"]
    assert names(label_selector="!role") == ["c"]
    assert names(label_selector="role") == ["a", "b"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.name!=b,status.phase=Pending") == ["a", "c"]
    everywhere = core.list_pod_for_all_namespaces(label_selector="app=trainer").items
    assert sorted((p.metadata.namespace, p.metadata.name) for p in everywhere) == [("default", "a"), ("default", "b"), ("other", "d")]
    assert "field label not supported" in refused(lambda: names(field_selector="spec.hostname=x"), 400)["message"]


def test_watch_resumes_from_a_resource_version(core):
    core.create_namespaced_pod("default", pod("a"))
    listed = core.list_namespaced_pod("default")
    core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"step": "1"}}})
    core.create_namespaced_pod("default", pod("b"))
    core.delete_namespaced_pod("a", "default")
    assert _events(core.list_namespaced_pod, "default", resource_version=listed.metadata.resource_version) == [
        ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    assert _events(core.list_namespaced_pod, "default") == [("ADDED", "b")]


def test_watch_sees_objects_enter_and_leave_its_selector(core):
    start = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("a", {"app": "web"}))
    core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"app": "trainer"}}})
    core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"step": "2"}}})
    core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"app": "web"}}})
    assert _events(core.list_namespaced_pod, "default", label_selector="app=trainer", resource_version=start) == [
        ("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


def test_watch_from_a_dropped_resource_version_is_gone(core, kube):
    kube.server.call(lambda store: setattr(store, "history", deque(store.history, maxlen=3)))
    start = core.list_namespaced_pod("default").metadata.resource_version
    for n in range(5):
        core.create_namespaced_pod("default", pod(f"p{n}"))
    with pytest.raises(ApiException) as e:  # the client turns the stream's ERROR event into this
        _events(core.list_namespaced_pod, "default", resource_version=start)
    assert e.value.status == 410
    resumed = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("late"))
    assert _events(core.list_namespaced_pod, "default", resource_version=resumed) == [("ADDED", "late")]


def test_strategic_merge_patch_merges_lists_by_key(kube):
    # On a Deployment's pod template: a pod's own spec may change only its images (test_pod_update.py).
    apps = kubernetes.client.AppsV1Api(kube.api_client)
    template = pod("p")
    template["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    template["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    apps.create_namespaced_deployment("default", {"metadata": {"name": "d"}, "spec": {
        "selector": {"matchLabels": {"app": "p"}}, "template": {"metadata": {"labels": {"app": "p"}}, "spec": template["spec"]}}})
    patched = apps.patch_namespaced_deployment("d", "default", {"spec": {"template": {"spec": {
        "containers": [{"name": "train", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]},
                       {"name": "stepscope", "image": "sidecar:1"}],
        "volumes": [{"name": "stepscope", "emptyDir": {}}]}}}}).spec.template
    train, sidecar = patched.spec.containers
    assert train.image == "trainer:1" and sidecar.name == "stepscope"
    assert [(e.name, e.value) for e in train.env] == [("A", "1"), ("B", "3"), ("C", "4")]
    assert [v.name for v in patched.spec.volumes] == ["data", "stepscope"]
    removed = apps.patch_namespaced_deployment("d", "default", {"spec": {"template": {"spec": {"containers": [{"name": "stepscope", "$patch": "delete"}]}}}})
    assert [c.name for c in removed.spec.template.spec.containers] == ["train"]


def test_json_and_merge_patches(core, custom):
    core.create_namespaced_pod("default", pod("p", {"a": "1"}))
    patched = core.patch_namespaced_pod("p", "default", [{"op": "add", "path": "/metadata/labels/b", "value": "2"},
                                                         {"op": "remove", "path": "/metadata/labels/a"}])
    assert patched.metadata.labels == {"b": "2"}
    refused(lambda: core.patch_namespaced_pod("p", "default", [{"op": "test", "path": "/metadata/labels/b", "value": "9"}]), 422)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, session("s", saveRawTrace="master"))
    merged = custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s",
                                                   {"metadata": {"annotations": {"k": "v"}}, "spec": {"saveRawTrace": None}})
    assert merged["metadata"]["annotations"] == {"k": "v"}
    assert merged["spec"]["saveRawTrace"] == "all"  # removed by the patch, defaulted again
    refused(lambda: custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s", {"spec": {"saveRawTrace": "none"}},
                                                          _content_type="application/strategic-merge-patch+json"), 415)


def test_status_subresource_and_generation(custom):
    body = session("s")
    body["status"] = {"phase": "Succeeded"}
    created = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    assert "status" not in created and created["metadata"]["generation"] == 1
    status = custom.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "s", {
        "spec": {"saveRawTrace": "none"}, "status": {"phase": "Pending", "observedGeneration": 1, "unknownField": 1}})
    assert status["status"] == {"phase": "Pending", "observedGeneration": 1}
    assert status["spec"]["saveRawTrace"] == "all" and status["metadata"]["generation"] == 1
    main = custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s", {
        "spec": {"saveRawTrace": "none"}, "status": {"phase": "Failed"}})
    assert main["status"]["phase"] == "Pending" and main["spec"]["saveRawTrace"] == "none"
    assert main["metadata"]["generation"] == 2
    labelled = custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s", {"metadata": {"labels": {"x": "y"}}})
    assert labelled["metadata"]["generation"] == 2
    unchanged = custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s", {"metadata": {"labels": {"x": "y"}}})
    assert unchanged["metadata"]["resourceVersion"] == labelled["metadata"]["resourceVersion"]


def test_finalizers_hold_deletion_until_removed(core):
    body = pod("p")
    body["metadata"]["finalizers"] = ["stepscope.io/cleanup"]
    core.create_namespaced_pod("default", body)
    start = core.list_namespaced_pod("default").metadata.resource_version
    core.delete_namespaced_pod("p", "default")
    held = core.read_namespaced_pod("p", "default")
    assert held.metadata.deletion_timestamp is not None and held.metadata.generation == 2
    assert "no new finalizers" in refused(lambda: core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": ["another/one"]}}), 422)["message"]
    core.patch_namespaced_pod("p", "default", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["stepscope.io/cleanup"]}})
    refused(lambda: core.read_namespaced_pod("p", "default"), 404)
    assert _events(core.list_namespaced_pod, "default", resource_version=start) == [("MODIFIED", "p"), ("DELETED", "p")]


def test_deleting_an_owner_deletes_its_jobs_in_the_background(kube, custom):
    batch = kubernetes.client.BatchV1Api(kube.api_client)
    owner = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, session("s"))
    other = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, session("t"))
    batch.create_namespaced_job("default", job("analysis", [owner_ref(owner)]))
    batch.create_namespaced_job("default", job("shared", [owner_ref(owner), owner_ref(other)]))
    batch.create_namespaced_job("default", job("unrelated", []))
    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s")

    def jobs() -> dict:
        return {j.metadata.name: j for j in batch.list_namespaced_job("default").items}

    wait_for(lambda: "analysis" not in jobs(), what="the owned Job to be collected")
    remaining = jobs()
    assert set(remaining) == {"shared", "unrelated"}
    assert [r.uid for r in remaining["shared"].metadata.owner_references] == [other["metadata"]["uid"]]


def test_orphan_propagation_keeps_dependents(kube, custom):
    batch = kubernetes.client.BatchV1Api(kube.api_client)
    owner = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, session("s"))
    batch.create_namespaced_job("default", job("analysis", [owner_ref(owner)]))
    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s", propagation_policy="Orphan")
    wait_for(lambda: not batch.read_namespaced_job("analysis", "default").metadata.owner_references,
             what="the owner reference to be removed")


def test_deleting_the_crd_removes_its_resources_and_discovery(kube, custom):
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, session("s"))
    kubernetes.client.ApiextensionsV1Api(kube.api_client).delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
    refused(lambda: custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL), 404)
    kube.apply_crd()
    assert custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"] == []


def test_secret_string_data_is_stored_base64_in_data(core):
    core.create_namespaced_secret("default", {"metadata": {"name": "s3"}, "data": {"region": "dXMtZWFzdC0x"},
                                              "stringData": {"accessKeyId": "AKIA", "region": "eu-west-1"}})
    secret = core.read_namespaced_secret("s3", "default")
    assert secret.string_data is None and secret.type == "Opaque"
    assert secret.data == {"accessKeyId": "QUtJQQ==", "region": "ZXUtd2VzdC0x"}
    patched = core.patch_namespaced_secret("s3", "default", {"stringData": {"secretAccessKey": "s"}})
    assert patched.string_data is None and patched.data["secretAccessKey"] == "cw=="


@contextlib.contextmanager
def _raw_watch(kube, query: str) -> Iterator[BinaryIO]:
    """A watch over a bare socket: the HTTP response as a byte stream (the client library hides
    bookmarks and cannot be made to drop its connection on demand)."""
    host, port = kube.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock, sock.makefile("rb") as stream:
        sock.sendall(f"GET /api/v1/namespaces/default/pods?{query} HTTP/1.1\r\nHost: {host}\r\n"
                     f"Authorization: Bearer {kube.server.token}\r\n\r\n".encode())
        yield stream


def _watch_lines(kube, query: str, count: int) -> list[dict]:
    """The first `count` events of a watch."""
    lines: list[dict] = []
    with _raw_watch(kube, query) as stream:
        while len(lines) < count:
            line = stream.readline()
            if line.startswith(b"{"):
                lines.append(json.loads(line))
    return lines


def test_a_watch_whose_client_leaves_is_dropped(core, kube):
    core.create_namespaced_pod("default", pod("a"))
    with _raw_watch(kube, "watch=true") as stream:
        assert stream.readline().startswith(b"HTTP/1.1 200")
        while not stream.readline().startswith(b'{"type": "ADDED"'):
            pass
        assert kube.server.call(lambda store: len(store.watchers)) == 1
    wait_for(lambda: kube.server.call(lambda store: len(store.watchers)) == 0, what="the watcher to be dropped")


def test_lists_come_in_pages_with_continue_tokens(core):
    for n in range(5):
        core.create_namespaced_pod("default", pod(f"p{n}"))
    first = core.list_namespaced_pod("default", limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"] and first.metadata.remaining_item_count == 3
    core.create_namespaced_pod("default", pod("p5"))
    second = core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    assert [p.metadata.name for p in second.items] == ["p2", "p3"]
    assert second.metadata.resource_version == first.metadata.resource_version
    last = core.list_namespaced_pod("default", limit=10, _continue=second.metadata._continue)
    assert [p.metadata.name for p in last.items] == ["p4", "p5"] and last.metadata._continue is None


def test_continue_tokens_expire_with_the_history(core, kube):
    kube.server.call(lambda store: setattr(store, "history", deque(store.history, maxlen=2)))
    core.create_namespaced_pod("default", pod("a"))
    core.create_namespaced_pod("default", pod("b"))
    first = core.list_namespaced_pod("default", limit=1)
    for n in range(3):
        core.create_namespaced_pod("default", pod(f"later{n}"))
    assert refused(lambda: core.list_namespaced_pod("default", limit=1, _continue=first.metadata._continue), 410)["reason"] == "Expired"


@pytest.fixture
def quick_bookmarks(kube):
    kube.server.api.bookmark_interval_s = 0.2
    return kube


def test_quiet_watches_get_bookmarks_when_allowed(core, quick_bookmarks):
    core.create_namespaced_pod("default", pod("a"))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    events = _watch_lines(quick_bookmarks, f"watch=true&allowWatchBookmarks=true&resourceVersion={rv}", 2)
    assert [e["type"] for e in events] == ["BOOKMARK", "BOOKMARK"]
    assert events[0]["object"] == {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}


def test_initial_events_end_with_a_marked_bookmark(core, quick_bookmarks):
    core.create_namespaced_pod("default", pod("a"))
    core.create_namespaced_pod("default", pod("b"))
    query = "watch=true&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
    events = _watch_lines(quick_bookmarks, query, 3)
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [("ADDED", "a"), ("ADDED", "b"), ("BOOKMARK", None)]
    assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert refused(lambda: core.list_namespaced_pod("default", watch=True, send_initial_events=True, _preload_content=False), 422)
