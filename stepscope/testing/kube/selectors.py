"""Label selectors (equality- and set-based) and field selectors, parsed like the API server does."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import bad_request

Predicate = Callable[[dict[str, Any]], bool]

_SET = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
# Per kind, the fields beyond metadata.name/namespace that the real API server indexes.
FIELD_LABELS = {"Pod": ("spec.nodeName", "status.phase"), "Event": ("involvedObject.name", "involvedObject.uid", "reason")}


def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses: `a in (x,y),b` is two terms."""
    terms, depth, current = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t for t in terms if t.strip()]


def _label_term(term: str) -> Predicate:
    eq = _EQ.match(term)
    if eq:
        key, op, value = eq.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    match = _SET.match(term)
    if not match:
        raise bad_request(f"unable to parse requirement: invalid label selector term {term!r}")
    negated, key, op, values = match.groups()
    if negated and op:
        raise bad_request(f"unable to parse requirement: {term!r}")
    if op:
        allowed = {v.strip() for v in values.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in allowed
        return lambda labels: labels.get(key) not in allowed
    if negated:
        return lambda labels: key not in labels
    return lambda labels: key in labels


def label_selector(selector: str | None) -> Predicate:
    terms = [_label_term(t) for t in _split_terms(selector or "")]
    return lambda obj: all(term(obj.get("metadata", {}).get("labels") or {}) for term in terms)


def _field_value(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def field_selector(selector: str | None, kind: str) -> Predicate:
    supported = ("metadata.name", "metadata.namespace", *FIELD_LABELS.get(kind, ()))
    checks = []
    for term in _split_terms(selector or ""):
        eq = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not eq:
            raise bad_request(f"invalid field selector term {term!r}")
        path, op, value = eq.groups()
        if path not in supported:
            raise bad_request(f'field label not supported: {path}')
        checks.append((path, op == "!=", value))
    return lambda obj: all((_field_value(obj, path) != value) if negate else (_field_value(obj, path) == value)
                           for path, negate, value in checks)

