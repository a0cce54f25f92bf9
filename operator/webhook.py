"""The mutating webhook that adds the sidecar to pods labelled `stepscope.io/inject: "true"`.

What it adds: the sidecar as a native sidecar (an init container with restartPolicy Always, so
it is up, and has installed the agent's bootstrap into the shared volume, before any training
process starts), the shared emptyDir mounted in every container, and PYTHONPATH/STEPSCOPE_DIR on
the training containers so that their Python starts the agent with no code change."""
from __future__ import annotations

import base64
import copy
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from stepscope.operator import certs, kube
from stepscope.operator.settings import INJECT_LABEL, SIDECAR_PORT, SIDECAR_PORT_NAME, OperatorSettings

SIDECAR_NAME = "stepscope-sidecar"
VOLUME_NAME = "stepscope-run"
SHARED_DIR = "/var/run/stepscope"
BOOTSTRAP_DIR = f"{SHARED_DIR}/bootstrap"


@dataclass(frozen=True)
class InjectionSettings:
    image: str
    pull_policy: str
    hmac_secret: str
    hmac_key: str
    resources: dict[str, Any] = field(default_factory=lambda: {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}})

    @classmethod
    def from_operator(cls, s: OperatorSettings) -> "InjectionSettings":
        return cls(s.image, s.image_pull_policy, s.hmac_secret, s.hmac_secret_key)


def sidecar_container(cfg: InjectionSettings) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/healthz", "port": SIDECAR_PORT_NAME}, "periodSeconds": 2}
    return {
        "name": SIDECAR_NAME,
        "image": cfg.image,
        "imagePullPolicy": cfg.pull_policy,
        "command": ["stepscope", "sidecar"],
        "restartPolicy": "Always",
        "ports": [{"name": SIDECAR_PORT_NAME, "containerPort": SIDECAR_PORT, "protocol": "TCP"}],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "STEPSCOPE_DIR", "value": SHARED_DIR},
            {"name": "STEPSCOPE_HMAC_KEY", "valueFrom": {"secretKeyRef": {"name": cfg.hmac_secret, "key": cfg.hmac_key}}},
            # NVML sees the node's GPUs without the sidecar requesting any (NVIDIA container runtime).
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        ],
        "startupProbe": {**probe, "failureThreshold": 30},
        "readinessProbe": probe,
        "resources": copy.deepcopy(cfg.resources),
        "volumeMounts": [{"name": VOLUME_NAME, "mountPath": SHARED_DIR}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


def _with_mount(container: dict[str, Any]) -> dict[str, Any]:
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != VOLUME_NAME]
    return {**container, "volumeMounts": mounts + [{"name": VOLUME_NAME, "mountPath": SHARED_DIR}]}


def _with_training_env(container: dict[str, Any]) -> dict[str, Any]:
    env = [dict(e) for e in container.get("env") or [] if e.get("name") != "STEPSCOPE_DIR"]
    existing = next((e for e in env if e.get("name") == "PYTHONPATH"), None)
    if existing is None:
        env.append({"name": "PYTHONPATH", "value": BOOTSTRAP_DIR})
    elif "value" in existing and BOOTSTRAP_DIR not in existing["value"].split(":"):
        existing["value"] = f"{BOOTSTRAP_DIR}:{existing['value']}" if existing["value"] else BOOTSTRAP_DIR
    env.append({"name": "STEPSCOPE_DIR", "value": SHARED_DIR})
    return {**container, "env": env}


def inject(spec: dict[str, Any], cfg: InjectionSettings) -> dict[str, Any] | None:
    """The pod spec fields to replace so the pod runs a sidecar; None when it already has one."""
    init = list(spec.get("initContainers") or [])
    if any(c.get("name") == SIDECAR_NAME for c in init + list(spec.get("containers") or [])):
        return None
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != VOLUME_NAME]
    return {
        "volumes": volumes + [{"name": VOLUME_NAME, "emptyDir": {}}],
        "initContainers": [_with_mount(c) for c in init] + [sidecar_container(cfg)],
        "containers": [_with_mount(_with_training_env(c)) for c in spec.get("containers") or []],
    }


def ensure_hmac_secret(namespace: str, cfg: InjectionSettings, key: bytes) -> None:
    """Copy the operator's HMAC key into the pod's namespace: a secretKeyRef cannot cross namespaces."""
    core = kube.core()
    body = {"metadata": {"name": cfg.hmac_secret, "labels": {"app.kubernetes.io/managed-by": "stepscope"}},
            "type": "Opaque", "data": {cfg.hmac_key: base64.b64encode(key).decode()}}
    kube.create_or_get(core.create_namespaced_secret, core.read_namespaced_secret, namespace, body)


@kopf.on.mutate("v1", "pods", labels={INJECT_LABEL: "true"}, operations=["CREATE"], id="inject-sidecar",
                side_effects=True, ignore_failures=True)
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


@kopf.on.startup()
def configure_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.admission.server = webhook_server()
    # kopf keeps this MutatingWebhookConfiguration's webhooks and caBundle in step with the server.
    settings.admission.managed = os.environ.get("STEPSCOPE_WEBHOOK_CONFIG", "stepscope-injector.stepscope.io") or None
