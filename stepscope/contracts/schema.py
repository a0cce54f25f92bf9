"""How a custom resource's fields are written down once: each field's type, default, bounds and
description on one line of a Record, read both by the parser (Record.from_dict: defaults filled
in, every bound checked, a SpecError naming the field) and by the CRD generator
(stepscope.contracts.openapi). Standard library only and no dataclasses: the agent, which every
Python process of a training pod imports, reads capture requests with these types.
"""

from __future__ import annotations

import json
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any, ClassVar, Self

_MISSING = object()


class SpecError(ValueError):
    """A spec a user must change; the message names the field and says what to change."""


class Rule:
    """A CEL rule of the CRD (x-kubernetes-validations): the API server checks it; the parser
    repeats it where Record.check says so."""

    __slots__ = ("rule", "message", "field_path", "reason")

    def __init__(self, rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> None:
        self.rule, self.message, self.field_path, self.reason = rule, message, field_path, reason

    def schema(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


class Field:
    """One field: its JSON type, default, bounds and description. `record` is the nested Record of
    an object, `items` the Field of an array's elements, `values` that of a map's values."""

    __slots__ = (
        "kind",
        "description",
        "default",
        "required",
        "bounds",
        "rules",
        "record",
        "items",
        "values",
        "omit",
        "name",
    )

    def __init__(
        self,
        kind: str,
        description: str | None,
        *,
        default: Any = _MISSING,
        required: bool = False,
        rules: tuple[Rule, ...] = (),
        record: type[Record] | None = None,
        items: Field | None = None,
        values: Field | None = None,
        omit: tuple[str, ...] = (),
        **bounds: Any,
    ) -> None:
        self.kind, self.description, self.default, self.required = kind, description, default, required
        self.bounds = {k: v for k, v in bounds.items() if v is not None}
        self.rules, self.record, self.items, self.values, self.omit = rules, record, items, values, omit
        self.name = ""

    @property
    def has_default(self) -> bool:
        return self.default is not _MISSING

    def initial(self) -> Any:
        """The value of an absent field: its default, parsed (so `{}` is the nested record's
        defaults), or None."""
        return self.parse(self.default, "") if self.has_default else None

    def parse(self, value: Any, path: str) -> Any:
        """`value` read as this field: the type checked, the bounds applied, records built."""
        kind = self.kind
        if kind == "object" and self.record is not None:
            if not isinstance(value, dict):
                raise SpecError(f"{path} must be an object, got {value!r:.80}")
            return self.record.from_dict(value, path, omit=self.omit)
        if kind == "object":  # a map
            if not isinstance(value, dict):
                raise SpecError(f"{path} must be an object, got {value!r:.80}")
            _check_size(path, len(value), None, self.bounds.get("maxProperties"), "entries")
            assert self.values is not None
            return {str(k): self.values.parse(v, f"{path}.{k}") for k, v in value.items()}
        if kind == "array":
            if not isinstance(value, (list, tuple)):
                raise SpecError(f"{path} must be a list, got {value!r:.80}")
            _check_size(path, len(value), self.bounds.get("minItems"), self.bounds.get("maxItems"), "items")
            assert self.items is not None
            parsed = tuple(self.items.parse(v, f"{path}[{n}]") for n, v in enumerate(value))
            if self.bounds.get("x-kubernetes-list-type") == "set" and len(set(parsed)) < len(parsed):
                raise SpecError(f"{path} must not repeat an item, got {list(value)}")
            return parsed
        return self._scalar(value, path)

    def _scalar(self, value: Any, path: str) -> Any:
        kind, b = self.kind, self.bounds
        if kind == "boolean":
            if not isinstance(value, bool):
                raise SpecError(f"{path} must be true or false, got {value!r:.80}")
            return value
        if kind == "string":
            if not isinstance(value, str):
                raise SpecError(f"{path} must be a string, got {value!r:.80}")
            if "enum" in b and value not in b["enum"]:
                raise SpecError(f"{path} must be one of {list(b['enum'])}, got {value!r:.80}")
            _check_size(path, len(value), b.get("minLength"), b.get("maxLength"), "characters")
            if "pattern" in b and not re.search(b["pattern"], value):
                raise SpecError(f"{path} must match {b['pattern']}, got {value!r:.80}")
            return value
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (kind == "integer" and not float(value).is_integer())
        ):
            raise SpecError(f"{path} must be {'an integer' if kind == 'integer' else 'a number'}, got {value!r:.80}")
        value = int(value) if kind == "integer" else float(value)
        low, high, open_low = b.get("minimum"), b.get("maximum"), b.get("exclusiveMinimum", False)
        if (low is not None and (value <= low if open_low else value < low)) or (high is not None and value > high):
            if low is not None and high is not None:
                within = f"({low:,}, {high:,}]" if open_low else f"{low:,}..{high:,}"
            else:
                within = f"{'>' if open_low else '>='} {low:,}" if low is not None else f"<= {high:,}"
            raise SpecError(
                f"{path} must be {'within ' if low is not None and high is not None else ''}{within}, got {value:,}"
            )
        return value

    def dump(self, value: Any) -> Any:
        """`value` back in its stored JSON form."""
        if isinstance(value, Record):
            return value.to_dict()
        if isinstance(value, tuple):
            return [self.items.dump(v) if self.items is not None else v for v in value]
        if isinstance(value, dict):
            return {k: self.values.dump(v) if self.values is not None else v for k, v in value.items()}
        return value


def _check_size(path: str, size: int, low: int | None, high: int | None, what: str) -> None:
    if (low is not None and size < low) or (high is not None and size > high):
        raise SpecError(f"{path} must have {low or 0}..{high if high is not None else 'any'} {what}, got {size}")


# The field declarations: each returns the Field as Any, so that a Record's annotation is the
# attribute's type for mypy (as dataclasses.field does). A description of None: an array's items
# or a map's values, which the field holding them describes.


def integer(
    description: str | None,
    *,
    default: Any = _MISSING,
    minimum: int | None = None,
    maximum: int | None = None,
    required: bool = False,
    rules: tuple[Rule, ...] = (),
    format: str | None = None,
) -> Any:
    return Field(
        "integer",
        description,
        default=default,
        required=required,
        rules=rules,
        minimum=minimum,
        maximum=maximum,
        format=format,
    )


def number(
    description: str | None,
    *,
    default: Any = _MISSING,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    required: bool = False,
) -> Any:
    return Field(
        "number",
        description,
        default=default,
        required=required,
        minimum=minimum,
        maximum=maximum,
        exclusiveMinimum=exclusive_minimum or None,
    )


def boolean(description: str | None, *, default: Any = _MISSING) -> Any:
    return Field("boolean", description, default=default)


def string(
    description: str | None,
    *,
    default: Any = _MISSING,
    enum: tuple[str, ...] | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    pattern: str | None = None,
    format: str | None = None,
    required: bool = False,
) -> Any:
    return Field(
        "string",
        description,
        default=default,
        required=required,
        enum=[str(v) for v in enum] if enum else None,
        minLength=min_length,
        maxLength=max_length,
        pattern=pattern,
        format=format,
    )


def array(
    description: str,
    items: Field,
    *,
    default: Any = _MISSING,
    min_items: int | None = None,
    max_items: int | None = None,
    list_type: str | None = None,
    map_keys: tuple[str, ...] | None = None,
) -> Any:
    kubernetes: dict[str, Any] = {
        "x-kubernetes-list-type": list_type,
        "x-kubernetes-list-map-keys": list(map_keys) if map_keys else None,
    }
    return Field(
        "array", description, default=default, items=items, minItems=min_items, maxItems=max_items, **kubernetes
    )


def mapping(description: str, values: Field, *, max_properties: int | None = None) -> Any:
    return Field("object", description, values=values, maxProperties=max_properties)


def record(
    cls: type[Record],
    description: str,
    *,
    default: Any = _MISSING,
    required: bool = False,
    rules: tuple[Rule, ...] = (),
    omit: tuple[str, ...] = (),
) -> Any:
    """A nested object of type `cls`; `omit` leaves some of its fields out (a template without the
    selector)."""
    return Field("object", description, default=default, required=required, rules=rules, record=cls, omit=omit)


class Record:
    """An object of a custom resource. Subclasses declare their fields as annotated class
    attributes made by the functions above, in the order `kubectl explain` lists them; RULES are
    the object's CEL rules. Instances are immutable."""

    FIELDS: ClassVar[tuple[Field, ...]] = ()
    RULES: ClassVar[tuple[Rule, ...]] = ()

    def __init_subclass__(cls) -> None:
        own = []
        for name, value in list(vars(cls).items()):
            if isinstance(value, Field):
                value.name = name
                own.append(value)
                delattr(cls, name)  # instances hold the value; the Field stays in FIELDS
        # A subclass may redeclare a field (another description) in its place.
        mine = {f.name: f for f in own}
        inherited = [mine.pop(f.name, f) for f in cls.FIELDS]
        cls.FIELDS = (*inherited, *mine.values())

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - {f.name for f in self.FIELDS}
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field(s) {sorted(unknown)}")
        complete = self.complete({f.name: values[f.name] if f.name in values else f.initial() for f in self.FIELDS})
        for name, value in complete.items():
            object.__setattr__(self, name, value)

    @classmethod
    def complete(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The values with what depends on other fields filled in (a default the schema cannot
        hold); as given by default."""
        return values

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, path: str = "spec", *, omit: tuple[str, ...] = ()) -> Self:
        """Read the stored camelCase form: unknown fields refused, defaults filled in, every bound
        checked, then `check` for what the schema's rules say across fields."""
        data = data or {}
        known = {f.name for f in cls.FIELDS} - set(omit)
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"{path} has unknown field(s) {unknown}; known: {sorted(known)}")
        values = {
            f.name: f.initial() if data.get(f.name) is None else f.parse(data[f.name], f"{path}.{f.name}")
            for f in cls.FIELDS
        }
        result = cls(**values)
        result.check(path)
        return result

    @classmethod
    def from_json(cls, data: bytes, path: str) -> Self:
        """Read the JSON form straight into the type (a SpecError where it is no JSON object)."""
        try:
            value = json.loads(data)
        except ValueError as exc:
            raise SpecError(f"{path} is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise SpecError(f"{path} must be a JSON object, got {type(value).__name__}")
        return cls.from_dict(value, path)

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def default_of(cls, name: str) -> Any:
        """The default of one field (None where it has none), e.g. for a CLI option."""
        return next(f for f in cls.FIELDS if f.name == name).initial()

    def check(self, path: str) -> None:
        """What the CRD's rules check across this object's fields, for specs that reach the parser
        without the API server (the local CLI); nothing by default."""

    def to_dict(self) -> dict[str, Any]:
        """The stored camelCase form, every default filled in; unset fields left out."""
        return {f.name: f.dump(v) for f, v in self._items() if v is not None}

    def replace(self, **changes: Any) -> Self:
        return type(self)(**{**{f.name: v for f, v in self._items()}, **changes})

    def _items(self) -> Iterator[tuple[Field, Any]]:
        return ((f, getattr(self, f.name)) for f in self.FIELDS)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use replace()")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(v == getattr(other, f.name) for f, v in self._items())

    __hash__ = None  # type: ignore[assignment]  # equal by value, and mutable maps inside

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{f.name}={v!r}' for f, v in self._items())})"
