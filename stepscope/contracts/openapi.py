"""The CRDs as data, generated from the contracts' Records: every field's type, description,
default and bounds, the objects' CEL rules, and what the resources say around their schema (names,
printer columns, the status subresource). stepscope.crds writes them as YAML (`make crds`)."""

from __future__ import annotations

from . import session, trigger
from .schema import Field, Record, Rule

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The one spec field that may change after the trigger (users extend finished sessions' TTL).
MUTABLE_AFTER_TRIGGER = ("ttlSecondsAfterFinished",)


def field_schema(f: Field) -> dict[str, Any]:
    """One field's OpenAPI v3 node."""
    node: dict[str, Any] = {"type": f.kind}
    if f.description:
        node["description"] = f.description
    if f.has_default:
        node["default"] = f.default
    if f.record is not None:
        node.update(record_schema(f.record, omit=f.omit))
    elif f.items is not None:
        node["items"] = field_schema(f.items)
    elif f.values is not None:
        node["additionalProperties"] = field_schema(f.values)
    node.update(f.bounds)
    rules = [r.schema() for r in (*(f.record.RULES if f.record is not None else ()), *f.rules)]
    if rules:
        node["x-kubernetes-validations"] = rules
    return node


def record_schema(cls: type[Record], *, omit: tuple[str, ...] = ()) -> dict[str, Any]:
    fields = [f for f in cls.FIELDS if f.name not in omit]
    node: dict[str, Any] = {}
    required = [f.name for f in fields if f.required]
    if required:
        node["required"] = required
    node["properties"] = {f.name: field_schema(f) for f in fields}
    return node


def immutable_after_trigger(spec: type[Record]) -> Rule:
    """Every spec field but MUTABLE_AFTER_TRIGGER is fixed once the stored phase is past Pending. A
    root rule, as a rule on `spec` cannot see the status; the status subresource keeps status
    writes out of spec updates and spec writes out of /status."""
    same = " && ".join(
        f"(has(self.spec.{n}) ? has(oldSelf.spec.{n}) && self.spec.{n} == oldSelf.spec.{n} : !has(oldSelf.spec.{n}))"
        for n in (f.name for f in spec.FIELDS)
        if n not in MUTABLE_AFTER_TRIGGER
    )
    return Rule(
        f"!has(oldSelf.status) || !has(oldSelf.status.phase) || oldSelf.status.phase == 'Pending' || ({same})",
        "spec is immutable once the session has triggered (only ttlSecondsAfterFinished may change); create a"
        " new ProfileSession instead",
        ".spec",
        "FieldValueForbidden",
    )


def _column(
    name: str, kind: str, path: str, description: str | None = None, priority: int | None = None
) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": kind}
    if description:
        column["description"] = description
    column["jsonPath"] = path
    if priority is not None:
        column["priority"] = priority
    return column


def crd(
    kind: str,
    plural: str,
    short_names: list[str],
    description: str,
    spec: Field,
    status: Field,
    columns: list[dict[str, Any]],
    rules: tuple[Rule, ...] = (),
) -> dict[str, Any]:
    root: dict[str, Any] = {"type": "object", "description": description, "required": ["spec"]}
    if rules:
        root["x-kubernetes-validations"] = [r.schema() for r in rules]
    root["properties"] = {
        "apiVersion": {
            "type": "string",
            "description": f"The versioned schema of this object ({session.GROUP}/{session.VERSION}).",
        },
        "kind": {"type": "string", "description": f"{kind}."},
        "metadata": {"type": "object"},
        "spec": field_schema(spec),
        "status": field_schema(status),
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{session.GROUP}", "labels": {"app.kubernetes.io/name": "stepscope"}},
        "spec": {
            "group": session.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["stepscope"],
            },
            "versions": [
                {
                    "name": session.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def _top(cls: type[Record], name: str) -> Field:
    return next(f for f in cls.FIELDS if f.name == name)


class ProfileSession(Record):
    spec: session.SessionSpec = session.record(
        session.SessionSpec,
        "What to capture and where to store it. Immutable once the session has triggered (status.phase past "
        "Pending), "
        "except ttlSecondsAfterFinished; create a new ProfileSession to profile again.",
    )
    status: session.SessionStatus = session.record(session.SessionStatus, "What happened: set by the operator only.")


class ProfileTrigger(Record):
    spec: trigger.TriggerSpec = session.record(
        trigger.TriggerSpec,
        "What to watch, when to capture and how: the trigger creates a ProfileSession from sessionTemplate "
        "when one of its "
        "conditions holds.",
    )
    status: trigger.TriggerStatus = session.record(trigger.TriggerStatus, "What happened: set by the operator only.")


def profile_session() -> dict[str, Any]:
    return crd(
        session.KIND,
        session.PLURAL,
        ["ps", "profs"],
        "On-demand profiling of the training pods a selector picks, with an automatic diagnosis.",
        _top(ProfileSession, "spec"),
        _top(ProfileSession, "status"),
        [
            _column("Phase", "string", ".status.phase"),
            _column("Workers", "string", ".status.workersReady", "captured/total workers"),
            _column("Slowest Rank", "integer", ".status.diagnosis.slowWorkers[0].rank", "rank of the slowest worker"),
            _column("Summary", "string", ".status.diagnosis.summary", priority=0),
            _column("Age", "date", ".metadata.creationTimestamp"),
        ],
        rules=(immutable_after_trigger(session.SessionSpec),),
    )


def profile_trigger() -> dict[str, Any]:
    return crd(
        trigger.KIND,
        trigger.PLURAL,
        ["pt"],
        "Watches the step telemetry of training pods and creates a ProfileSession by itself when the job "
        "slows down, one rank drifts "
        "or the job hangs (or an Alertmanager alert says so).",
        _top(ProfileTrigger, "spec"),
        _top(ProfileTrigger, "status"),
        [
            _column("State", "string", ".status.state"),
            _column("Baseline", "number", ".status.baseline.stepTimeSeconds", "learned step time in seconds"),
            _column("Last Fired", "date", ".status.lastFired.time"),
            _column("Sessions", "integer", ".status.sessionsCreated", "sessions created"),
            _column("Last Session", "string", ".status.lastFired.session", priority=1),
            _column("Age", "date", ".metadata.creationTimestamp"),
        ],
    )


# The chart's CRD files, by name.
CRDS = {"profilesession.yaml": profile_session, "profiletrigger.yaml": profile_trigger}
