"""Admission of pod creation in the test API server: the stored MutatingWebhookConfigurations are
called over HTTPS as kube-apiserver calls them, then Pod Security admission checks the result.

Faithful to kube-apiserver (admission webhooks docs, admissionregistration.k8s.io/v1 reference):
- for pod CREATE, after the namespace exists and before the name is generated (so a pod with
  generateName reaches the webhook with an empty name, metadata.namespace filled in); and for an
  update of pods/<name> (PUT or PATCH, not the status subresource) as operation UPDATE, with the
  patch already applied to the stored pod in `object` and the stored pod in `oldObject`, before
  the pod update validation (object_rules.pod_update_causes) sees the result;
- a webhook is called when a rule matches (apiGroups, apiVersions, resources, operations, `*`),
  its objectSelector matches the pod's labels (on UPDATE: the new or the old object's) and its
  namespaceSelector the namespace's labels (with `kubernetes.io/metadata.name` set, as the API
  server labels every namespace), and every matchCondition is true (CEL over `object`,
  `oldObject` and `request`; one that is false skips the webhook, an error with none false skips
  it under failurePolicy Ignore and refuses the request under Fail);
- clientConfig.url, or clientConfig.service resolved through `service_endpoints` (what a Service
  and its endpoints do in a cluster), over TLS verified against caBundle (against no trusted CA
  when caBundle is empty) with the server name `<service>.<namespace>.svc`; timeoutSeconds
  (default 10); failurePolicy (default Fail): a webhook that cannot be called or answers
  something unusable is skipped with Ignore, else the request fails with 500 `failed calling
  webhook`; `allowed: false` refuses it with the webhook's status code (default 400) and message
  `admission webhook "<name>" denied the request: <message>`; a JSONPatch is applied; warnings
  come back as `Warning: 299` headers;
- Pod Security admission (pod_security.py) runs after the mutating webhooks, as it is a
  validating plugin; on UPDATE only when the number of containers or an image changes
  (isSignificantPodUpdate in pod-security-admission).
Not done: validating webhooks, the `authorizer` variable of matchConditions, CEL cost limits,
reinvocation, webhooks on other resources or operations (DELETE, CONNECT, subresources), dryRun
(the server refuses dryRun), the v1beta1 review version, client certificates.
"""
from __future__ import annotations

import base64
import copy
import json
import ssl
import uuid
from typing import Any

import aiohttp
import celpy
import jsonpatch

from . import errors, pod_security

ADMISSION = "admissionregistration.k8s.io"
_ENV = celpy.Environment()


def _matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions); an empty or absent one matches all."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {"In": key in labels and labels[key] in values, "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _rule_matches(rules: list[dict[str, Any]], operation: str) -> bool:
    def has(values: list[str] | None, value: str) -> bool:
        return any(v in ("*", value) for v in values or [])
    return any(has(r.get("apiGroups"), "") and has(r.get("apiVersions"), "v1") and has(r.get("resources"), "pods")
               and has(r.get("operations"), operation) for r in rules or [])


def _conditions_hold(hook: dict[str, Any], review: dict[str, Any]) -> bool:
    """The webhook's matchConditions on this request; raises CallFailed when one fails to evaluate
    and none is false (the API server then applies failurePolicy)."""
    request = review["request"]
    activation = {"object": celpy.json_to_cel(request["object"]), "oldObject": celpy.json_to_cel(request["oldObject"]),
                  "request": celpy.json_to_cel({k: v for k, v in request.items() if k not in ("object", "oldObject")})}
    failed = []
    for condition in hook.get("matchConditions") or []:
        try:
            result = _ENV.program(_ENV.compile(condition["expression"])).evaluate(activation)
        except (celpy.CELEvalError, celpy.CELParseError) as e:
            result = e
        if isinstance(result, Exception):
            failed.append(f"{condition['name']}: {result}")
        elif not result:
            return False
    if failed:
        raise CallFailed(f"failed to evaluate matchConditions: {'; '.join(failed)}")
    return True


