"""ValidatingAdmissionPolicies in the test API server: a write (create, update, patch) is checked
against every stored policy that a stored ValidatingAdmissionPolicyBinding binds, as
kube-apiserver's validating admission does, after authorization and before it is stored.

Faithful (admissionregistration.k8s.io/v1, Kubernetes 1.30+): matchConstraints.resourceRules
(apiGroups, apiVersions, resources, operations, `*`), matchConditions (all true, else the policy
does not apply), `variables` in order (each may use the ones before it), `validations`: a false
expression refuses the request with its `message` and `reason` (Forbidden 403, Invalid 422,
default Invalid), in the API server's words `<resource> "<name>" is forbidden:
ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>`; an
expression that fails to evaluate refuses it under failurePolicy Fail (the default) and is
skipped under Ignore. CEL variables: `object`, `oldObject` (null on CREATE), `request`
(operation, userInfo.username, namespace, name, resource), `variables`.

Not done: matchConstraints' namespaceSelector, objectSelector, resourceNames, excludeResourceRules
and matchPolicy; the binding's matchResources and paramRef; paramKind and `params`;
validationActions other than Deny (Warn, Audit are treated as Deny); auditAnnotations,
messageExpression; `authorizer`; type checking and cost limits. CEL is cel-python's standard
library, not the API server's (no Kubernetes extension libraries such as `quantity()`, regex
`matches` differences, cross-type numeric comparison). Objects are seen as sent, not defaulted
(kube-apiserver validates the defaulted object, so `has()` of a defaulted field differs).
Writes to subresources (status) and DELETE are not checked.
"""
from __future__ import annotations

from typing import Any

import celpy
from celpy import celtypes

from . import errors

GROUP = "admissionregistration.k8s.io"
_ENV = celpy.Environment()
CODES = {"Forbidden": 403, "Invalid": 422, "Unauthorized": 401, "RequestEntityTooLarge": 413}


def _has(values: list[str] | None, value: str) -> bool:
    return any(v in ("*", value) for v in values or [])


def matches(policy: dict[str, Any], request: dict[str, Any]) -> bool:
    """Whether the policy's matchConstraints.resourceRules select the request."""
    res = request["resource"]
    return any(_has(r.get("apiGroups"), res["group"]) and _has(r.get("apiVersions"), res["version"])
               and _has(r.get("resources"), res["resource"]) and _has(r.get("operations"), request["operation"])
               for r in (policy.get("spec", {}).get("matchConstraints") or {}).get("resourceRules") or [])


def _evaluate(expression: str, activation: dict[str, Any]) -> Any:
    result = _ENV.program(_ENV.compile(expression)).evaluate(activation)
    if isinstance(result, Exception):
        raise result
    return result


def refusals(policy: dict[str, Any], request: dict[str, Any]) -> list[str] | None:
    """The messages of the validations `request` fails (an evaluation error is its own message
    under failurePolicy Fail); None when the policy does not apply to it."""
    spec = policy.get("spec") or {}
    if not matches(policy, request):
        return None
    fail = spec.get("failurePolicy", "Fail") == "Fail"
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(request.get("object")), "oldObject": celpy.json_to_cel(request.get("oldObject")),
        "request": celpy.json_to_cel({k: v for k, v in request.items() if k not in ("object", "oldObject")}),
        "variables": celtypes.MapType({})}
    try:
        for condition in spec.get("matchConditions") or []:
            if not _evaluate(condition["expression"], activation):
                return None
        for variable in spec.get("variables") or []:
            values = dict(activation["variables"])
            values[celtypes.StringType(variable["name"])] = _evaluate(variable["expression"], activation)
            activation["variables"] = celtypes.MapType(values)
    except (celpy.CELEvalError, celpy.CELParseError) as exc:
        return [f"evaluation error: {exc}"] if fail else None
    out = []
    for validation in spec.get("validations") or []:
        try:
            ok = _evaluate(validation["expression"], activation)
        except (celpy.CELEvalError, celpy.CELParseError) as exc:
            if fail:
                out.append(f"{validation.get('message') or validation['expression']}: evaluation error: {exc}")
            continue
        if not ok:
            out.append(validation.get("message") or f"failed expression: {validation['expression']}")
    return out


def admit(policies: list[dict[str, Any]], bindings: list[dict[str, Any]], request: dict[str, Any]) -> None:
    """Raise the API server's refusal when a bound policy refuses `request`."""
    by_name = {p["metadata"]["name"]: p for p in policies}
    for binding in bindings:
        policy = by_name.get((binding.get("spec") or {}).get("policyName"))
        if policy is None:
            continue
        failed = refusals(policy, request)
        if not failed:
            continue
        reason = next((v.get("reason") for v in policy["spec"].get("validations") or [] if v.get("message") == failed[0]), None) or "Invalid"
        what = request["resource"]["resource"] + (f".{request['resource']['group']}" if request["resource"]["group"] else "")
        raise errors.ApiError(CODES.get(reason, 422), reason,
                              f'{what} "{request.get("name") or ""}" is forbidden: ValidatingAdmissionPolicy \'{policy["metadata"]["name"]}\' '
                              f"with binding '{binding['metadata']['name']}' denied request: {failed[0]}")
