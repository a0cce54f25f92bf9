"""The chart's webhook rule for pod updates: which requests the API server sends to the operator
(rules and matchConditions, evaluated by the test API server's CEL, stepscope/testing/kube/admission.py)."""
from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from stepscope.operator import registry
from stepscope.operator.injection.webhook import HANDLER_ID
from stepscope.operator.settings import INJECTED_ANNOTATION
from stepscope.testing.kube.admission import _conditions_hold, _rule_matches
from tests.chart.conftest import render_templates as render


@cache
def _hook() -> dict[str, Any]:
    (config,) = [d for d in render("webhook.yaml") if d["kind"] == "MutatingWebhookConfiguration"]
    (hook,) = config["webhooks"]
    return hook


def _pod(annotations: dict[str, str], pythonpath: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": {"stepscope.io/inject": "true"}, "annotations": annotations},
            "spec": {"containers": [{"name": "t", "image": "i", "env": [{"name": "PYTHONPATH", "value": pythonpath}]}]}}


def _sent(operation: str, new: dict[str, Any], old: dict[str, Any] | None) -> bool:
    hook = _hook()
    review = {"request": {"uid": "u", "operation": operation, "object": new, "oldObject": old}}
    return _rule_matches(hook["rules"], operation) and _conditions_hold(hook, review)


INJECTED = {INJECTED_ANNOTATION: "true"}


@pytest.mark.parametrize(("operation", "new", "old", "sent"), [
    ("CREATE", _pod({}, "/app"), None, True),
    # `kubectl apply` of the manifest again: the injected PYTHONPATH reverted in an injected pod.
    ("UPDATE", _pod(INJECTED, "/app"), _pod(INJECTED, "/boot:/app"), True),
    # A metadata-only update (a label, a finalizer, the Job controller's): the spec is unchanged.
    ("UPDATE", {**_pod(INJECTED, "/boot:/app"), "metadata": {"labels": {"more": "x"}, "annotations": INJECTED}}, _pod(INJECTED, "/boot:/app"), False),
    # A pod that was never injected (its namespace's key was not ready, or it was created before the webhook).
    ("UPDATE", _pod({}, "/app"), _pod({}, "/other"), False),
    ("UPDATE", _pod({}, "/app"), {"metadata": {"name": "p"}, "spec": {}}, False),
    ("DELETE", _pod(INJECTED, "/app"), _pod(INJECTED, "/app"), False),
])
def test_the_api_server_sends_creates_and_only_spec_changing_updates_of_injected_pods(
        operation: str, new: dict[str, Any], old: dict[str, Any] | None, sent: bool) -> None:
    assert _sent(operation, new, old) == sent


def test_the_chart_and_the_operator_handle_the_same_operations() -> None:
    (handler,) = [h for h in registry.build(with_webhook=True)._webhooks.get_all_handlers() if h.id == HANDLER_ID]
    assert sorted(handler.operations) == sorted(op for rule in _hook()["rules"] for op in rule["operations"]) == ["CREATE", "UPDATE"]
