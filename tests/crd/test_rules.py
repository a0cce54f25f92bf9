"""Every CEL rule of the ProfileSession CRD refuses its bad spec through the API server (422 with
the rule's message, real kubernetes client over HTTP); good specs are stored with defaults."""

from __future__ import annotations

import kubernetes
import msgspec
import pytest
import yaml

from stepscope.analysis.model import Breakdown, Diagnosis, Finding, SlowWorker, StepTime
from stepscope.testing.kube.fixtures import CRD_PATH
from stepscope.testing.kube.helpers import GROUP, PLURAL, VERSION, refused, session

MATCH_EXPRESSIONS = {"matchExpressions": [{"key": "app", "operator": "In"}]}
URI = (
    "uri must be s3://bucket/prefix or oss://bucket/prefix; file:// is for the local CLI only (the sidecars and the "
    "analysis Job share no folder)"
)
NO_CREDENTIALS = (
    "credentialsSecret is required: a Secret in the session's namespace with accessKeyId and secretAccessKey; "
    "the operator's, nodes' and pods' own cloud identities are never used for a session's storage"
)
# (case, spec overrides, field the API server names, the rule's message)
RULE_CASES = [
    (
        "steps-and-duration",
        {"capture": {"steps": 3, "durationSeconds": 10}},
        "spec.capture",
        "steps and durationSeconds are exclusive; set one of them",
    ),
    ("http-uri", {"storage": {"uri": "http://bucket/prefix", "credentialsSecret": "s"}}, "spec.storage.uri", URI),
    (
        "relative-file-uri",
        {"storage": {"uri": "file://relative/path", "credentialsSecret": "s"}},
        "spec.storage.uri",
        URI,
    ),
    ("s3-without-bucket", {"storage": {"uri": "s3:///prefix", "credentialsSecret": "s"}}, "spec.storage.uri", URI),
    (
        "absolute-file-uri",
        {"storage": {"uri": "file:///var/lib/stepscope", "credentialsSecret": "s"}},
        "spec.storage.uri",
        URI,
    ),
    ("no-credentials", {"storage": {"uri": "s3://bucket/prefix"}}, "spec.storage.credentialsSecret", NO_CREDENTIALS),
    (
        "metrics-too-fast",
        {"hardwareMetrics": {"intervalMicroseconds": 99}},
        "spec.hardwareMetrics.intervalMicroseconds",
        "intervalMicroseconds must be at least 100 (NVML cannot sample faster than 10 kHz)",
    ),
    (
        "empty-selector",
        {"selector": {"matchLabels": {}}},
        "spec.selector",
        "selector needs matchLabels or matchExpressions; an empty selector would profile every pod in the namespace",
    ),
    (
        "in-without-values",
        {"selector": MATCH_EXPRESSIONS},
        "spec.selector.matchExpressions[0]",
        "operators In and NotIn need values; Exists and DoesNotExist take none",
    ),
    (
        "exists-with-values",
        {"selector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}},
        "spec.selector.matchExpressions[0]",
        "operators In and NotIn need values; Exists and DoesNotExist take none",
    ),
    (
        "hang-beyond-timeout",
        {"timeoutSeconds": 120},
        "spec.hangTimeoutSeconds",
        "hangTimeoutSeconds must not exceed timeoutSeconds",
    ),
]
# The API server (1.36) shows the value of a scalar node that holds the rule, none for an object node.
RULE_NODE_VALUE = {"metrics-too-fast": "99: "}
IMMUTABLE = (
    "spec is immutable once the session has triggered (only ttlSecondsAfterFinished may change); create a new "
    "ProfileSession instead"
)
# (case, spec overrides, field, the schema's complaint)
SCHEMA_CASES = [
    ("too-many-steps", {"capture": {"steps": 51}}, "spec.capture.steps", "should be less than or equal to 50"),
    ("zero-steps", {"capture": {"steps": 0}}, "spec.capture.steps", "should be greater than or equal to 1"),
    ("negative-wait", {"capture": {"waitSteps": -1}}, "spec.capture.waitSteps", "should be greater than or equal to 0"),
    ("zero-duration", {"capture": {"durationSeconds": 0}}, "spec.capture.durationSeconds", "should be greater than 0"),
    ("bad-activity", {"capture": {"activities": ["GPU"]}}, "spec.capture.activities[0]", 'Unsupported value: "GPU"'),
    (
        "repeated-activity",
        {"capture": {"activities": ["CPU", "CPU"]}},
        "spec.capture.activities[1]",
        'Duplicate value: "CPU"',
    ),
    (
        "bad-raw-trace",
        {"saveRawTrace": "some"},
        "spec.saveRawTrace",
        'Unsupported value: "some": supported values: "none", "master", "all"',
    ),
    ("no-uri", {"storage": {"endpoint": "https://oss-cn-hangzhou.aliyuncs.com"}}, "spec.storage.uri", "Required value"),
    ("steps-as-text", {"capture": {"steps": "two"}}, "spec.capture.steps", "must be of type integer"),
    ("bad-label-value", {"selector": {"matchLabels": {"app": "a b"}}}, "spec.selector.matchLabels.app", "should match"),
    (
        "bad-expression-key",
        {"selector": {"matchExpressions": [{"key": "a b", "operator": "Exists"}]}},
        "spec.selector.matchExpressions[0].key",
        "should match",
    ),
    (
        "bad-operator",
        {"selector": {"matchExpressions": [{"key": "a", "operator": "Maybe"}]}},
        "spec.selector.matchExpressions[0].operator",
        'Unsupported value: "Maybe"',
    ),
    (
        "too-many-stack-events",
        {"capture": {"steps": 2, "limits": {"maxStackEvents": 1_000_001}}},
        "spec.capture.limits.maxStackEvents",
        "should be less than or equal to 1000000",
    ),
    (
        "too-much-memory",
        {"capture": {"steps": 2, "limits": {"maxMemoryMB": 16_385}}},
        "spec.capture.limits.maxMemoryMB",
        "should be less than or equal to 16384",
    ),
    (
        "empty-secret-name",
        {"storage": {"uri": "s3://bucket/prefix", "credentialsSecret": ""}},
        "spec.storage.credentialsSecret",
        "should be at least 1 chars long",
    ),
]


@pytest.fixture
def api(kube):
    kube.apply_crd()
    return kubernetes.client.CustomObjectsApi(kube.api_client)


def _create(api, body: dict) -> dict:
    return api.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)


