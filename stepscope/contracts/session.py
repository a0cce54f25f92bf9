"""The ProfileSession resource: its spec (what every part reads: the CRD, the operator, the
sidecar, the agent, the CLI and a ProfileTrigger's sessionTemplate) and its status, each field's
type, default, bounds and description written once here. `make crds` writes the CRD from them
(stepscope.contracts.openapi); SessionSpec.from_dict applies the same defaults and bounds to a spec
that reaches a part without the API server (the local CLI, a sidecar's PUT, request.json).

Choices the operator and users rely on:
- capture.steps has no schema default: a default is filled in before validation, so a spec with
  only durationSeconds would always break the steps/durationSeconds exclusivity rule. With
  neither set, CaptureSpec.complete captures DEFAULT_CAPTURE_STEPS.
- status.workersReady is a string "captured/total" (e.g. "2/4") written with status.workers,
  because a printer column takes a single JSONPath.
- The spec is immutable once triggered (all but ttlSecondsAfterFinished): a transition rule at the
  root of the schema (stepscope.contracts.openapi), as a rule on `spec` cannot see the status.
- Lists, maps and strings carry maxItems / maxProperties / maxLength so that the CEL cost estimate
  of the rules (the root rule compares whole specs) stays bounded. Only matchLabels keys cannot
  be bounded in the schema.
"""

from __future__ import annotations

import re

