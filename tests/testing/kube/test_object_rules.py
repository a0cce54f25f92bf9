"""The API server's checks of names, labels, owner references, pods and Jobs, as the test server
answers them (422 Invalid with the field and the API server's wording)."""
from __future__ import annotations

import kubernetes
import pytest

from stepscope.testing.kube.helpers import job, pod, refused


@pytest.fixture
def core(kube):
    return kubernetes.client.CoreV1Api(kube.api_client)


def _causes(call) -> dict[str, str]:
    status = refused(call, 422)
    assert status["reason"] == "Invalid"
    return {c["field"]: c["message"] for c in status["details"]["causes"]}


def test_names_must_be_rfc1123(core):
    causes = _causes(lambda: core.create_namespaced_pod("default", pod("Train_0")))
    assert causes["metadata.name"].startswith('Invalid value: "Train_0": a lowercase RFC 1123 subdomain')
    assert "must be no more than 63 characters" in _causes(lambda: core.create_namespace({"metadata": {"name": "n" * 64}}))["metadata.name"]
    assert core.create_namespaced_pod("default", pod("train-0.worker")).metadata.name == "train-0.worker"


def test_rbac_names_may_contain_colons(kube):
    rbac = kubernetes.client.RbacAuthorizationV1Api(kube.api_client)
    created = rbac.create_cluster_role({"metadata": {"name": "stepscope:operator"}, "rules": []})
    assert created.metadata.name == "stepscope:operator"


def test_labels_and_annotations_are_checked(core):
    causes = _causes(lambda: core.create_namespaced_pod("default", pod("p", {"app": "x" * 64})))
    assert causes["metadata.labels"] == f'Invalid value: "{"x" * 64}": must be no more than 63 characters'
    causes = _causes(lambda: core.create_namespaced_pod("default", pod("p", {"bad key!": "v"})))
    assert "name part must consist of alphanumeric characters" in causes["metadata.labels"]
    body = pod("p", {"stepscope.io/inject": "true"})
    body["metadata"]["annotations"] = {"Not_A.Domain/x": "1"}
    assert "prefix part a lowercase RFC 1123 subdomain" in _causes(lambda: core.create_namespaced_pod("default", body))["metadata.annotations"]


def test_owner_references_need_a_uid(kube):
    batch = kubernetes.client.BatchV1Api(kube.api_client)
    owner = {"apiVersion": "stepscope.io/v1alpha1", "kind": "ProfileSession", "name": "s", "uid": ""}
    causes = _causes(lambda: batch.create_namespaced_job("default", job("analysis", [owner])))
    assert causes["metadata.ownerReferences[0].uid"] == 'Invalid value: "": uid must not be empty'


def test_pods_need_named_containers_with_images(core):
    body = pod("p")
    body["spec"]["containers"] = [{"name": "train", "image": "trainer:1", "env": [{"name": "1BAD", "value": "x"}]},
                                  {"name": "train", "image": ""}]
    causes = _causes(lambda: core.create_namespaced_pod("default", body))
    assert set(causes) == {"spec.containers[0].env[0].name", "spec.containers[1].image", "spec.containers[1].name"}
    assert causes["spec.containers[1].name"] == 'Duplicate value: "train"'
    empty = pod("q")
    empty["spec"]["containers"] = []
    assert _causes(lambda: core.create_namespaced_pod("default", empty)) == {"spec.containers": "Required value"}
    core.create_namespaced_pod("default", pod("ok"))
    # Containers merge by name (an image is all a pod update may change: tests/testing/kube/test_pod_update.py).
    image = [{"name": "train", "image": "trainer:2"}]
    assert [(c.name, c.image) for c in core.patch_namespaced_pod("ok", "default", {"spec": {"containers": image}}).spec.containers] == [("train", "trainer:2")]
    twice = [{"op": "add", "path": "/spec/volumes", "value": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}]}]
    assert _causes(lambda: core.patch_namespaced_pod("ok", "default", twice))["spec.volumes[1].name"] == 'Duplicate value: "v"'


def test_job_names_fit_the_job_name_label_and_restart_policy_is_set(kube):
    batch = kubernetes.client.BatchV1Api(kube.api_client)
    long_name = "analysis-" + "a" * 60
    causes = _causes(lambda: batch.create_namespaced_job("default", job(long_name, [])))
    assert causes == {"spec.template.labels": f'Invalid value: "{long_name}": must be no more than 63 characters'}
    body = job("analysis", [])
    body["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    assert "spec.template.spec.restartPolicy" in _causes(lambda: batch.create_namespaced_job("default", body))
    assert batch.create_namespaced_job("default", job("analysis", [])).metadata.name == "analysis"
