"""What the operator writes into a ProfileSession's status: worker counts aggregated from the
sidecars, the bounded list of failed workers, conditions, and the throttle that keeps every
session at or below one status write per second. Nothing here grows with the pod count: the
whole status stays under 32 KiB (docs/design.md); pod names go to the session's pod record."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from stepscope.contracts import layout
from stepscope.contracts.states import SIDECAR_FINAL, ConditionType, SidecarPhase
from stepscope.contracts.wire import FAILED_STATES, HUNG
from stepscope.operator import kube, metrics
from stepscope.operator.sessions.pod_record import PodRecord
from stepscope.operator.settings import INJECT_LABEL

STATUS_BUDGET = 32 * 1024  # docs/design.md: the whole status, as JSON
MAX_MESSAGE = 1024  # status.message and each condition's message
MAX_FAILED_WORKERS = 20
WORKER_FIELDS = ("total", "triggered", "capturing", "captured", "uploaded", "failed")
RANK_FAILED = FAILED_STATES
CONDITION_TYPES = tuple(ConditionType)


MAX_DIAGNOSIS_BYTES = 24 * 1024
# What the operator writes with the diagnosis: phase, completionTime, the summary as status.message
# and the Ready condition, each message at most MAX_MESSAGE.
FINAL_WRITE_BYTES = 3 * MAX_MESSAGE


def compact_diagnosis(diagnosis: Any, budget: int = MAX_DIAGNOSIS_BYTES) -> dict[str, Any]:
    """The Diagnosis as status JSON, dropping the least severe findings until it fits `budget` bytes."""
    data = dict(msgspec.to_builtins(diagnosis))
    while len(json.dumps(data)) > budget and data.get("findings"):
        data["findings"] = data["findings"][:-1]
    while len(json.dumps(data)) > budget and data.get("slowWorkers"):
        data["slowWorkers"] = data["slowWorkers"][:-1]
    return data


def diagnosed_status(status: dict[str, Any], diagnosis: Any, dest: str, generation: int | None) -> dict[str, Any]:
    """The status patch of a finished analysis. The diagnosis gets what the rest of the status
    leaves of its 32 KiB (at most MAX_DIAGNOSIS_BYTES), so the whole status stays within budget."""
    summary = msgspec.to_builtins(diagnosis).get("summary", "")
    patch = {"artifacts": artifacts(dest), "conditions": set_condition(list(status.get("conditions") or []), ConditionType.ANALYZED, True,
                                                                      "Analyzed", summary, generation)}
    rest = len(json.dumps({**status, **patch, "diagnosis": None}).encode())
    return {**patch, "diagnosis": compact_diagnosis(diagnosis, min(MAX_DIAGNOSIS_BYTES, STATUS_BUDGET - rest - FINAL_WRITE_BYTES))}


def artifacts(dest: str) -> dict[str, str]:
    return {"prefix": dest, "report": f"{dest}/{layout.REPORT_HTML}", "diagnosis": f"{dest}/{layout.REPORT_DIAGNOSIS}"}


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_iso(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass
class PodProgress:
    """The latest answer of one pod's sidecar, or why the pod is lost."""
    answer: dict[str, Any] = field(default_factory=dict)
    lost: str = ""
    misses: int = 0

    @property
    def done(self) -> bool:
        return bool(self.lost) or self.answer.get("phase") in SIDECAR_FINAL


@dataclass(frozen=True)
class Aggregate:
    workers: dict[str, int]
    failed_workers: list[dict[str, Any]]
    done: bool
    hung: int = 0  # ranks that hung: their sidecar uploads their Python stacks, which the analysis reads


def failed_worker(pod: str, rank: int | None, reason: str) -> dict[str, Any]:
    """A failedWorkers entry; `rank` is left out when the pod never said which ranks it runs."""
    entry: dict[str, Any] = {"pod": pod, "reason": reason[:200]}
    if rank is not None:
        entry["rank"] = int(rank)
    return entry


def pod_counts(record_name: str, pods: PodRecord) -> dict[str, Any]:
    """status.pods: how many sidecars accepted or refused the trigger, and where their names are."""
    return {"triggered": len(pods.triggered), "refused": len(pods.refused), "record": record_name}


def _rank_of(answer: dict[str, Any]) -> int | None:
    ranks = [r.get("rank") for r in answer.get("ranks") or [] if r.get("rank") is not None]
    return min(ranks) if ranks else None


