"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the part of strategic merge patch that
the fields stepscope touches need: lists of containers, env, volumes, ... merged by their key."""
from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from .errors import ApiError

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

# Field name -> merge key, as the `patchMergeKey` tags of the built-in types say. Field names are
# unique enough across the types served here; `ports` differs between containers and services.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "imagePullSecrets": "name", "conditions": "type", "ownerReferences": "uid", "webhooks": "name",
    "hostAliases": "ip", "topologySpreadConstraints": "topologyKey",
}
# Lists of scalars with patchStrategy=merge: the patch adds to them.
PRIMITIVE_MERGE = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], operations: Any) -> dict[str, Any]:
    if not isinstance(operations, list):
        raise ApiError(400, "BadRequest", "json patch must be a list of operations")
    try:
        return jsonpatch.apply_patch(target, operations)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {e}") from e


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        return "containerPort" if any("containerPort" in i for i in items if isinstance(i, dict)) else "port"
    return MERGE_KEYS.get(field)


def _without_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_without_directives(v) for v in value]
    return value


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    current = list(current) if isinstance(current, list) else []
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [_without_directives(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    if field in PRIMITIVE_MERGE:
        return current + [v for v in patch if v not in current]
    key = _merge_key(field, current + patch)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return _without_directives(patch)
    result = current
    for item in patch:
        index = next((n for n, old in enumerate(result) if isinstance(old, dict) and old.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
        elif index is None:
            result.append(_without_directives(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _without_directives(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
        elif key.startswith("$"):
            continue  # $setElementOrder/..., $retainKeys: ordering and pruning hints
        elif value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def apply_patch(content_type: str, target: dict[str, Any], patch: Any, *, builtin: bool) -> dict[str, Any]:
    kind = content_type.split(";")[0].strip().lower()
    if kind == MERGE_PATCH:
        return merge_patch(target, patch)
    if kind == JSON_PATCH:
        return json_patch(target, patch)
    if kind == STRATEGIC_MERGE_PATCH and builtin:
        return strategic_merge_patch(target, patch)
    raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - accepted media "
                   f"types include: {JSON_PATCH}, {MERGE_PATCH}" + (f", {STRATEGIC_MERGE_PATCH}" if builtin else ""))
