"""The operator's master HMAC key (stepscope.operator.namespace_keys derives each namespace's from
it), kept in a Secret of the operator's namespace that Helm never renders: `helm template` (Argo
CD, Flux) would render a new random key at every sync, and every running sidecar would then refuse
the operator. The first operator to start creates it; nothing ever overwrites it, so a key the
user created beforehand is the one used."""

from __future__ import annotations

import base64
import secrets
from typing import Any

from kubernetes.client.rest import ApiException

from stepscope.operator import kube
from stepscope.operator.namespace_keys import MANAGED_LABEL
from stepscope.signing import KeyLoadError


def fresh_secret(name: str, field: str) -> dict[str, Any]:
    key = secrets.token_urlsafe(48).encode()
    return {
        "metadata": {"name": name, "labels": MANAGED_LABEL},
        "type": "Opaque",
        "data": {field: base64.b64encode(key).decode()},
    }


def ensure(namespace: str, name: str, field: str) -> bytes:
    """The key in Secret `namespace/name` (data key `field`), created first when there is none.
    Needs `get` on that Secret and `create` on Secrets; two replicas starting together both end
    with the one that was created first."""
    core = kube.core()
    try:
        try:
            secret = core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            secret = kube.create_or_get(
                core.create_namespaced_secret, core.read_namespaced_secret, namespace, fresh_secret(name, field)
            )
    except ApiException as exc:
        raise KeyLoadError(f"cannot read or create the key Secret {namespace}/{name}: {kube.describe(exc)}") from None
    value = base64.b64decode((secret.data or {}).get(field) or "").strip()
    if not value:
        raise KeyLoadError(
            f"the key Secret {namespace}/{name} has no data key {field!r} (or it is empty): delete it to have a key "
            "generated, or put one there"
        )
    return value