from .schema import Record, Rule, SpecError, array, boolean, integer, mapping, number, record, string
from .states import ConditionStatus, SessionPhase, Severity
from .wire import (
    DEFAULT_ACTIVITIES,
    DEFAULT_CAPTURE_STEPS,
    DEFAULT_HANG_TIMEOUT_SECONDS,
    DEFAULT_MAX_MEMORY_MB,
    DEFAULT_MAX_STACK_EVENTS,
    DEFAULT_RECORD_SHAPES,
    DEFAULT_WAIT_STEPS,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

GROUP = "stepscope.io"
VERSION = "v1alpha1"
KIND = "ProfileSession"
PLURAL = "profilesessions"

ACTIVITIES = DEFAULT_ACTIVITIES
SAVE_RAW_TRACE = ("none", "master", "all")
STORAGE_SCHEMES = ("s3", "oss", "file")
# The capture budget's upper bounds: what an agent can hold. A Python event costs the training
# thread 40-170 us and ~3 KB when the profiler stops, so a million is minutes and 3 GB; the memory
# bound is checked between steps, so one far above a training pod's memory would let the profiler
# take it before the agent acts.
MAX_STACK_EVENTS = 1_000_000
MAX_MEMORY_MB = 16_384
# Pods of one shard Job at once (the chart caps it lower, analysis.maxParallelism).
MAX_ANALYSIS_PARALLELISM = 1000
# A label value; keys cannot be checked by a schema (the operator fails a session whose key is invalid).
LABEL_VALUE = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class LabelRequirement(Record):
    RULES = (
        Rule(
            "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) "
            "|| size(self.values) == 0)",
            "operators In and NotIn need values; Exists and DoesNotExist take none",
        ),
    )
    key: str | None = string("The label key.", required=True, min_length=1, max_length=317, pattern=LABEL_KEY)
    operator: str | None = string(
        "In and NotIn need values; Exists and DoesNotExist take none.",
        required=True,
        enum=("In", "NotIn", "Exists", "DoesNotExist"),
        max_length=12,
    )
    values: tuple[str, ...] | None = array(
        "Label values for In and NotIn.", string(None, max_length=63, pattern=LABEL_VALUE), max_items=64
    )


class LabelSelector(Record):
    RULES = (
        Rule(
            "(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && "
            "size(self.matchExpressions) > 0)",
            "selector needs matchLabels or matchExpressions; an empty selector would profile every pod in the "
            "namespace",
        ),
    )
    matchLabels: dict[str, str] | None = mapping(
        "Label key/value pairs a pod must all carry (e.g. job-name: my-training).",
        string(None, max_length=63, pattern=LABEL_VALUE),
        max_properties=32,
    )
    matchExpressions: tuple[LabelRequirement, ...] | None = array(
        "Label requirements a pod must all meet.", record(LabelRequirement, "One label requirement."), max_items=16
    )


class CaptureLimits(Record):
    maxStackEvents: int = integer(
        "Python function events (withStack) the capture may record in all, at most 1,000,000. Each costs the "
        "training thread 40-170 microseconds and about 3 KB when the profiler stops, so the maximum is a "
        "pause of minutes and 3 GB on top of maxMemoryMB.",
        default=DEFAULT_MAX_STACK_EVENTS,
        minimum=0,
        maximum=MAX_STACK_EVENTS,
    )
    maxMemoryMB: int = integer(
        "Growth of the training process (MB) while profiling before the capture is cut short, at most 16384: "
        "the agent checks it between steps, so a larger bound would let the profiler's buffers take a "
        "training pod's memory before it acts.",
        default=DEFAULT_MAX_MEMORY_MB,
        minimum=1,
        maximum=MAX_MEMORY_MB,
    )


class CaptureSpec(Record):
    RULES = (
        Rule(
            "!(has(self.steps) && has(self.durationSeconds))",
            "steps and durationSeconds are exclusive; set one of them",
        ),
    )
    waitSteps: int = integer(
        "Steps to let pass before capturing, counted from the most steps any selected rank had made when the "
        "session was triggered; every rank then captures the same steps.",
        default=DEFAULT_WAIT_STEPS,
        minimum=0,
        maximum=100000,
    )
    steps: int | None = integer(
        f"Steps to capture ({DEFAULT_CAPTURE_STEPS} when neither steps nor durationSeconds is set).",
        minimum=1,
        maximum=50,
    )
    durationSeconds: float | None = number(
        "Capture for this long instead of a number of steps (loops without steps).",
        minimum=0,
        maximum=3600,
        exclusive_minimum=True,
    )
    activities: tuple[str, ...] = array(
        "torch.profiler activities: CPU (operators, Python functions) and CUDA (kernels, memory copies).",
        string(None, enum=ACTIVITIES, max_length=4),
        default=list(DEFAULT_ACTIVITIES),
        min_items=1,
        max_items=2,
        list_type="set",
    )
    withStack: bool = boolean("Record the Python stack of each operator (larger traces).", default=True)
    recordShapes: bool = boolean("Record the input shapes of each operator.", default=DEFAULT_RECORD_SHAPES)
    profileMemory: bool = boolean("Record tensor allocations and frees.", default=False)
    withFlops: bool = boolean("Estimate the FLOPs of matrix multiplications and convolutions.", default=False)
    limits: CaptureLimits = record(
        CaptureLimits,
        "The capture budget each agent enforces so that profiling never stalls or bloats the training "
        "process. First Python stacks are dropped when one step's Python calls times the steps to capture (or"
        " calls per second times durationSeconds) exceed maxStackEvents (the training thread's stack is then "
        "sampled every 2 ms instead, up to maxStackEvents frames, so the diagnosis can still name a "
        "function); then the capture is cut short once the process grew by maxMemoryMB while profiling. What "
        "was dropped or cut is said in the rank's state, its summary and the report.",
        default={},
    )

    @classmethod
    def complete(cls, values: dict[str, Any]) -> dict[str, Any]:
        if values.get("steps") is None and values.get("durationSeconds") is None:
            return {**values, "steps": DEFAULT_CAPTURE_STEPS}
        return values

    def check(self, path: str) -> None:
        if self.steps is not None and self.durationSeconds is not None:
            raise SpecError(f"{path}.steps and {path}.durationSeconds are exclusive: set one of them")


class HardwareMetricsSpec(Record):
    enabled: bool = boolean("Sample NVML (utilization, memory, clocks, power, NVLink and PCIe traffic).", default=True)
    intervalMicroseconds: int = integer(
        "Sampling interval in microseconds, at least 100 (NVML cannot sample faster than 10 kHz).",
        default=1000,
        maximum=10000000,
        rules=(
            Rule("self >= 100", "intervalMicroseconds must be at least 100 (NVML cannot sample faster than 10 kHz)"),
        ),
    )

    def check(self, path: str) -> None:
        if self.intervalMicroseconds < 100:
            raise SpecError(
                f"{path}.intervalMicroseconds must be at least 100 (NVML cannot sample faster than 10 kHz), got "
                f"{self.intervalMicroseconds}"
            )


class StorageSpec(Record):
    RULES = (
        Rule(
            "!has(self.uri) || self.uri.matches('^(s3|oss)://[a-z0-9][a-z0-9.-]*[a-z0-9](/.*)?$')",
            "uri must be s3://bucket/prefix or oss://bucket/prefix; file:// is for the local CLI only (the "
            "sidecars and the analysis Job share no folder)",
            ".uri",
        ),
        Rule(
            "has(self.credentialsSecret)",
            "credentialsSecret is required: a Secret in the session's namespace with accessKeyId and "
            "secretAccessKey; the operator's, nodes' and pods' own cloud identities are never used for a "
            "session's storage",
            ".credentialsSecret",
        ),
    )
    uri: str = string("s3://bucket/prefix or oss://bucket/prefix.", required=True, max_length=1024)
    endpoint: str | None = string("Object-store endpoint, e.g. an OSS region endpoint or MinIO.", max_length=1024)
    region: str | None = string("Object-store region (S3).", max_length=64)
    credentialsSecret: str | None = string(
        "Required: a Secret in the session's namespace with accessKeyId and secretAccessKey (or "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, optionally a session token); the only credentials the "
        "operator, the sidecars and the analysis Job use for the session's storage (never their own cloud "
        "identity). Never copied into status.",
        min_length=1,
        max_length=253,
    )

    @property
    def scheme(self) -> str:
        uri = self.uri or ""
        return uri.split("://", 1)[0] if "://" in uri else ""


