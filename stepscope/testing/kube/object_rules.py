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


# What ValidatePodUpdate (pkg/apis/core/validation) lets an update of pods/<name> change in the
# spec; anything else is refused with this list (the real message follows it with a unified diff
# of its internal spec as JSON).
UPDATABLE_POD_SPEC_FIELDS = ("`spec.containers[*].image`", "`spec.initContainers[*].image`", "`spec.activeDeadlineSeconds`",
                             "`spec.tolerations` (only additions to existing tolerations)",
                             "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)")


def _spec_diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The changed top-level spec fields, old then new (kube-apiserver prints a unified diff of its
    internal spec as JSON instead: `@@ -376,7 +376,7 @@` and Go field names such as "Env")."""
    lines = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            lines += [f"- {key}: {json.dumps(old.get(key), sort_keys=True)}", f"+ {key}: {json.dumps(new.get(key), sort_keys=True)}"]
    return "\n".join(lines)


def pod_update_causes(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """ValidatePodUpdate's spec checks, in its order: the same number of (init) containers, each
    with an image; activeDeadlineSeconds only set or lowered; tolerations only added (their
    tolerationSeconds may change); schedulingGates only removed; then every other field equal
    once those are taken from the old spec."""
    spec, before = new.get("spec") or {}, old.get("spec") or {}
    causes: list[Cause] = []
    for field in ("containers", "initContainers"):
        now, was = spec.get(field) or [], before.get(field) or []
        if len(now) != len(was):
            return causes + [(f"spec.{field}", "Forbidden: pod updates may not add or remove containers")]
        causes += [(f"spec.{field}[{n}].image", "Required value") for n, c in enumerate(now) if not c.get("image")]
    deadline, old_deadline = spec.get("activeDeadlineSeconds"), before.get("activeDeadlineSeconds")
    if deadline is None and old_deadline is not None:
        causes.append(("spec.activeDeadlineSeconds", "Invalid value: \"null\": must not update from a positive integer to nil value"))
    elif deadline is not None and old_deadline is not None and old_deadline < deadline:
        return causes + [("spec.activeDeadlineSeconds", f"Invalid value: {deadline}: must be less than or equal to previous value")]
    def without_seconds(toleration: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in toleration.items() if k != "tolerationSeconds"}
    tolerations = [without_seconds(t) for t in spec.get("tolerations") or []]
    if any(without_seconds(t) not in tolerations for t in before.get("tolerations") or []):
        causes.append(("spec.tolerations", "Forbidden: existing toleration can not be modified except its tolerationSeconds"))
    old_gates = {g.get("name") for g in before.get("schedulingGates") or []}
    causes += [(f"spec.schedulingGates[{n}].name", f"Forbidden: only deletion is allowed, but found new scheduling gate '{g.get('name')}'")
               for n, g in enumerate(spec.get("schedulingGates") or []) if g.get("name") not in old_gates]
    if spec == before:
        return causes
    munged = json.loads(json.dumps(spec))
    for field in ("containers", "initContainers"):
        for container, was in zip(munged.get(field) or [], before.get(field) or []):
            container["image"] = was.get("image")
    for field in ("activeDeadlineSeconds", "schedulingGates", "tolerations"):
        munged.pop(field, None)
        if field in before:
            munged[field] = before[field]
    grace = before.get("terminationGracePeriodSeconds")
    if grace is not None and grace < 0 and munged.get("terminationGracePeriodSeconds") == 1:
        munged["terminationGracePeriodSeconds"] = grace
    if munged != before:
        causes.append(("spec", f"Forbidden: pod updates may not change fields other than {','.join(UPDATABLE_POD_SPEC_FIELDS)}\n"
                               + _spec_diff(before, munged)))
    return causes
