"""The ProfileSession spec as every part reads it: defaults, bounds and cross-field checks.

The CRD schema refuses most bad specs before they are stored; `validate` repeats those checks
(the CLI has no API server in front of it) and adds what a schema cannot express.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from stepscope.wire import (
    DEFAULT_ACTIVITIES,
    DEFAULT_CAPTURE_STEPS,
    DEFAULT_HANG_TIMEOUT_SECONDS,
    DEFAULT_MAX_MEMORY_MB,
    DEFAULT_MAX_STACK_EVENTS,
    DEFAULT_RECORD_SHAPES,
    DEFAULT_WAIT_STEPS,
)

ACTIVITIES = ("CPU", "CUDA")
SAVE_RAW_TRACE = ("none", "master", "all")
STORAGE_SCHEMES = ("s3", "oss", "file")
# The capture budget's upper bounds (the CRDs' maxima): what an agent can hold. A Python event
# costs the training thread 40-170 us and ~3 KB when the profiler stops (stepscope.wire), so a
# million is minutes and 3 GB; the memory bound is checked between steps, so one far above a
# training pod's memory would let the profiler take it before the agent acts.
MAX_STACK_EVENTS = 1_000_000
MAX_MEMORY_MB = 16_384
# Pods of one shard Job at once (the chart caps it lower, analysis.maxParallelism).
MAX_ANALYSIS_PARALLELISM = 1000


class SpecError(ValueError):
    """A spec a user must change; the message says what to change."""


@dataclass(frozen=True)
class CaptureLimits:
    """The capture budget each agent enforces, in this order: Python stacks are dropped when one
    step's Python calls times the steps (or the calls per second times the duration) exceed
    maxStackEvents; the capture is cut short once the process grew by maxMemoryMB while profiling."""
    maxStackEvents: int = DEFAULT_MAX_STACK_EVENTS
    maxMemoryMB: int = DEFAULT_MAX_MEMORY_MB


@dataclass(frozen=True)
class CaptureSpec:
    waitSteps: int = DEFAULT_WAIT_STEPS
    steps: int | None = DEFAULT_CAPTURE_STEPS
    durationSeconds: float | None = None
    activities: tuple[str, ...] = DEFAULT_ACTIVITIES
    withStack: bool = True
    recordShapes: bool = DEFAULT_RECORD_SHAPES
    profileMemory: bool = False
    withFlops: bool = False
    limits: CaptureLimits = field(default_factory=CaptureLimits)


@dataclass(frozen=True)
class HardwareMetricsSpec:
    enabled: bool = True
    intervalMicroseconds: int = 1000


@dataclass(frozen=True)
class StorageSpec:
    uri: str = ""
    endpoint: str | None = None
    region: str | None = None
    credentialsSecret: str | None = None

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0] if "://" in self.uri else ""


@dataclass(frozen=True)
class SessionSpec:
    capture: CaptureSpec = field(default_factory=CaptureSpec)
    hardwareMetrics: HardwareMetricsSpec = field(default_factory=HardwareMetricsSpec)
    saveRawTrace: Literal["none", "master", "all"] = "all"
    storage: StorageSpec = field(default_factory=StorageSpec)
    analysisEnabled: bool = True
    # Pods of the analysis's shard Job at once (spec.analysis.parallelism), within the chart's analysis.maxParallelism.
    analysisParallelism: int = 4
    hangTimeoutSeconds: int = DEFAULT_HANG_TIMEOUT_SECONDS
    timeoutSeconds: int = 1800
    # A sidecar with no training process registered this long after the trigger fails its pod.
    registrationTimeoutSeconds: int = 120
    ttlSecondsAfterFinished: int | None = None
    selector: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> SessionSpec:
        """Read a ProfileSession `spec` (camelCase, as stored), filling defaults, then validate."""
        spec = dict(spec or {})
        capture = dict(spec.get("capture") or {})
        if capture.get("durationSeconds") is not None and "steps" not in capture:
            capture["steps"] = None
        if "activities" in capture:
            capture["activities"] = tuple(capture["activities"])
        limits = dict(capture.get("limits") or {})
        known_limits = {f.name for f in dataclasses.fields(CaptureLimits)}
        if set(limits) - known_limits:
            raise SpecError(f"spec.capture.limits has unknown field(s) {sorted(set(limits) - known_limits)}; known: {sorted(known_limits)}")
        capture["limits"] = CaptureLimits(**limits)
        known_capture = {f.name for f in dataclasses.fields(CaptureSpec)}
        unknown = set(capture) - known_capture
        if unknown:
            raise SpecError(f"spec.capture has unknown field(s) {sorted(unknown)}; known: {sorted(known_capture)}")
        result = cls(
            capture=CaptureSpec(**capture),
            hardwareMetrics=HardwareMetricsSpec(**(spec.get("hardwareMetrics") or {})),
            saveRawTrace=spec.get("saveRawTrace", cls.saveRawTrace),
            storage=StorageSpec(**(spec.get("storage") or {})),
            analysisEnabled=bool((spec.get("analysis") or {}).get("enabled", cls.analysisEnabled)),
            analysisParallelism=int((spec.get("analysis") or {}).get("parallelism", cls.analysisParallelism)),
            hangTimeoutSeconds=int(spec.get("hangTimeoutSeconds", cls.hangTimeoutSeconds)),
            timeoutSeconds=int(spec.get("timeoutSeconds", cls.timeoutSeconds)),
            registrationTimeoutSeconds=int(spec.get("registrationTimeoutSeconds", cls.registrationTimeoutSeconds)),
            ttlSecondsAfterFinished=spec.get("ttlSecondsAfterFinished"),
            selector=dict(spec.get("selector") or {}),
        )
        result.validate()
        return result

    def validate(self) -> None:
        c = self.capture
        if c.steps is not None and c.durationSeconds is not None:
            raise SpecError("spec.capture.steps and spec.capture.durationSeconds are exclusive: set one of them")
        if c.steps is None and c.durationSeconds is None:
            raise SpecError("spec.capture needs steps (1..50) or durationSeconds")
        if c.steps is not None and not 1 <= c.steps <= 50:
            raise SpecError(f"spec.capture.steps must be within 1..50, got {c.steps}")
        if c.durationSeconds is not None and not 0 < c.durationSeconds <= 3600:
            raise SpecError(f"spec.capture.durationSeconds must be within (0, 3600], got {c.durationSeconds}")
        if not 0 <= c.limits.maxStackEvents <= MAX_STACK_EVENTS or not 1 <= c.limits.maxMemoryMB <= MAX_MEMORY_MB:
            raise SpecError(f"spec.capture.limits: maxStackEvents must be within 0..{MAX_STACK_EVENTS:,} and maxMemoryMB within "
                            f"1..{MAX_MEMORY_MB:,}, got {c.limits}")
        if c.waitSteps < 0:
            raise SpecError(f"spec.capture.waitSteps must be >= 0, got {c.waitSteps}")
        bad = [a for a in c.activities if a not in ACTIVITIES]
        if bad or not c.activities:
            raise SpecError(f"spec.capture.activities must be a non-empty subset of {list(ACTIVITIES)}, got {list(c.activities)}")
        if self.hardwareMetrics.intervalMicroseconds < 100:
            raise SpecError("spec.hardwareMetrics.intervalMicroseconds must be >= 100")
        if self.saveRawTrace not in SAVE_RAW_TRACE:
            raise SpecError(f"spec.saveRawTrace must be one of {list(SAVE_RAW_TRACE)}, got {self.saveRawTrace!r}")
        if self.storage.scheme not in STORAGE_SCHEMES or not self.storage.uri.split("://", 1)[1:] or not self.storage.uri.split("://", 1)[1]:
            raise SpecError(f"spec.storage.uri must look like s3://bucket/prefix, oss://bucket/prefix or file:///path, got {self.storage.uri!r}")
        if not 1 <= self.analysisParallelism <= MAX_ANALYSIS_PARALLELISM:
            raise SpecError(f"spec.analysis.parallelism must be within 1..{MAX_ANALYSIS_PARALLELISM}, got {self.analysisParallelism}")
        if self.hangTimeoutSeconds < 1:
            raise SpecError("spec.hangTimeoutSeconds must be >= 1")
        if self.timeoutSeconds < 1:
            raise SpecError("spec.timeoutSeconds must be >= 1")
        if self.registrationTimeoutSeconds < 1:
            raise SpecError("spec.registrationTimeoutSeconds must be >= 1")

    def validate_for_cluster(self) -> None:
        """What a session on the cluster needs besides `validate` (the CRD's rules): an object store
        reached with the credentials of spec.storage.credentialsSecret, never the operator's,
        nodes' or pods' own cloud identity, and no file://, which the sidecars and the analysis
        Job share no folder for (and which would write to nodes' disks)."""
        if self.storage.scheme not in ("s3", "oss"):
            raise SpecError(f"spec.storage.uri must be s3://bucket/prefix or oss://bucket/prefix on the cluster, got {self.storage.uri!r}; "
                            "file:// is for the local CLI only")
        if not self.storage.credentialsSecret:
            raise SpecError("spec.storage.credentialsSecret is required on the cluster: name a Secret in the session's namespace with "
                            "accessKeyId and secretAccessKey; the operator's, nodes' and pods' own cloud identities are never used")

    def to_dict(self) -> dict[str, Any]:
        """The spec back in its stored camelCase form, every default filled in."""
        d = dataclasses.asdict(self)
        d["capture"]["activities"] = list(self.capture.activities)
        d["analysis"] = {"enabled": d.pop("analysisEnabled"), "parallelism": d.pop("analysisParallelism")}
        return d
