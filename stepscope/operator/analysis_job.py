"""What the analysis Job runs (`stepscope analyze --session NS/NAME`): read the session, diagnose
its store folder, and put the compact diagnosis and the artifact URIs into its status.

It runs as the session's own ServiceAccount, which may only get this session and patch its
status; store credentials arrive as env from the session's Secret."""
from __future__ import annotations

import json
import logging
import sys
from typing import Any

import msgspec
import urllib3
from kubernetes.client.rest import ApiException

from stepscope import analysis, layout, retry
from stepscope.operator import credentials, kube
from stepscope.operator.record import destination, open_destination
from stepscope.operator.status import MAX_MESSAGE, STATUS_BUDGET, set_condition
from stepscope.session import SessionSpec

log = logging.getLogger(__name__)
MAX_DIAGNOSIS_BYTES = 24 * 1024
# What the operator adds after the Job: phase, completionTime, the summary as status.message and
# the Ready condition, each message at most MAX_MESSAGE.
FINAL_WRITE_BYTES = 3 * MAX_MESSAGE
# The result's write outlives an API server blip (a restart, a leader change, throttling): losing
# it would fail the Job and rerun the whole analysis. About half a minute in all.
WRITE_RETRY = retry.RetryPolicy(attempts=6, base_delay_s=1.0, max_delay_s=10.0)


def _transient(exc: Exception) -> bool:
    """API errors a retry may get past: throttling, the server's own failures, a dropped connection."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return status == 429 or status >= 500 or status == 0
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))


def write_status(namespace: str, name: str, patch: dict[str, Any], policy: retry.RetryPolicy = WRITE_RETRY) -> None:
    retry.call(lambda: kube.patch_session_status(namespace, name, patch), policy, transient=_transient,
               what=f"status write of ProfileSession {namespace}/{name}")


def compact_diagnosis(diagnosis: Any, budget: int = MAX_DIAGNOSIS_BYTES) -> dict[str, Any]:
    """The Diagnosis as status JSON, dropping the least severe findings until it fits `budget` bytes."""
    data = msgspec.to_builtins(diagnosis)
    while len(json.dumps(data)) > budget and data.get("findings"):
        data["findings"] = data["findings"][:-1]
    while len(json.dumps(data)) > budget and data.get("slowWorkers"):
        data["slowWorkers"] = data["slowWorkers"][:-1]
    return data


def diagnosed_status(status: dict[str, Any], diagnosis: Any, dest: str, generation: int | None) -> dict[str, Any]:
    """The status patch of a finished analysis. The diagnosis gets what the rest of the status
    leaves of its 32 KiB (at most MAX_DIAGNOSIS_BYTES), so the whole status stays within budget."""
    summary = msgspec.to_builtins(diagnosis).get("summary", "")
    patch = {"artifacts": artifacts(dest), "conditions": set_condition(list(status.get("conditions") or []), "Analyzed", True, "Analyzed", summary, generation)}
    rest = len(json.dumps({**status, **patch, "diagnosis": None}).encode())
    return {**patch, "diagnosis": compact_diagnosis(diagnosis, min(MAX_DIAGNOSIS_BYTES, STATUS_BUDGET - rest - FINAL_WRITE_BYTES))}


def artifacts(dest: str) -> dict[str, str]:
    return {"prefix": dest, "report": f"{dest}/{layout.REPORT_HTML}", "diagnosis": f"{dest}/{layout.REPORT_DIAGNOSIS}"}


def run_session_analysis(namespace: str, name: str) -> int:
    """Diagnose one session and write the result into its status; 0 on success, 1 on failure
    (the reason goes into the Analyzed condition, where the operator picks it up)."""
    obj = kube.get_session(namespace, name)
    meta, status = obj["metadata"], obj.get("status") or {}
    conditions = list(status.get("conditions") or [])
    generation = meta.get("generation")
    try:
        spec = SessionSpec.from_dict(obj.get("spec") or {})
        dest = destination(spec, namespace, name, meta["uid"])
        diagnosis = analysis.report(dest, endpoint=spec.storage.endpoint, region=spec.storage.region, credentials=credentials.from_env(), progress=False,
                                    ambient_credentials=False)
    except Exception as exc:
        log.exception("analysis of %s/%s failed", namespace, name)
        message = f"analysis failed: {type(exc).__name__}: {exc}"[:1000]
        write_status(namespace, name, {"conditions": set_condition(conditions, "Analyzed", False, "AnalysisFailed", message, generation)})
        print(message, file=sys.stderr)
        return 1
    patch = diagnosed_status(status, diagnosis, dest, generation)
    write_status(namespace, name, patch)
    print(patch["diagnosis"].get("summary", ""))
    return 0


def run_session_shard(namespace: str, name: str, index: int, shards: int) -> int:
    """One pod of the session's shard Job (jobs.shard_job): summarise shard `index` of `shards` of
    its raw traces into its store; 0 when done, 1 on any failure, which the Job controller
    retries (the shard's next try skips the ranks this one wrote)."""
    try:
        obj = kube.get_session(namespace, name)
        spec = SessionSpec.from_dict(obj.get("spec") or {})
        dest = destination(spec, namespace, name, obj["metadata"]["uid"])
        store = open_destination(spec, dest, credentials.from_env())
        result = analysis.summarise_shard(store, index, shards)
    except Exception as exc:
        log.exception("shard %d of %d of %s/%s failed", index, shards, namespace, name)
        print(f"shard {index} of {shards} failed: {type(exc).__name__}: {exc}"[:1000], file=sys.stderr)
        return 1
    print(f"shard {index} of {shards}: ranks {compact_ranks(result.ranks)}; summarised {compact_ranks(result.written)}; "
          f"{len(result.kept)} had a summary")
    return 0


def compact_ranks(ranks: list[int]) -> str:
    """Ranks as ranges, as the Job writes completedIndexes ("0-3,7")."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in spans) or "none"
