"""The mutating webhook that adds the sidecar (stepscope.operator.injection says what) to pods
labelled `stepscope.io/inject: "true"`, served by kopf over HTTPS with the operator's own
certificate. Importing this module registers it, so only `stepscope operator --webhook` does."""
from __future__ import annotations

import base64
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf

from stepscope.operator import certs, kube
from stepscope.operator.injection import InjectionSettings, inject
from stepscope.operator.settings import INJECT_LABEL


def ensure_hmac_secret(namespace: str, cfg: InjectionSettings, key: bytes) -> None:
    """Copy the operator's HMAC key into the pod's namespace: a secretKeyRef cannot cross namespaces."""
    core = kube.core()
    body = {"metadata": {"name": cfg.hmac_secret, "labels": {"app.kubernetes.io/managed-by": "stepscope"}},
            "type": "Opaque", "data": {cfg.hmac_key: base64.b64encode(key).decode()}}
    kube.create_or_get(core.create_namespaced_secret, core.read_namespaced_secret, namespace, body)


def inject_sidecar(spec: kopf.Spec, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, dryrun: bool, warnings: list[str], **_: Any) -> None:
    cfg = InjectionSettings.from_operator(memo.ctx.settings)
    fields = inject(dict(spec), cfg)
    if fields is None:
        return
    namespace = meta.get("namespace")
    if namespace and not dryrun:
        ensure_hmac_secret(namespace, cfg, memo.ctx.key)
    elif not namespace:
        warnings.append(f"stepscope: namespace unknown at admission; Secret {cfg.hmac_secret} must exist in the pod's namespace")
    for name, value in fields.items():
        patch.spec[name] = value


class ServiceWebhookServer(kopf.WebhookServer):
    """kopf's HTTPS server whose client config names a Service, as in a cluster the API server
    reaches the operator through one; without a Service it falls back to kopf's URL form."""

    def __init__(self, *, service: str | None, namespace: str | None, service_port: int = 443, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.service, self.service_namespace, self.service_port = service, namespace, service_port

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for config in super().__call__(fn):
            if self.service:
                config = {"service": {"name": self.service, "namespace": self.service_namespace, "port": self.service_port},
                          **({"caBundle": config["caBundle"]} if config.get("caBundle") else {})}
            yield config


def webhook_server(folder: Path | None = None) -> ServiceWebhookServer:
    """From STEPSCOPE_WEBHOOK_* env: the listening address/port, the Service in front of it, and
    the host name the certificate is for."""
    service = os.environ.get("STEPSCOPE_WEBHOOK_SERVICE") or None
    namespace = os.environ.get("STEPSCOPE_WEBHOOK_NAMESPACE") or os.environ.get("POD_NAMESPACE", "stepscope")
    host = os.environ.get("STEPSCOPE_WEBHOOK_HOST") or (f"{service}.{namespace}.svc" if service else "localhost")
    addr = os.environ.get("STEPSCOPE_WEBHOOK_ADDR", "0.0.0.0")
    names = [host, addr] + ([f"{service}.{namespace}.svc.cluster.local", service] if service else []) + ["127.0.0.1"]
    cert = certs.generate(list(dict.fromkeys(names)), folder or Path(tempfile.mkdtemp(prefix="stepscope-webhook-")))
    return ServiceWebhookServer(service=service, namespace=namespace, service_port=int(os.environ.get("STEPSCOPE_WEBHOOK_SERVICE_PORT", 443)),
                                addr=addr, port=int(os.environ.get("STEPSCOPE_WEBHOOK_PORT", 9443)), host=host,
                                certfile=cert.cert_file, pkeyfile=cert.key_file, cadata=cert.ca_pem)


def configure_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.admission.server = webhook_server()
    # kopf keeps this MutatingWebhookConfiguration's webhooks and caBundle in step with the server.
    settings.admission.managed = os.environ.get("STEPSCOPE_WEBHOOK_CONFIG", "stepscope-injector.stepscope.io") or None


def register(registry: kopf.OperatorRegistry) -> None:
    """Put the injection webhook into `registry`, beside the session handlers."""
    kopf.on.mutate("v1", "pods", labels={INJECT_LABEL: "true"}, operations=["CREATE"], id="inject-sidecar",
                   side_effects=True, ignore_failures=True, registry=registry)(inject_sidecar)
    kopf.on.startup(registry=registry)(configure_webhook)
