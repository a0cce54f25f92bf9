"""CustomResourceDefinition schemas as the API server applies them to custom resources:
pruning of unknown fields, defaulting, OpenAPI v3 value validation and the CEL rules in
`x-kubernetes-validations`, with the API server's error wording. Also the structural-schema
and rule-compilation checks the API server runs when a CRD is created."""
from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import celpy
from celpy import celtypes

from . import errors
from .object_rules import builtin_causes, metadata_causes, pod_update_causes
from .resources import ResourceType

Schema = dict[str, Any]
Cause = tuple[str, str]
ROOT_FIELDS = ("apiVersion", "kind", "metadata")
# Keys a structural schema may not use (they make pruning and defaulting ambiguous).
NON_STRUCTURAL = ("$ref", "definitions", "dependencies", "patternProperties", "additionalItems")
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _preserves(schema: Schema) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-embedded-resource"))


def _fields(value: dict[str, Any], schema: Schema, root: bool) -> Iterator[tuple[str, Any, Schema]]:
    """(key, value, schema) of the fields the schema describes; the root's apiVersion, kind and
    metadata belong to the API server, not to the CRD's schema."""
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if root and key in ROOT_FIELDS:
            continue
        sub = props.get(key, extra if isinstance(extra, dict) else None)
        if sub is not None:
            yield key, item, sub


# -- pruning and defaulting ----------------------------------------------------------------------
def prune(value: Any, schema: Schema, root: bool = False) -> Any:
    """Drop fields the schema does not know and nulls of non-nullable fields."""
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        result = {}
        for key, item in value.items():
            if root and key in ROOT_FIELDS:
                result[key] = item
                continue
            sub = (props or {}).get(key, extra if isinstance(extra, dict) else None)
            if sub is None:
                if _preserves(schema) or extra is True:
                    result[key] = item
                continue
            if item is None and not sub.get("nullable"):
                continue
            result[key] = prune(item, sub)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"]) for item in value]
    return value