def _refusal(call) -> dict:
    status = refused(call, 422)
    assert status["reason"] == "Invalid"
    return status


def test_every_rule_in_the_crd_has_a_case():
    text = yaml.safe_load(CRD_PATH.read_text())
    rules = []

    def collect(node):
        if isinstance(node, dict):
            rules.extend(r["message"] for r in node.get("x-kubernetes-validations", []))
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(text)
    assert sorted(set(rules)) == sorted({message for *_, message in RULE_CASES} | {IMMUTABLE})


@pytest.mark.parametrize("case, spec, field, message", RULE_CASES, ids=[c[0] for c in RULE_CASES])
def test_rule_refuses_bad_spec(api, case, spec, field, message):
    status = _refusal(lambda: _create(api, session(case, **spec)))
    shown = RULE_NODE_VALUE.get(case, "")
    assert (
        status["message"]
        == f'ProfileSession.stepscope.io "{case}" is invalid: {field}: Invalid value: {shown}{message}'
    )
    assert status["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "field": field, "message": f"Invalid value: {shown}{message}"}
    ]


@pytest.mark.parametrize("case, spec, field, complaint", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_schema_refuses_bad_spec(api, case, spec, field, complaint):
    status = _refusal(lambda: _create(api, session(case, **spec)))
    causes = [(c["field"], c["message"]) for c in status["details"]["causes"]]
    assert any(f == field and complaint in m for f, m in causes), causes


def test_selector_and_storage_are_required(api):
    body = session("bare")
    body["spec"] = {"capture": {"steps": 2}}
    status = _refusal(lambda: _create(api, body))
    assert {c["field"] for c in status["details"]["causes"]} == {"spec.selector", "spec.storage"}


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"capture": {"durationSeconds": 30}},
        {"capture": {"steps": 50, "waitSteps": 0, "activities": ["CPU"]}},
        {
            "storage": {
                "uri": "oss://my-bucket/traces",
                "endpoint": "https://oss-cn-hangzhou.aliyuncs.com",
                "credentialsSecret": "oss",
            }
        },
        {
            "selector": {
                "matchExpressions": [
                    {"key": "stepscope.io/inject", "operator": "Exists"},
                    {"key": "app", "operator": "In", "values": ["trainer"]},
                ]
            }
        },
        {
            "hardwareMetrics": {"enabled": False, "intervalMicroseconds": 100},
            "saveRawTrace": "master",
            "ttlSecondsAfterFinished": 0,
        },
        {"capture": {"steps": 2, "limits": {"maxStackEvents": 1_000_000, "maxMemoryMB": 16_384}}},
    ],
    ids=["minimal", "duration", "bounds", "oss", "expressions", "options", "largest-budget"],
)
def test_good_specs_are_stored_with_defaults(api, spec):
    stored = _create(api, session("good", **spec))["spec"]
    capture = stored["capture"]
    assert capture["waitSteps"] == spec.get("capture", {}).get("waitSteps", 5)
    assert capture["activities"] == spec.get("capture", {}).get("activities", ["CPU", "CUDA"])
    assert (capture["withStack"], capture["recordShapes"], capture["profileMemory"], capture["withFlops"]) == (
        True,
        True,
        False,
        False,
    )
    assert "steps" not in capture or "durationSeconds" not in capture
    assert stored["hardwareMetrics"]["intervalMicroseconds"] == spec.get("hardwareMetrics", {}).get(
        "intervalMicroseconds", 1000
    )
    assert stored["saveRawTrace"] == spec.get("saveRawTrace", "all")
    assert (stored["hangTimeoutSeconds"], stored["timeoutSeconds"]) == (300, 1800)
    assert stored["analysis"] == {"enabled": True, "commKernelPatterns": [], "parallelism": 4}