def aggregate(progress: dict[str, PodProgress]) -> Aggregate:
    """Sum the sidecars' worker counts (a worker = one rank); a lost pod counts its last known
    ranks, or one worker when none is known, as failed."""
    workers = dict.fromkeys(WORKER_FIELDS, 0)
    failed: list[dict[str, Any]] = []
    hung = 0
    for pod, p in sorted(progress.items()):
        counts = p.answer.get("workers") or {}
        n = max(int(counts.get("total") or 0), 1)
        if p.lost:
            workers["total"] += n
            workers["triggered"] += int(counts.get("triggered") or 0)
            workers["failed"] += n - int(counts.get("uploaded") or 0)
            workers["captured"] += int(counts.get("captured") or 0)
            workers["uploaded"] += int(counts.get("uploaded") or 0)
            failed.append(failed_worker(pod, _rank_of(p.answer), p.lost))
            continue
        # A pod whose sidecar has not seen its ranks yet still stands for (at least) one worker.
        workers["total"] += n
        for key in WORKER_FIELDS[1:]:
            workers[key] += int(counts.get(key) or 0)
        for r in p.answer.get("ranks") or []:
            hung += r.get("state") == HUNG
            if r.get("state") in RANK_FAILED or r.get("error"):
                failed.append(failed_worker(pod, r.get("rank"), str(r.get("error") or r.get("state"))))
        if p.answer.get("phase") == SidecarPhase.FAILED and not any(f["pod"] == pod for f in failed):
            failed.append(failed_worker(pod, _rank_of(p.answer), str(p.answer.get("message") or "sidecar failed")))
    done = bool(progress) and all(p.done for p in progress.values())
    return Aggregate(workers, failed[:MAX_FAILED_WORKERS], done, hung)


def _unregistered_now(progress: dict[str, PodProgress]) -> list[str]:
    """Pods whose sidecar answers but has no training process registered with it."""
    return sorted(pod for pod, p in progress.items() if not p.done and p.answer and not p.answer.get("ranks"))


def unregistered(progress: dict[str, PodProgress], waited_s: float, timeout_s: float) -> list[str]:
    """Those pods, once the session has waited spec.registrationTimeoutSeconds since the trigger."""
    return _unregistered_now(progress) if waited_s >= timeout_s else []


WAITING = "waiting for the training processes of"


def registration_wait(progress: dict[str, PodProgress], timeout_s: float) -> str | None:
    """status.message while some sidecars have no training process registered yet (the session's
    `Capturing 0/N` says nothing about why otherwise), or None when none waits."""
    waiting = _unregistered_now(progress)
    if not waiting:
        return None
    return (f"{WAITING} {len(waiting)} pod(s) to register with their sidecar (first: {waiting[0]}); "
            f"a pod without any fails after spec.registrationTimeoutSeconds={timeout_s:g}s")


def unregistered_reason(timeout_s: float) -> str:
    """What to change when a pod's training never registered (fits a failedWorkers reason)."""
    return (f"no training process registered with the sidecar within {timeout_s:g}s: is PYTHONPATH set to the "
            f"bootstrap dir? does the pod carry the label {INJECT_LABEL}=\"true\"?")


def set_condition(conditions: list[dict[str, Any]], type_: str, status: bool, reason: str, message: str, generation: int | None) -> list[dict[str, Any]]:
    """Conditions with one entry replaced; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == value and old.get("lastTransitionTime") else now_iso()
    new = {"type": type_, "status": value, "reason": reason, "message": message[:MAX_MESSAGE], "observedGeneration": generation, "lastTransitionTime": since}
    rest = [c for c in conditions if c.get("type") != type_]
    return sorted(rest + [new], key=lambda c: CONDITION_TYPES.index(c["type"]) if c["type"] in CONDITION_TYPES else len(CONDITION_TYPES))


class StatusWriter:
    """Writes one session's status, never more often than `interval_s`: a write that comes too
    soon waits, so a burst of transitions is spread out rather than dropped."""

    def __init__(self, namespace: str, name: str, interval_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.namespace, self.name, self.interval_s = namespace, name, interval_s
        self._clock, self._sleep = clock, sleep
        self._last = -interval_s
        self.writes = 0

    async def write(self, patch: dict[str, Any]) -> None:
        wait = self._last + self.interval_s - self._clock()
        if wait > 0:
            await self._sleep(wait)
        await asyncio.to_thread(kube.patch_session_status, self.namespace, self.name, patch)
        self._last = self._clock()
        self.writes += 1
        metrics.STATUS_WRITES.inc()