def apply_defaults(value: Any, schema: Schema) -> Any:
    if isinstance(value, dict) and schema.get("type") == "object":
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in [k for k in value if k not in (schema.get("properties") or {})]:
                value[key] = apply_defaults(value[key], extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


# -- OpenAPI value validation --------------------------------------------------------------------
def _shown(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, TYPES[kind]) if kind in TYPES else True


def _bounds(value: Any, schema: Schema, path: str) -> list[Cause]:
    causes = []
    if "maximum" in schema:
        top, exclusive = schema["maximum"], schema.get("exclusiveMaximum")
        if value > top or exclusive and value == top:
            word = "less than" if exclusive else "less than or equal to"
            causes.append((path, f"Invalid value: {_shown(value)}: {path} in body should be {word} {top}"))
    if "minimum" in schema:
        low, exclusive = schema["minimum"], schema.get("exclusiveMinimum")
        if value < low or exclusive and value == low:
            word = "greater than" if exclusive else "greater than or equal to"
            causes.append((path, f"Invalid value: {_shown(value)}: {path} in body should be {word} {low}"))
    return causes


def _format_ok(value: str, fmt: str | None) -> bool:
    if fmt != "date-time":
        return True
    try:
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return True
    except ValueError:
        return False


def _list_causes(value: list[Any], schema: Schema, path: str) -> list[Cause]:
    causes = []
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        causes.append((path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
    if "minItems" in schema and len(value) < schema["minItems"]:
        causes.append((path, f"Invalid value: {len(value)}: {path} in body should have at least {schema['minItems']} items"))
    list_type = schema.get("x-kubernetes-list-type")
    if list_type in ("set", "map"):
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen = []
        for n, item in enumerate(value):
            key = tuple(item.get(k) for k in keys) if list_type == "map" and isinstance(item, dict) else item
            if key in seen:
                shown = _shown(item) if list_type == "set" else "{" + ", ".join(f'"{k}":{_shown(v)}' for k, v in zip(keys, key)) + "}"
                causes.append((f"{path}[{n}]", f"Duplicate value: {shown}"))
            seen.append(key)
    return causes


def validate_value(value: Any, schema: Schema, path: str = "", root: bool = False) -> list[Cause]:
    if value is None:
        return [] if schema.get("nullable") else [(path, f"Invalid value: \"null\": {path} in body must be of type {schema.get('type')}: \"null\"")]
    kind = schema.get("type")
    if kind and not _type_ok(value, kind):
        if schema.get("x-kubernetes-int-or-string") and isinstance(value, (int, str)):
            return []
        actual = {dict: "object", list: "array", str: "string", bool: "boolean"}.get(type(value), "number")
        return [(path, f"Invalid value: {_shown(value)}: {path} in body must be of type {kind}: \"{actual}\"")]
    causes: list[Cause] = []
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_shown(v) for v in schema["enum"])
        causes.append((path, f"Unsupported value: {_shown(value)}: supported values: {supported}"))
    if kind in ("integer", "number"):
        causes += _bounds(value, schema, path)
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append((path, f"Too long: may not be more than {schema['maxLength']} bytes"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append((path, f"Invalid value: {_shown(value)}: {path} in body should be at least {schema['minLength']} chars long"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            causes.append((path, f"Invalid value: {_shown(value)}: {path} in body should match '{schema['pattern']}'"))
        if not _format_ok(value, schema.get("format")):
            causes.append((path, f"Invalid value: {_shown(value)}: {path} in body must be of type {schema['format']}: {_shown(value)}"))
    if isinstance(value, list):
        causes += _list_causes(value, schema, path)
        for n, item in enumerate(value):
            causes += validate_value(item, schema.get("items") or {}, f"{path}[{n}]")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                causes.append((_join(path, key), "Required value"))
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            causes.append((path, f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"))
        for key, item, sub in _fields(value, schema, root):
            causes += validate_value(item, sub, _join(path, key))
    return causes


# -- CEL rules -----------------------------------------------------------------------------------
_ENV = celpy.Environment()


@lru_cache(maxsize=512)
def compile_rule(rule: str) -> celpy.Runner:
    """Compile once; raises celpy.CELParseError on a rule the API server would refuse."""
    return _ENV.program(_ENV.compile(rule))


def to_cel(value: Any, schema: Schema) -> Any:
    """JSON as CEL sees it through the schema: `number` fields are doubles even when written as 3."""
    kind = schema.get("type")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else {}
        return celtypes.MapType({celtypes.StringType(k): to_cel(v, props.get(k, extra)) for k, v in value.items()})
    if isinstance(value, list):
        return celtypes.ListType([to_cel(v, schema.get("items") or {}) for v in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, (int, float)):
        return celtypes.DoubleType(value) if kind == "number" or isinstance(value, float) and kind != "integer" else celtypes.IntType(int(value))
    if isinstance(value, str):
        return celtypes.StringType(value)
    return value


# cel-python's wording of a missing field, said as Kubernetes' CEL says it.
_NO_SUCH_KEY = re.compile(r"no such member in mapping: '([^']*)'")


def _uses_old_self(rule: str) -> bool:
    return re.search(r"\boldSelf\b", rule) is not None


def _rule_causes(value: Any, old: Any, schema: Schema, path: str) -> list[Cause]:
    causes = []
    for rule in schema.get("x-kubernetes-validations", []):
        expr = rule["rule"]
        transition = _uses_old_self(expr)
        if transition and old is None:
            continue  # transition rules run on updates only, when the old value exists
        activation = {"self": to_cel(value, schema)}
        if transition:
            activation["oldSelf"] = to_cel(old, schema)
        field = path + rule.get("fieldPath", "") if path or rule.get("fieldPath") else path
        field = field.lstrip(".")
        try:
            result = compile_rule(expr).evaluate(activation)
        except celpy.CELEvalError as e:
            result = e
        if isinstance(result, celpy.CELEvalError):
            # Like the API server: the node's path (not fieldPath), its type, the message or else the rule.
            reason = _NO_SUCH_KEY.sub(r"no such key: \1", str(result.args[0] if result.args else result))
            shown = (rule.get("message") or "").strip() or expr.strip()
            causes.append((path, f"Invalid value: \"{schema.get('type', 'object')}\": {reason} evaluating rule: {shown}"))
        elif not bool(result):
            message = _message(rule, activation)
            if rule.get("reason") == "FieldValueForbidden":
                causes.append((field, f"Forbidden: {message}"))
            else:
                # Kubernetes 1.36 shows a scalar node's value, and no value for an object or array node.
                shown = "" if schema.get("type", "object") in ("object", "array") else f"{_shown(value)}: "
                causes.append((field, f"Invalid value: {shown}{message}"))
    return causes


def _message(rule: dict[str, Any], activation: dict[str, Any]) -> str:
    """messageExpression wins when it yields a string, then message, then the API server's default."""
    if rule.get("messageExpression"):
        try:
            text = compile_rule(rule["messageExpression"]).evaluate(activation)
        except celpy.CELEvalError:
            text = None
        if isinstance(text, str) and text:
            return str(text)
    return rule.get("message") or f"failed rule: {rule['rule']}"


def validate_rules(value: Any, old: Any, schema: Schema, path: str = "", root: bool = False) -> list[Cause]:
    """Every x-kubernetes-validations rule on the nodes present in `value`, deepest last."""
    if value is None:
        return []
    causes = _rule_causes(value, old, schema, path)
    if isinstance(value, dict) and schema.get("type") == "object":
        for key, item, sub in _fields(value, schema, root):
            old_item = old.get(key) if isinstance(old, dict) else None
            causes += validate_rules(item, old_item, sub, _join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys") if schema.get("x-kubernetes-list-type") == "map" else None
        for n, item in enumerate(value):
            # oldSelf of a list item is only known for map lists (items correlate by key).
            old_item = next((o for o in old or [] if keys and all(o.get(k) == item.get(k) for k in keys)), None)
            causes += validate_rules(item, old_item, schema["items"], f"{path}[{n}]")
    return causes


# -- the hook the store calls --------------------------------------------------------------------
def validate_object(t: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """Check any object (custom resources also pruned and defaulted first); raise 422 Invalid."""
    if t.builtin:
        if t.kind == "CustomResourceDefinition" and t.group == "apiextensions.k8s.io":
            check_crd(obj)
        causes = metadata_causes(t, obj) + builtin_causes(t, obj)
        if old is not None and (t.group, t.kind) == ("", "Pod"):
            causes += pod_update_causes(obj, old)
    else:
        if t.schema:
            obj = apply_defaults(prune(obj, t.schema, root=True), t.schema)
        causes = metadata_causes(t, obj) + _schema_causes(t.schema or {}, obj, old)
    if causes:
        raise errors.invalid(t.kind, t.group, obj["metadata"]["name"], [(f or "<nil>", m) for f, m in causes])
    return obj


def _schema_causes(schema: Schema, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    causes = validate_value(obj, schema, root=True)
    # Like the API server, wrong types and unsupported enum values keep the CEL rules from running.
    if any("must be of type" in m or m.startswith("Unsupported value") for _, m in causes):
        return causes + [("", "some validation rules were not checked because the object was invalid; "
                              "correct the existing errors to complete validation")]
    return causes + validate_rules(obj, old, schema, root=True)


# -- CRD checks ----------------------------------------------------------------------------------
RULE_REASONS = ("FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate")
COLUMN_TYPES = ("integer", "number", "string", "boolean", "date")
_FIELD_PATH_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\['([^']+)'\]")


def _field_path_valid(schema: Schema, field_path: str) -> bool:
    """A rule's fieldPath must name a property below the rule's node (`.a.b`, `['key']`)."""
    node, at = schema, 0
    while at < len(field_path):
        step = _FIELD_PATH_STEP.match(field_path, at)
        if not step:
            return False
        key = step.group(1) or step.group(2)
        extra = node.get("additionalProperties")
        node = (node.get("properties") or {}).get(key, extra if isinstance(extra, dict) else None)
        if node is None:
            return False
        at = step.end()
    return True


_FIELD_CHAIN = re.compile(r"\b(?:self|oldSelf)((?:\.[A-Za-z_][A-Za-z0-9_]*)+)(\s*\()?")


def _undefined_fields(expr: str, schema: Schema, root: bool) -> list[str]:
    """Fields a rule selects (`self.a.b`, `has(self.a)`) that its schema does not declare: the API
    server type-checks rules against the schema when the CRD is created. A map's keys
    (additionalProperties) and whatever follows a method call are not checked."""
    undefined = []
    for chain, call in _FIELD_CHAIN.findall(expr):
        steps = chain.lstrip(".").split(".")
        if call:
            steps = steps[:-1]  # the last one is a method: self.x.matches(...)
        node, at_root = schema, root
        for step in steps:
            if isinstance(node.get("additionalProperties"), dict) or _preserves(node):
                break
            props = node.get("properties") or {}
            if step not in props and not (at_root and step in ROOT_FIELDS):
                undefined.append(step)
                break
            node, at_root = props.get(step, {"x-kubernetes-preserve-unknown-fields": True}), False
    return undefined


def _rule_errors(schema: Schema, path: str, root: bool = False) -> list[str]:
    """What the API server checks on each x-kubernetes-validations entry: the expressions
    compile, the message is one line, the reason is known, the fieldPath exists."""
    problems = []
    for n, rule in enumerate(schema.get("x-kubernetes-validations", [])):
        at = f"{path}.x-kubernetes-validations[{n}]"
        if not str(rule.get("rule", "")).strip():
            problems.append(f"{at}.rule: Required value: rule is not specified")
        for key in ("rule", "messageExpression"):
            if rule.get(key):
                try:
                    compile_rule(rule[key])
                except celpy.CELParseError as e:
                    problems.append(f"{at}.{key}: Invalid value: compilation failed: {e}")
                    continue
                for field in _undefined_fields(rule[key], schema, root):
                    problems.append(f"{at}.{key}: Invalid value: compilation failed: undefined field '{field}'")
        message = rule.get("message")
        if message is not None and not message.strip():
            problems.append(f"{at}.message: Invalid value: \"{message}\": message must be non-empty if specified")
        if message and "\n" in message:
            problems.append(f"{at}.message: Invalid value: \"{message}\": message must not contain line breaks")
        if "reason" in rule and rule["reason"] not in RULE_REASONS:
            supported = ", ".join(f'"{r}"' for r in RULE_REASONS)
            problems.append(f"{at}.reason: Unsupported value: \"{rule['reason']}\": supported values: {supported}")
        if rule.get("fieldPath") and not _field_path_valid(schema, rule["fieldPath"]):
            problems.append(f"{at}.fieldPath: Invalid value: \"{rule['fieldPath']}\": fieldPath must be a valid path")
    return problems


def _list_type_errors(schema: Schema, path: str) -> list[str]:
    list_type, keys = schema.get("x-kubernetes-list-type"), schema.get("x-kubernetes-list-map-keys")
    if list_type != "map":
        return [f"{path}.x-kubernetes-list-map-keys: Forbidden: must only be used if x-kubernetes-list-type is map"] if keys else []
    if not keys:
        return [f"{path}.x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map"]
    items = schema.get("items") or {}
    return [f"{path}.items.properties[{key}].default: Required value: this property is in x-kubernetes-list-map-keys, "
            "so it must have a default or be a required property"
            for key in keys if key not in items.get("required", []) and "default" not in (items.get("properties") or {}).get(key, {})]


def _default_errors(schema: Schema, path: str) -> list[str]:
    """The API server validates every `default` when the CRD is created: pruned already, valid
    against its node's schema, and passing the CEL rules of its node and below (with oldSelf =
    the default itself). Nested defaults are NOT applied to it first: a default `{}` is checked
    as `{}`."""
    if "default" not in schema:
        return []
    default, at = schema["default"], f"{path}.default"
    if prune(copy.deepcopy(default), schema) != default:
        return [f"{at}: Invalid value: {_shown(default)}: must not have unknown fields"]
    causes = validate_value(default, schema, at) or validate_rules(default, default, schema, at)
    return [f"{field}: {message}" for field, message in causes]


def structural_errors(schema: Schema, path: str = "openAPIV3Schema", root: bool = True) -> list[str]:
    """What makes a schema non-structural or otherwise refused when a CRD is created: untyped
    nodes, rules that do not compile or point nowhere, list-map keys, defaults that do not pass
    their own schema and rules."""
    problems = []
    for key in NON_STRUCTURAL:
        if key in schema:
            problems.append(f"{path}.{key}: Forbidden: must not be used in a structural schema")
    if not schema.get("type") and not _preserves(schema) and not schema.get("x-kubernetes-int-or-string"):
        problems.append(f"{path}.type: Required value: must not be empty for specified object fields")
    if schema.get("properties") and isinstance(schema.get("additionalProperties"), dict):
        problems.append(f"{path}.additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive")
    if root and schema.get("type") != "object":
        problems.append(f"{path}.type: Invalid value: must be object at the root")
    problems += _rule_errors(schema, path, root) + _list_type_errors(schema, path) + _default_errors(schema, path)
    for key, sub in (schema.get("properties") or {}).items():
        if root and key == "metadata" and set(sub) - {"type", "description"}:
            problems.append(f"{path}.properties[{key}]: Forbidden: must not specify anything other than name and generateName")
        problems += structural_errors(sub, f"{path}.properties[{key}]", root=False)
    if isinstance(schema.get("items"), dict):
        problems += structural_errors(schema["items"], f"{path}.items", root=False)
    if isinstance(schema.get("additionalProperties"), dict):
        problems += structural_errors(schema["additionalProperties"], f"{path}.additionalProperties", root=False)
    return problems


def _column_causes(columns: list[dict[str, Any]], path: str) -> list[Cause]:
    causes = []
    for n, column in enumerate(columns):
        at = f"{path}[{n}]"
        for key in ("name", "type", "jsonPath"):
            if not column.get(key):
                causes.append((f"{at}.{key}", "Required value"))
        if column.get("type") and column["type"] not in COLUMN_TYPES:
            supported = ", ".join(f'"{t}"' for t in COLUMN_TYPES)
            causes.append((f"{at}.type", f"Unsupported value: \"{column['type']}\": supported values: {supported}"))
    return causes


def check_crd(crd: dict[str, Any]) -> None:
    """Refuse (422) a CRD the API server would refuse: wrong name, not one storage version, a
    version without a structural schema, bad rules, defaults or printer columns. Like the API
    server, a schema shared by every version is reported under spec.validation (its internal
    form), per version otherwise."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    name = crd["metadata"]["name"]
    versions = spec.get("versions") or []
    causes = []
    if not spec.get("group") or not names.get("plural") or not names.get("kind"):
        causes.append(("spec", "Required value: group, names.plural and names.kind are required"))
    elif name != f"{names['plural']}.{spec['group']}":
        causes.append(("metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'))
    if sum(1 for v in versions if v.get("storage")) != 1:
        causes.append(("spec.versions", "Invalid value: must have exactly one version marked as storage version"))
    schemas = [(version.get("schema") or {}).get("openAPIV3Schema") for version in versions]
    shared = len(schemas) > 0 and all(s == schemas[0] for s in schemas)
    for n, schema in enumerate(schemas[:1] if shared else schemas):
        at = "spec.validation.openAPIV3Schema" if shared else f"spec.versions[{n}].schema.openAPIV3Schema"
        if schema is None:
            causes.append((at, "Required value: schemas are required"))
            continue
        for problem in structural_errors(schema, at):
            field, _, message = problem.partition(": ")
            causes.append((field, message))
    for n, version in enumerate(versions):
        causes += _column_causes(version.get("additionalPrinterColumns") or [], f"spec.versions[{n}].additionalPrinterColumns")
    if causes:
        raise errors.invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, causes)