def test_spec_is_mutable_while_pending_and_frozen_once_triggered(api):
    _create(api, session("s"))

    def patch(body: dict) -> dict:
        return api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s", body)

    def set_phase(phase: str) -> None:
        api.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "s", {"status": {"phase": phase}})

    assert patch({"spec": {"capture": {"steps": 3}}})["spec"]["capture"]["steps"] == 3
    set_phase("Pending")
    assert patch({"spec": {"capture": {"steps": 4}}})["spec"]["capture"]["steps"] == 4
    set_phase("Capturing")
    status = _refusal(lambda: patch({"spec": {"capture": {"steps": 5}}}))
    assert status["message"] == f'ProfileSession.stepscope.io "s" is invalid: spec: Forbidden: {IMMUTABLE}'
    assert status["details"]["causes"][0]["field"] == "spec"
    assert patch({"metadata": {"labels": {"team": "a"}}})["metadata"]["labels"] == {"team": "a"}
    for change in ({"timeoutSeconds": 3600}, {"registrationTimeoutSeconds": 30}, {"storage": {"region": "eu-west-1"}}):
        assert _refusal(lambda change=change: patch({"spec": change}))["details"]["causes"][0]["field"] == "spec"
    set_phase("Succeeded")
    assert patch({"spec": {"ttlSecondsAfterFinished": 86400}})["spec"]["ttlSecondsAfterFinished"] == 86400
    assert api.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "s")["spec"]["capture"]["steps"] == 4


