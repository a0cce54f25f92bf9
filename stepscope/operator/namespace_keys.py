"""One HMAC key per namespace: the key Secret the injected sidecars of a namespace read, and the key
the operator signs their requests with.

Each namespace's key is HMAC-SHA256(operator key, namespace): whoever can read the Secret in one
namespace can sign requests to that namespace's sidecars only, and the operator needs no Secret
read anywhere to sign (it derives). The Secrets are written outside admission, by reconciling the
namespaces injection covers; the webhook only asks `problem()` and injects nowhere that has none."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from typing import Any

from kubernetes.client.rest import ApiException

from stepscope.operator import kube
from stepscope.operator.settings import OperatorSettings

_CONTEXT = b"stepscope.io/namespace-key/v1\n"
MANAGED_LABEL = {"app.kubernetes.io/managed-by": "stepscope-operator"}


def namespace_key(master: bytes, namespace: str) -> bytes:
    """The key of `namespace`'s sidecars (hex, so it survives env vars and Secret tooling as text)."""
    return hmac.new(master, _CONTEXT + namespace.encode(), hashlib.sha256).hexdigest().encode()


class NamespaceKeys:
    """Which namespaces hold their key Secret; the reconciler writes, the webhook reads."""

    def __init__(self, settings: OperatorSettings, master: bytes) -> None:
        self.settings, self._master = settings, master
        self._ready: set[str] = set()
        self._problems: dict[str, str] = {}
        self._lock = threading.Lock()

    def problem(self, namespace: str) -> str | None:
        """Why pods of `namespace` cannot get a sidecar now, or None when they can."""
        if not self.settings.injects_into(namespace):
            return (
                f"namespace {namespace} is not covered by stepscope injection (kube-system, the operator's "
                "namespace and namespaces outside operator.namespaces never are)"
            )
        with self._lock:
            if namespace in self._ready:
                return None
            why = self._problems.get(namespace, "the operator has not written it yet")
        return f"the key Secret {self.settings.hmac_secret} of namespace {namespace} is not ready: {why}"

    def forget(self, namespace: str) -> None:
        with self._lock:
            self._ready.discard(namespace)
            self._problems.pop(namespace, None)

    def reconcile(self, namespace: str, owner: dict[str, Any] | None = None) -> bool:
        """Write the namespace's key Secret (create, or patch it back to the key when it exists);
        True when the namespace is ready. Needs `secrets: create` and `patch` on that one name.
        `owner` (the chart's webhook configuration) makes the Secret go with it on uninstall."""
        s = self.settings
        data = {s.hmac_secret_key: base64.b64encode(namespace_key(self._master, namespace)).decode()}
        meta: dict[str, Any] = {"labels": MANAGED_LABEL, **({"ownerReferences": [owner]} if owner else {})}
        try:
            try:
                kube.core().create_namespaced_secret(
                    namespace, {"metadata": {"name": s.hmac_secret, **meta}, "type": "Opaque", "data": data}
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
                kube.core().patch_namespaced_secret(s.hmac_secret, namespace, {"metadata": meta, "data": data})
        except Exception as exc:  # noqa: BLE001 - any failure leaves the namespace un-injected, never a pod refused
            with self._lock:
                self._ready.discard(namespace)
                self._problems[namespace] = kube.describe(exc)
            return False
        with self._lock:
            self._ready.add(namespace)
            self._problems.pop(namespace, None)
        return True
