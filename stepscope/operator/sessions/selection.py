"""Which pods a session profiles: Running pods matched by the session's label selector that run a
sidecar, i.e. declare a container port named `stepscope` (the port tells us where it listens)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from stepscope.contracts.session import SpecError
from stepscope.contracts.wire import PORT_NAME as SIDECAR_PORT_NAME
from stepscope.operator.settings import INJECT_LABEL, INJECTED_ANNOTATION


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
# Kubernetes' label syntax (apimachinery validation.IsQualifiedName / IsValidLabelValue): the API
# server answers 400 to a list whose selector breaks it, so a session says so instead of retrying.
_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _label_key_problem(key: Any) -> str | None:
    if not isinstance(key, str) or not key:
        return "is empty"
    prefix, _, name = key.rpartition("/")
    if "/" in prefix or (key.count("/") == 1 and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix))):
        return "has an invalid prefix (a DNS subdomain, then '/')"
    if len(name) > 63 or not _NAME.match(name):
        return "must be at most 63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


def _check_label(key: Any, values: list[Any], field: str) -> None:
    problem = _label_key_problem(key)
    if problem:
        raise SpecError(f"{field}: label key {key!r} {problem}")
    for value in values:
        if not isinstance(value, str) or len(value) > 63 or (value and not _NAME.match(value)):
            raise SpecError(f"{field}: label value {value!r} of {key!r} must be at most 63 characters of letters, digits, "
                            "'-', '_' or '.', starting and ending with a letter or digit (or empty)")


def label_selector(selector: dict[str, Any]) -> str:
    """A LabelSelector (matchLabels + matchExpressions) as the string the list API takes; a key
    or value the API server would refuse is a SpecError naming the field."""
    labels = sorted((selector.get("matchLabels") or {}).items())
    for key, value in labels:
        _check_label(key, [value], "spec.selector.matchLabels")
    parts = [f"{k}={v}" for k, v in labels]
    for n, expr in enumerate(selector.get("matchExpressions") or []):
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        _check_label(key, values, f"spec.selector.matchExpressions[{n}]")
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
