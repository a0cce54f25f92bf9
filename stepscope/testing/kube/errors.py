"""Failures answered as the API server's `Status` objects (same codes, reasons and shapes)."""
from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def not_found(kind_group: str, name: str) -> ApiError:
    resource, _, group = kind_group.partition(".")
    return ApiError(404, "NotFound", f'{kind_group} "{name}" not found',
                    {"name": name, "group": group, "kind": resource})


def already_exists(kind_group: str, name: str) -> ApiError:
    resource, _, group = kind_group.partition(".")
    return ApiError(409, "AlreadyExists", f'{kind_group} "{name}" already exists',
                    {"name": name, "group": group, "kind": resource})


def conflict(kind_group: str, name: str) -> ApiError:
    resource, _, group = kind_group.partition(".")
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {kind_group} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                    {"name": name, "group": group, "kind": resource})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


# field.ErrorType: the reason of a cause, from the words its message starts with.
CAUSE_REASONS = {"Forbidden": "FieldValueForbidden", "Required value": "FieldValueRequired", "Duplicate value": "FieldValueDuplicate",
                 "Unsupported value": "FieldValueNotSupported", "Too long": "FieldValueTooLong", "Too many": "FieldValueTooMany",
                 "Not found": "FieldValueNotFound"}


def cause_reason(message: str) -> str:
    return next((reason for words, reason in CAUSE_REASONS.items() if message.startswith(words)), "FieldValueInvalid")


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid with one cause per (field, message), the message joined like the API server's."""
    qualified = f"{kind}.{group}" if group else kind
    parts = [f"{field}: {message}" if field else message for field, message in causes]
    text = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {text}',
                    {"name": name, "group": group, "kind": kind,
                     "causes": [{"reason": cause_reason(m), "message": m, "field": f} for f, m in causes]})