class AnalysisSpec(Record):
    enabled: bool = boolean(
        "Run the analysis after the capture; false ends the session Succeeded once the captures are uploaded.",
        default=True,
    )
    commKernelPatterns: tuple[str, ...] = array(
        "The job's own communication kernels, beside NCCL's, RCCL's, DeepEP's and NVSHMEM's: regular expressions "
        "(Python syntax) searched in kernel names. Kernels they match count as communication in the summaries, the "
        "breakdown, the overlap and the communication table.",
        string(None, min_length=1, max_length=256),
        default=[],
        max_items=16,
    )
    parallelism: int = integer(
        "Pods that summarise raw traces at once, when ranks were captured without a summary: the analysis then "
        "runs an Indexed Job of shards of ranks first (capped by the chart's analysis.maxParallelism); 1 "
        "summarises them in the analysis Job alone.",
        default=4,
        minimum=1,
        maximum=MAX_ANALYSIS_PARALLELISM,
    )

    def check(self, path: str) -> None:
        for n, pattern in enumerate(self.commKernelPatterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SpecError(f"{path}.commKernelPatterns[{n}] is not a regular expression: {exc}") from None


class SessionSpec(Record):
    RULES = (
        Rule(
            "!has(self.hangTimeoutSeconds) || !has(self.timeoutSeconds) || self.hangTimeoutSeconds <= "
            "self.timeoutSeconds",
            "hangTimeoutSeconds must not exceed timeoutSeconds",
            ".hangTimeoutSeconds",
        ),
    )
    selector: LabelSelector | None = record(
        LabelSelector, "Pods in the session's namespace to profile (a standard label selector).", required=True
    )
    capture: CaptureSpec = record(
        CaptureSpec, "What torch.profiler records on every rank, and for how long.", default={}
    )
    hardwareMetrics: HardwareMetricsSpec = record(
        HardwareMetricsSpec, "GPU metrics the sidecar samples with NVML on each node during the capture.", default={}
    )
    saveRawTrace: str = string(
        "Raw traces to keep besides the summaries (master = rank 0 only).",
        default="all",
        enum=SAVE_RAW_TRACE,
        max_length=6,
    )
    storage: StorageSpec = record(
        StorageSpec,
        "Object store of the session. Everything it writes lands under <uri>/<namespace>/<name>-<first 8 "
        "characters of metadata.uid>/: ranks/ (traces, summaries), nodes/ (GPU metrics), report/ (index.html,"
        " diagnosis.json, tables); status.artifacts has the exact paths.",
        required=True,
    )
    analysis: AnalysisSpec = record(
        AnalysisSpec,
        "The analysis Job that compares the ranks, writes the report and fills status.diagnosis.",
        default={},
    )
    hangTimeoutSeconds: int = integer(
        "No step progress for this long during a session counts as a hang.",
        default=DEFAULT_HANG_TIMEOUT_SECONDS,
        minimum=1,
        maximum=86400,
    )
    timeoutSeconds: int = integer(
        "Limit of the whole session, from status.startTime to the end of its analysis; past it the session "
        "fails and keeps what was captured.",
        default=1800,
        minimum=1,
        maximum=604800,
    )
    registrationTimeoutSeconds: int = integer(
        "Seconds after the trigger within which the training processes of each selected pod must register "
        "with its sidecar; a pod whose sidecar saw none fails with what to check (PYTHONPATH set to the "
        "bootstrap dir, the stepscope.io/inject label).",
        default=120,
        minimum=1,
        maximum=86400,
    )
    ttlSecondsAfterFinished: int | None = integer(
        "Delete the session (and the objects it owns) this many seconds after it finished; unset keeps it. "
        "The one field that may change after the trigger, e.g. to keep a finished session longer (a TTL added"
        " to a finished session that had none applies from the operator's next start).",
        minimum=0,
    )

    def check(self, path: str) -> None:
        uri = self.storage.uri if self.storage is not None else None
        if (
            self.storage is None
            or self.storage.scheme not in STORAGE_SCHEMES
            or not "".join((uri or "").split("://", 1)[1:])
        ):
            raise SpecError(
                f"{path}.storage.uri must look like s3://bucket/prefix, oss://bucket/prefix or file:///path, got "
                f"{uri!r}"
            )

    def validate_for_cluster(self) -> None:
        """What a session on the cluster needs besides its schema: an object store reached with
        the credentials of spec.storage.credentialsSecret, never the operator's, nodes' or pods'
        own cloud identity, and no file://, which the sidecars and the analysis Job share no
        folder for (and which would write to nodes' disks)."""
        assert self.storage is not None  # check() refused a spec without one
        if self.storage.scheme not in ("s3", "oss"):
            raise SpecError(
                f"spec.storage.uri must be s3://bucket/prefix or oss://bucket/prefix on the cluster, got "
                f"{self.storage.uri!r}; "
                "file:// is for the local CLI only"
            )
        if not self.storage.credentialsSecret:
            raise SpecError(
                "spec.storage.credentialsSecret is required on the cluster: name a Secret in the session's namespace "
                "with "
                "accessKeyId and secretAccessKey; the operator's, nodes' and pods' own cloud identities are never "
                "used"
            )


class PodCounts(Record):
    triggered: int | None = integer("Sidecars that accepted the session.", minimum=0)
    refused: int | None = integer("Sidecars that refused it.", minimum=0)
    record: str | None = string(
        "Name of the ConfigMap with the pod names (binaryData `triggered.gz` and `refused.gz`, gzip of one "
        "name a line).",
        max_length=253,
    )


class Condition(Record):
    type: str | None = string("Triggered, Captured, Analyzed or Ready.", required=True, max_length=64)
    status: str | None = string("True, False or Unknown.", required=True, enum=tuple(ConditionStatus))
    reason: str | None = string("One CamelCase word, e.g. NoPodsSelected, NoTrainingProcess, Timeout.", max_length=1024)
    message: str | None = string("What happened, or what to change.", max_length=32768)
    lastTransitionTime: str | None = string("When status last changed.", format="date-time")
    observedGeneration: int | None = integer("The metadata.generation it was set for.", format="int64")


class WorkerCounts(Record):
    total: int | None = integer("Workers of the selected pods.", minimum=0)
    triggered: int | None = integer("Workers that saw the request.", minimum=0)
    capturing: int | None = integer("Workers capturing now.", minimum=0)
    captured: int | None = integer("Workers whose capture ended.", minimum=0)
    uploaded: int | None = integer("Workers whose trace and summary are in the store.", minimum=0)
    failed: int | None = integer("Workers that failed or were lost.", minimum=0)


class FailedWorker(Record):
    pod: str | None = string("Its pod.", max_length=253)
    rank: int | None = integer("Its global rank, when known.")
    reason: str | None = string("Why it failed.", max_length=1024)


class Artifacts(Record):
    prefix: str | None = string(
        "The session's folder in the store: <storage.uri>/<namespace>/<name>-<uid8>.", max_length=2048
    )
    report: str | None = string("The HTML report (report/index.html under the prefix).", max_length=2048)
    diagnosis: str | None = string("The diagnosis as JSON (report/diagnosis.json).", max_length=2048)


class StepTimeMs(Record):
    min: float | None = number("Fastest rank's median step time.")
    median: float | None = number("Median over the ranks.")
    max: float | None = number("Slowest rank's median step time.")


class SlowWorker(Record):
    rank: int | None = integer("Global rank.")
    pod: str | None = string("Its pod.", max_length=253)
    node: str | None = string("Its node.", max_length=253)
    stepTimeMs: float | None = number("Its median step time in milliseconds.")
    slowdown: float | None = number("Its step time over the median of all ranks.")
    cause: str | None = string("What it does while the others wait, in a few words.", max_length=200)
    lostMsPerStep: float | None = number(
        "Its share of the job's lost time per step; the shares of all slow workers add up to it."
    )
    stepWithoutMs: float | None = number("The step time without its cause alone.")


class Breakdown(Record):
    computePct: float | None = number("Kernels computing, no communication.")
    commNotOverlappedPct: float | None = number("Communication not hidden behind compute.")
    overlappedPct: float | None = number("Communication overlapped with compute.")
    memoryPct: float | None = number("Memory copies and sets.")
    idlePct: float | None = number("GPU idle.")


class Finding(Record):
    severity: str | None = string("critical, warning or info.", enum=tuple(Severity))
    category: str | None = string(
        "slow-worker, kernel, python, communication, memory, launch, hang, hardware or trace.", max_length=64
    )
    ranks: tuple[int, ...] | None = array("The ranks it concerns.", integer(None), max_items=64)
    message: str | None = string("What was found, and what to look at.", max_length=1024)


class Diagnosis(Record):
    summary: str | None = string("One line: the main finding.", max_length=1024)
    confidence: float | None = number(
        "How sure the summary is, 0 to 1 (absent where the evidence has no such measure). Below 0.65 the "
        "summary says it cannot tell yet and what to capture instead.",
        minimum=0,
        maximum=1,
    )
    stepTimeMs: StepTimeMs | None = record(StepTimeMs, "Step time over the ranks, in milliseconds.")
    slowWorkers: tuple[SlowWorker, ...] | None = array(
        "The slowest ranks, slowest first (the Slowest Rank column is the first).",
        record(SlowWorker, "One slow rank."),
        max_items=20,
    )
    breakdown: Breakdown | None = record(
        Breakdown, "Where the captured steps spend their time, in percent of all ranks' step time."
    )
    findings: tuple[Finding, ...] | None = array(
        "Up to 20 findings, most severe first.", record(Finding, "One finding."), max_items=20
    )


class SessionStatus(Record):
    phase: str | None = string(
        "Pending (selecting pods), Capturing, Analyzing, then Succeeded or Failed.", enum=tuple(SessionPhase)
    )
    observedGeneration: int | None = integer("The metadata.generation this status describes.", format="int64")
    startTime: str | None = string("When the operator started the session.", format="date-time")
    completionTime: str | None = string("When the session reached Succeeded or Failed.", format="date-time")
    workersReady: str | None = string("captured/total, for the Workers printer column.", max_length=32)
    message: str | None = string("The last transition, in words.", max_length=32768)
    pods: PodCounts | None = record(
        PodCounts,
        "How many selected pods' sidecars accepted or refused the trigger. Their names are in the ConfigMap "
        "`record` the session owns (not here, so that the status stays under 32 KiB whatever the pod count); "
        "an operator restart reads it and never triggers them again.",
    )
    analysisJob: str | None = string("Name of the analysis Job.", max_length=253)
    analysisShardJob: str | None = string(
        "Name of the Indexed Job that summarised the raw traces of ranks without a summary, before the analysis Job.",
        max_length=253,
    )
    conditions: tuple[Condition, ...] | None = array(
        "Triggered, Captured, Analyzed and Ready, with reason and message; Ready=False says why a session failed.",
        record(Condition, "One condition."),
        max_items=16,
        list_type="map",
        map_keys=("type",),
    )
    workers: WorkerCounts | None = record(WorkerCounts, "Workers (one per rank) by stage, summed over the sidecars.")
    failedWorkers: tuple[FailedWorker, ...] | None = array(
        "Up to 20 failed workers with their reason.", record(FailedWorker, "One failed worker."), max_items=20
    )
    artifacts: Artifacts | None = record(Artifacts, "Where the session's files are.")
    diagnosis: Diagnosis | None = record(
        Diagnosis, "The analysis' verdict, for kubectl and dashboards; the full report is at artifacts.report."
    )