def test_status_bounds(api):
    _create(api, session("s"))

    def write(status: dict):
        return api.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "s", {"status": status})

    failed = [{"pod": f"p{n}", "rank": n, "reason": "OOMKilled"} for n in range(21)]
    causes = _refusal(lambda: write({"failedWorkers": failed}))["details"]["causes"]
    assert causes == [
        {
            "reason": "FieldValueTooMany",
            "field": "status.failedWorkers",
            "message": "Too many: 21: must have at most 20 items",
        }
    ]
    findings = [{"severity": "urgent", "category": "kernel", "ranks": [0], "message": "m"}]
    assert "Unsupported value" in _refusal(lambda: write({"diagnosis": {"findings": findings}}))["message"]
    assert "Unsupported value" in _refusal(lambda: write({"phase": "Done"}))["message"]
    twice = [{"type": "Ready", "status": "True"}, {"type": "Ready", "status": "False"}]
    assert (
        'status.conditions[1]: Duplicate value: {"type":"Ready"}'
        in _refusal(lambda: write({"conditions": twice}))["message"]
    )
    stored = write(
        {
            "phase": "Succeeded",
            "workersReady": "2/2",
            "failedWorkers": failed[:20],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Analyzed",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "diagnosis": {
                "summary": "rank 1 is 1.8x slower",
                "slowWorkers": [{"rank": 1, "pod": "w-1", "stepTimeMs": 180.0, "slowdown": 1.8}],
            },
        }
    )
    assert len(stored["status"]["failedWorkers"]) == 20 and stored["status"]["diagnosis"]["slowWorkers"][0]["rank"] == 1


def test_printer_columns_show_phase_workers_slowest_rank_summary_and_age(api, kube):
    _create(api, session("s"))
    _create(api, session("fresh"))
    api.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "s",
        {
            "status": {
                "phase": "Succeeded",
                "workersReady": "3/4",
                "diagnosis": {
                    "summary": "rank 2 is 1.8x slower: data loading",
                    "slowWorkers": [
                        {"rank": 2, "pod": "train-2", "stepTimeMs": 180.0, "slowdown": 1.8},
                        {"rank": 0, "pod": "train-0", "stepTimeMs": 120.0, "slowdown": 1.2},
                    ],
                },
            }
        },
    )
    rows = api.list_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, _headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    )
    assert [c["name"] for c in rows["columnDefinitions"]] == [
        "Name",
        "Phase",
        "Workers",
        "Slowest Rank",
        "Summary",
        "Age",
    ]
    cells = {row["cells"][0]: row["cells"] for row in rows["rows"]}
    assert cells["s"][:5] == ["s", "Succeeded", "3/4", 2, "rank 2 is 1.8x slower: data loading"]
    assert cells["fresh"][:5] == ["fresh", None, None, None, None]
    assert cells["s"][5].endswith("s")


def test_status_keeps_every_field_of_the_analysis_diagnosis(api):
    """The CRD must not prune what the analysis writes: status.diagnosis mirrors analysis.model.Diagnosis."""
    diagnosis = Diagnosis(
        summary="rank 3 is 1.9x slower than the median: data loading",
        stepTimeMs=StepTime(min=101.5, median=104.0, max=197.25),
        slowWorkers=[
            SlowWorker(
                rank=3,
                stepTimeMs=197.25,
                slowdown=1.9,
                pod="train-3",
                node="node-b",
                cause="save_checkpoint (train.py:9), every 4th step",
                lostMsPerStep=93.2,
                stepWithoutMs=104.0,
            )
        ],
        breakdown=Breakdown(computePct=61.0, commNotOverlappedPct=12.5, overlappedPct=8.0, memoryPct=2.5, idlePct=16.0),
        findings=[
            Finding(severity="critical", category="slow-worker", ranks=[3], message="rank 3 waits on its dataloader")
        ],
    )
    compact = msgspec.to_builtins(diagnosis)
    _create(api, session("s"))
    stored = api.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "s", {"status": {"diagnosis": compact}}
    )
    assert stored["status"]["diagnosis"] == compact
