"""Server-side printing (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), what kubectl
shows: a CRD's additionalPrinterColumns evaluated against each object."""
from __future__ import annotations

import datetime
import re
from typing import Any

from .resources import ResourceType

_SEGMENT = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def json_path(obj: Any, path: str) -> Any:
    """The simple JSONPaths printer columns use: `.status.items[0].name`; None when absent."""
    value = obj
    for field, index in _SEGMENT.findall(path):
        if field:
            value = value.get(field) if isinstance(value, dict) else None
        else:
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
    return value


def human_age(timestamp: str, now: datetime.datetime) -> str:
    """Short ages like kubectl's: 45s, 12m, 5h, 3d."""
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 3 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _cell(kind: str, value: Any, now: datetime.datetime) -> Any:
    if value is None:
        return None
    if kind == "date":
        return human_age(value, now) if isinstance(value, str) else None
    if kind == "integer":
        return int(value) if isinstance(value, (int, float)) else None
    if kind == "number":
        return float(value) if isinstance(value, (int, float)) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    return value if isinstance(value, str) else str(value)


def table(t: ResourceType, items: list[dict[str, Any]], resource_version: str) -> dict[str, Any]:
    columns = t.printer_columns or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    definitions = [{"name": "Name", "type": "string", "format": "name", "description": "Name of the object", "priority": 0}]
    definitions += [{"name": c["name"], "type": c["type"], "format": c.get("format", ""),
                     "description": c.get("description", ""), "priority": c.get("priority", 0)} for c in columns]
    now = datetime.datetime.now(datetime.UTC)
    rows = [{"cells": [obj["metadata"]["name"], *(_cell(c["type"], json_path(obj, c["jsonPath"]), now) for c in columns)],
             "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}}
            for obj in items]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": definitions, "rows": rows}
