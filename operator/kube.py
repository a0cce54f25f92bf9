"""The Kubernetes API client the operator's own calls use (kopf has its own for watching).

In a pod the service account is used; elsewhere the kubeconfig ($KUBECONFIG or ~/.kube/config),
which is also how the tests point everything at their API server."""
from __future__ import annotations

import functools
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from stepscope.operator.settings import GROUP, PLURAL, VERSION


@functools.lru_cache(maxsize=1)
def api_client() -> kubernetes.client.ApiClient:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


def reset() -> None:
    """Forget the cached client, so that a new kubeconfig (e.g. of a restarted test server) is read."""
    api_client.cache_clear()


def core() -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api_client())


def batch() -> kubernetes.client.BatchV1Api:
    return kubernetes.client.BatchV1Api(api_client())


def rbac() -> kubernetes.client.RbacAuthorizationV1Api:
    return kubernetes.client.RbacAuthorizationV1Api(api_client())


def custom() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api_client())


def get_session(namespace: str, name: str) -> dict[str, Any]:
    return custom().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def patch_session_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """Merge-patch the status subresource (a JSON merge patch: None deletes a field)."""
    return custom().patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, {"status": status})


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


def create_or_get(create: Any, read: Any, *args: Any) -> Any:
    """Create an object, or return the existing one: an operator restarted between creating and
    recording it must not fail on its own earlier work."""
    try:
        return create(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise
    name = args[-1]["metadata"]["name"]
    return read(name, *args[:-1])