def _significant(pod: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """Whether Pod Security admission evaluates this write: every create, and an update that
    changes the number of (init) containers or an image."""
    if old is None:
        return True
    def images(p: dict[str, Any], field: str) -> list[Any]:
        return [c.get("image") for c in (p.get("spec") or {}).get(field) or []]
    return any(images(pod, f) != images(old, f) for f in ("containers", "initContainers"))


class CallFailed(Exception):
    pass


async def _call(hook: dict[str, Any], review: dict[str, Any], service_endpoints: dict[tuple[str, str], tuple[str, int]]) -> dict[str, Any]:
    client = hook.get("clientConfig") or {}
    # Without caBundle the API server trusts the system roots, which never sign a webhook's own CA:
    # a context that trusts nothing fails the same way.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if client.get("caBundle"):
        context.load_verify_locations(cadata=base64.b64decode(client["caBundle"]).decode())
    server_hostname = None
    if client.get("url"):
        url = client["url"]
    else:
        service = client.get("service") or {}
        key = (service.get("namespace", ""), service.get("name", ""))
        if key not in service_endpoints:
            raise CallFailed(f'service "{key[1]}" not found')
        host, port = service_endpoints[key]
        url = f"https://{host}:{port}{service.get('path') or ''}"
        server_hostname = f"{key[1]}.{key[0]}.svc"
    timeout = aiohttp.ClientTimeout(total=float(hook.get("timeoutSeconds") or 10))
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(url, json=review, ssl=context, server_hostname=server_hostname) as answer:
                if answer.status != 200:
                    raise CallFailed(f"the server responded with {answer.status}")
                body = await answer.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ssl.SSLError, OSError) as e:
        raise CallFailed(f'Post "{url}": {e.__class__.__name__}: {e}') from e
    response = body.get("response") if isinstance(body, dict) else None
    if not isinstance(response, dict) or response.get("uid") != review["request"]["uid"]:
        raise CallFailed("the webhook's response has no response.uid matching the request")
    return response


async def admit_pod(store: Any, namespace: str, pod: dict[str, Any], service_endpoints: dict[tuple[str, str], tuple[str, int]],
                    user: str, old: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The pod after the mutating webhooks and Pod Security admission, and the warnings for the
    client; an update (UPDATE) when the stored pod `old` is given, else a create (CREATE)."""
    operation = "CREATE" if old is None else "UPDATE"
    old_labels = ((old or {}).get("metadata") or {}).get("labels") or {}
    pod = copy.deepcopy(pod)
    pod.setdefault("metadata", {})["namespace"] = namespace
    ns_type = store.type_of("", "v1", "namespaces")
    ns = store.get(ns_type, None, namespace)
    ns_labels = {**(ns["metadata"].get("labels") or {}), "kubernetes.io/metadata.name": namespace}
    warnings: list[str] = []
    configs = sorted(store.stored(ADMISSION, "mutatingwebhookconfigurations"), key=lambda c: c["metadata"]["name"])
    for config in configs:
        for hook in config.get("webhooks") or []:
            selected = _matches(hook.get("objectSelector"), pod["metadata"].get("labels") or {}) or (
                old is not None and _matches(hook.get("objectSelector"), old_labels))
            if not (_rule_matches(hook.get("rules"), operation) and selected and _matches(hook.get("namespaceSelector"), ns_labels)):
                continue
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "request": {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                  "resource": {"group": "", "version": "v1", "resource": "pods"},
                                  "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                                  "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                                  "name": pod["metadata"].get("name", ""), "namespace": namespace, "operation": operation,
                                  "userInfo": {"username": user}, "object": pod, "oldObject": old, "dryRun": False,
                                  "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"}}}
            try:
                if not _conditions_hold(hook, review):
                    continue
                response = await _call(hook, review, service_endpoints)
                if response.get("allowed") and response.get("patch"):
                    if response.get("patchType") != "JSONPatch":
                        raise CallFailed(f"unsupported patchType {response.get('patchType')!r}")
                    pod = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
            except (CallFailed, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, ValueError) as e:
                if hook.get("failurePolicy", "Fail") == "Ignore":
                    continue  # the API server only logs it
                raise errors.ApiError(500, "InternalError", f'Internal error occurred: failed calling webhook "{hook["name"]}": {e}') from None
            warnings += [str(w) for w in response.get("warnings") or []]
            if not response.get("allowed"):
                status = response.get("status") or {}
                raise errors.ApiError(int(status.get("code") or 400), status.get("reason") or "BadRequest",
                                      f'admission webhook "{hook["name"]}" denied the request: {status.get("message", "")}')
    level = ns_labels.get("pod-security.kubernetes.io/enforce")
    if level and _significant(pod, old):
        problems = pod_security.violations(pod, level)
        if problems:
            name = pod["metadata"].get("name") or pod["metadata"].get("generateName", "")
            raise errors.ApiError(403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": {", ".join(problems)}')
    return pod, warnings

