"""The Kubernetes API client the operator's own calls use (kopf has its own for watching).

In a pod the service account is used; elsewhere the kubeconfig ($KUBECONFIG or ~/.kube/config),
which is also how the tests point everything at their API server."""

from __future__ import annotations

import functools
from typing import Any

import kopf
import kubernetes
import msgspec
from kubernetes.client.rest import ApiException

from stepscope.operator.settings import GROUP, PLURAL, VERSION, kubeconfig


@functools.lru_cache(maxsize=1)
def configuration() -> kubernetes.client.Configuration:
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        # $KUBECONFIG is read now, not when the kubernetes package was imported (its default).
        kubernetes.config.load_kube_config(config_file=kubeconfig(), client_configuration=config)
    return config


@functools.lru_cache(maxsize=1)
def api_client() -> kubernetes.client.ApiClient:
    return kubernetes.client.ApiClient(configuration())


def connection_info() -> kopf.ConnectionInfo:
    """kopf's credentials from the same configuration (what kopf.login_via_client does, with the
    kubeconfig path taken from the environment at login time)."""
    config = configuration()
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        username=config.username or None,
        password=config.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


def reset() -> None:
    """Forget the cached client, so that a new kubeconfig (e.g. of a restarted test server) is read."""
    configuration.cache_clear()
    api_client.cache_clear()


def core() -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api_client())


def batch() -> kubernetes.client.BatchV1Api:
    return kubernetes.client.BatchV1Api(api_client())


def rbac() -> kubernetes.client.RbacAuthorizationV1Api:
    return kubernetes.client.RbacAuthorizationV1Api(api_client())


def admission() -> kubernetes.client.AdmissionregistrationV1Api:
    return kubernetes.client.AdmissionregistrationV1Api(api_client())


def custom() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api_client())


class _Port(msgspec.Struct, rename="camel"):
    name: str | None = None
    container_port: int = 0


class _Container(msgspec.Struct):
    ports: list[_Port] | None = None


class _PodSpec(msgspec.Struct, rename="camel"):
    init_containers: list[_Container] | None = None
    containers: list[_Container] | None = None
    node_name: str | None = None


class _PodStatus(msgspec.Struct, rename={"pod_ip": "podIP"}):
    phase: str | None = None
    pod_ip: str | None = None


class _PodMeta(msgspec.Struct, rename="camel"):
    name: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    deletion_timestamp: str | None = None


class Pod(msgspec.Struct):
    """The fields of a pod that choosing and reaching its sidecar reads (stepscope.operator.selection),
    under the kubernetes client's attribute names."""

    metadata: _PodMeta = msgspec.field(default_factory=_PodMeta)
    spec: _PodSpec = msgspec.field(default_factory=_PodSpec)
    status: _PodStatus | None = None


class _PodList(msgspec.Struct):
    items: list[Pod] | None = None


def list_pods(namespace: str, selector: str) -> list[Pod]:
    """The pods `selector` matches, decoded into those fields alone: the client's own models cost
    about 0.2 ms of the operator's CPU a pod, seconds a round at 10,000 pods."""
    response = core().list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    return msgspec.json.decode(response.data, type=_PodList).items or []


def get_session(namespace: str, name: str) -> dict[str, Any]:
    return custom().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def patch_session_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """Merge-patch the status subresource (a JSON merge patch: None deletes a field)."""
    return custom().patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, {"status": status})


def describe(exc: BaseException) -> str:
    """One line for a failed call: never an ApiException's body or headers (they dump the request)."""
    if isinstance(exc, ApiException):
        return f"the API server answered {exc.status} {exc.reason}"
    return f"{exc.__class__.__name__}: {exc}"


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
