"""Which pods a session profiles: Running pods matched by the session's label selector that run a
sidecar, i.e. declare a container port named `stepscope` (the port tells us where it listens)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.operator.settings import INJECT_LABEL, INJECTED_ANNOTATION, SIDECAR_PORT_NAME
from stepscope.session import SpecError


@dataclass(frozen=True)
class Target:
    pod: str
    ip: str
    port: int
    node: str = ""

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


_SET_OPERATORS = {"In": "in", "NotIn": "notin"}


def label_selector(selector: dict[str, Any]) -> str:
    """A LabelSelector (matchLabels + matchExpressions) as the string the list API takes."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op in _SET_OPERATORS:
            if not values:
                raise SpecError(f"spec.selector.matchExpressions: operator {op} on {key!r} needs values")
            parts.append(f"{key} {_SET_OPERATORS[op]} ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise SpecError(f"spec.selector.matchExpressions: unknown operator {op!r} on {key!r}; use In, NotIn, Exists or DoesNotExist")
    if not parts:
        raise SpecError("spec.selector is empty: it would select every pod in the namespace; add matchLabels or matchExpressions")
    return ",".join(parts)


def sidecar_port(pod: Any) -> int | None:
    # The injected sidecar is a native sidecar (an init container); a hand-written one may be a
    # regular container.
    for container in [*(pod.spec.init_containers or []), *(pod.spec.containers or [])]:
        for port in container.ports or []:
            if port.name == SIDECAR_PORT_NAME:
                return int(port.container_port)
    return None


def has_sidecar(pod: Any) -> bool:
    return sidecar_port(pod) is not None


def started_without_sidecar(pod: Any) -> bool:
    """Whether a pod asked for the sidecar (the inject label) and was admitted without it."""
    meta = pod.metadata
    return (meta.labels or {}).get(INJECT_LABEL) == "true" and not (meta.annotations or {}).get(INJECTED_ANNOTATION) and not has_sidecar(pod)


def not_injected(pods: list[Any]) -> list[str]:
    return sorted(p.metadata.name for p in pods if started_without_sidecar(p))


def target_of(pod: Any) -> Target | None:
    """The sidecar endpoint of a pod, or None when the pod is not Running or has no sidecar."""
    if (pod.status.phase if pod.status else None) != "Running" or not pod.status.pod_ip:
        return None
    if pod.metadata.deletion_timestamp is not None:
        return None
    port = sidecar_port(pod)
    if port is None:
        return None
    return Target(pod=pod.metadata.name, ip=pod.status.pod_ip, port=port, node=pod.spec.node_name or "")


def select_targets(pods: list[Any]) -> list[Target]:
    targets = [t for t in map(target_of, pods) if t is not None]
    return sorted(targets, key=lambda t: t.pod)
