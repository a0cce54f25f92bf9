"""What the API server checks on every object (name, labels, annotations, owner references) and
on the built-in fields stepscope writes (pod containers and env, Job names), with its wording:
these are the mistakes an operator makes that only a real cluster would otherwise catch."""
from __future__ import annotations

import json
import re
from typing import Any

from .resources import ResourceType

Cause = tuple[str, str]
DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*"
LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
ENV_NAME = r"[-._a-zA-Z][-._a-zA-Z0-9]*"
SUBDOMAIN_TEXT = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
                  "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
                  f"'{DNS1123_SUBDOMAIN}')")
LABEL_TEXT = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
              f"end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{DNS1123_LABEL}')")
# Kinds whose names must be RFC 1123 labels rather than subdomains.
LABEL_NAMED = {("", "Namespace"), ("", "Service")}
# RBAC names are path segments ("system:discovery" is fine).
PATH_SEGMENT_NAMED = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
MAX_ANNOTATIONS_BYTES = 256 * 1024


def _name_causes(t: ResourceType, name: str) -> list[Cause]:
    if t.group == "rbac.authorization.k8s.io" and t.kind in PATH_SEGMENT_NAMED:
        bad = name in (".", "..") or "/" in name or "%" in name
        return [("metadata.name", f'Invalid value: "{name}": may not contain \'/\' or \'%\'')] if bad else []
    if (t.group, t.kind) in LABEL_NAMED:
        if len(name) > 63:
            return [("metadata.name", f'Invalid value: "{name}": must be no more than 63 characters')]
        return [] if re.fullmatch(DNS1123_LABEL, name) else [("metadata.name", f'Invalid value: "{name}": {LABEL_TEXT}')]
    if len(name) > 253:
        return [("metadata.name", f'Invalid value: "{name}": must be no more than 253 characters')]
    return [] if re.fullmatch(DNS1123_SUBDOMAIN, name) else [("metadata.name", f'Invalid value: "{name}": {SUBDOMAIN_TEXT}')]


def _key_causes(field: str, key: str) -> list[Cause]:
    prefix, _, name = key.rpartition("/")
    causes = []
    if prefix and (len(prefix) > 253 or not re.fullmatch(DNS1123_SUBDOMAIN, prefix)):
        causes.append((field, f'Invalid value: "{key}": prefix part {SUBDOMAIN_TEXT}'))
    if len(name) > 63 or not re.fullmatch(QUALIFIED_NAME, name):
        causes.append((field, f'Invalid value: "{key}": name part must consist of alphanumeric characters, \'-\', \'_\' or '
                              "'.', and must start and end with an alphanumeric character and be no more than 63 characters"))
    return causes


def label_value_causes(field: str, value: Any) -> list[Cause]:
    if not isinstance(value, str):
        return [(field, f"Invalid value: {json.dumps(value)}: label values must be strings")]
    if len(value) > 63:
        return [(field, f'Invalid value: "{value}": must be no more than 63 characters')]
    if not re.fullmatch(LABEL_VALUE, value):
        return [(field, f'Invalid value: "{value}": a valid label must be an empty string or consist of alphanumeric '
                        "characters, '-', '_' or '.', and must start and end with an alphanumeric character")]
    return []


def metadata_causes(t: ResourceType, obj: dict[str, Any]) -> list[Cause]:
    meta = obj.get("metadata") or {}
    causes = _name_causes(t, meta.get("name", ""))
    for key, value in (meta.get("labels") or {}).items():
        causes += _key_causes("metadata.labels", key) + label_value_causes("metadata.labels", value)
    annotations = meta.get("annotations") or {}
    for key in annotations:
        causes += _key_causes("metadata.annotations", key)
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > MAX_ANNOTATIONS_BYTES:
        causes.append(("metadata.annotations", "Too long: must have at most 262144 bytes"))
    for n, ref in enumerate(meta.get("ownerReferences") or []):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                causes.append((f"metadata.ownerReferences[{n}].{key}", f'Invalid value: "": {key} must not be empty'))
    return causes


def _container_causes(path: str, containers: list[dict[str, Any]]) -> list[Cause]:
    causes = []
    for n, container in enumerate(containers):
        name = container.get("name", "")
        if not re.fullmatch(DNS1123_LABEL, name) or len(name) > 63:
            causes.append((f"{path}[{n}].name", f'Invalid value: "{name}": {LABEL_TEXT}'))
        if not container.get("image"):
            causes.append((f"{path}[{n}].image", "Required value"))
        for m, env in enumerate(container.get("env") or []):
            if not re.fullmatch(ENV_NAME, env.get("name", "")):
                causes.append((f"{path}[{n}].env[{m}].name", f'Invalid value: "{env.get("name", "")}": a valid environment '
                               "variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit"))
    names = [c.get("name") for c in containers]
    causes += [(f"{path}[{n}].name", f'Duplicate value: "{name}"') for n, name in enumerate(names) if name in names[:n]]
    return causes


def pod_spec_causes(path: str, spec: dict[str, Any]) -> list[Cause]:
    if not spec.get("containers"):
        return [(f"{path}.containers", "Required value")]
    causes = _container_causes(f"{path}.containers", spec["containers"]) + _container_causes(f"{path}.initContainers", spec.get("initContainers") or [])
    volumes = [v.get("name") for v in spec.get("volumes") or []]
    causes += [(f"{path}.volumes[{n}].name", f'Duplicate value: "{name}"') for n, name in enumerate(volumes) if name in volumes[:n]]
    return causes


def builtin_causes(t: ResourceType, obj: dict[str, Any]) -> list[Cause]:
    """The checks of the built-in kinds whose objects stepscope creates or changes."""
    if (t.group, t.kind) == ("", "Pod"):
        return pod_spec_causes("spec", obj.get("spec") or {})
    if (t.group, t.kind) == ("batch", "Job"):
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        causes = pod_spec_causes("spec.template.spec", template.get("spec") or {})
        if (template.get("spec") or {}).get("restartPolicy") not in ("Never", "OnFailure"):
            causes.append(("spec.template.spec.restartPolicy", 'Required value: valid values: "OnFailure", "Never"'))
        # The Job controller labels its pods job-name=<name>: a label value, so at most 63 characters.
        return causes + label_value_causes("spec.template.labels", obj["metadata"]["name"])
    return []
