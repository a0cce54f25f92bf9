"""CRD structural schemas: pruning, defaulting, validation and CEL rules (placeholder)."""
from __future__ import annotations

from typing import Any

from .resources import ResourceType


def validate_object(t: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    return obj
