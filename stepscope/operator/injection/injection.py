"""What injection adds to a pod that opts in with `stepscope.io/inject: "true"` (pure: the
webhook in stepscope.operator.injection.webhook serves it).

The sidecar goes in as a native sidecar (an init container with restartPolicy Always), started
before the training containers; it installs the agent's bootstrap into the shared emptyDir, which
is mounted in every container, and PYTHONPATH/STEPSCOPE_DIR on the training containers make their
Python start the agent with no code change.

The training containers start once the bootstrap is in place, and a broken sidecar never holds
them: the sidecar's postStart hook (`stepscope sidecar --bootstrap-only`) installs the bootstrap
and always succeeds within 20 s (the kubelet starts the next container only after a sidecar's
postStart hook has finished), there is no startupProbe (which would keep the training waiting
until it passed, and for ever on a sidecar that cannot start), and the key is an optional
secretKeyRef (a missing key Secret would stop the pod at CreateContainerConfigError). A sidecar
that does not come up serves no session, and the training runs as without its server. The
kubelet still waits for the sidecar's image to be pulled, as for any init container."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from stepscope.contracts import wire
from stepscope.contracts.wire import DEFAULT_PORT as SIDECAR_PORT
from stepscope.contracts.wire import PORT_NAME as SIDECAR_PORT_NAME
from stepscope.operator.settings import IMAGE_UID, OperatorSettings

SIDECAR_NAME = "stepscope-sidecar"
VOLUME_NAME = "stepscope-run"
SHARED_DIR = wire.DEFAULT_DIR
BOOTSTRAP_DIR = f"{SHARED_DIR}/{wire.BOOTSTRAP_FOLDER}"
# The sidecar's own scratch space: its root filesystem is read-only.
TMP_VOLUME_NAME = "stepscope-tmp"
# Pod Security "restricted" for the sidecar, whatever the pod's own securityContext says.
SIDECAR_SECURITY_CONTEXT = {
    "runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID,
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclass(frozen=True)
class InjectionSettings:
    image: str
    pull_policy: str
    hmac_secret: str
    hmac_key: str
    resources: dict[str, Any] = field(default_factory=lambda: {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}})

    @classmethod
    def from_operator(cls, s: OperatorSettings) -> InjectionSettings:
        return cls(s.image, s.image_pull_policy, s.hmac_secret, s.hmac_secret_key)


def sidecar_container(cfg: InjectionSettings) -> dict[str, Any]:
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
            # The address requests are signed for (docs/wire.md): a request to another pod's sidecar is refused here.
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "STEPSCOPE_DIR", "value": SHARED_DIR},
            {"name": "STEPSCOPE_HMAC_KEY", "valueFrom": {"secretKeyRef": {"name": cfg.hmac_secret, "key": cfg.hmac_key, "optional": True}}},
            # NVML sees the node's GPUs without the sidecar requesting any (NVIDIA container runtime).
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        ],
        "lifecycle": {"postStart": {"exec": {"command": ["stepscope", "sidecar", "--bootstrap-only"]}}},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": SIDECAR_PORT_NAME}, "periodSeconds": 2},
        "resources": copy.deepcopy(cfg.resources),
        "volumeMounts": [{"name": VOLUME_NAME, "mountPath": SHARED_DIR}, {"name": TMP_VOLUME_NAME, "mountPath": "/tmp"}],
        "securityContext": copy.deepcopy(SIDECAR_SECURITY_CONTEXT),
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
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") not in (VOLUME_NAME, TMP_VOLUME_NAME)]
    return {
        "volumes": volumes + [{"name": VOLUME_NAME, "emptyDir": {}}, {"name": TMP_VOLUME_NAME, "emptyDir": {}}],
        "initContainers": [_with_mount(c) for c in init] + [sidecar_container(cfg)],
        "containers": [_with_mount(_with_training_env(c)) for c in spec.get("containers") or []],
    }


def reinject(spec: dict[str, Any]) -> dict[str, Any] | None:
    """On an update of a pod that was injected: the containers' PYTHONPATH, STEPSCOPE_DIR and
    mount put back as injection made them, so that an update that reverts them (`kubectl apply`
    of the original manifest again) leaves the spec as it is, which is all a pod update may do
    there; None when nothing differs. Idempotent, and it never adds a container or a volume."""
    fields = {
        "containers": [_with_mount(_with_training_env(c)) for c in spec.get("containers") or []],
        "initContainers": [c if c.get("name") == SIDECAR_NAME else _with_mount(c) for c in spec.get("initContainers") or []],
    }
    changed = {name: value for name, value in fields.items() if value != (spec.get(name) or [])}
    return changed or None


def warnings(spec: dict[str, Any]) -> list[str]:
    """What keeps the agent from starting in an injected pod, for the client that creates it."""
    return [f"stepscope: container {c.get('name')} sets PYTHONPATH from valueFrom, so the agent's bootstrap ({BOOTSTRAP_DIR}) "
            f"cannot be put on it and no capture will run there; set PYTHONPATH as a value, or include {BOOTSTRAP_DIR} in it"
            for c in spec.get("containers") or []
            for e in c.get("env") or [] if e.get("name") == "PYTHONPATH" and "valueFrom" in e]
