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

from stepscope import analysis, layout
from stepscope.operator import credentials, kube
from stepscope.operator.record import destination
from stepscope.operator.status import MAX_MESSAGE, STATUS_BUDGET, set_condition
from stepscope.session import SessionSpec

log = logging.getLogger(__name__)
MAX_DIAGNOSIS_BYTES = 24 * 1024
# What the operator adds after the Job: phase, completionTime, the summary as status.message and
# the Ready condition, each message at most MAX_MESSAGE.
FINAL_WRITE_BYTES = 3 * MAX_MESSAGE


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
        kube.patch_session_status(namespace, name, {"conditions": set_condition(conditions, "Analyzed", False, "AnalysisFailed", message, generation)})
        print(message, file=sys.stderr)
        return 1
    patch = diagnosed_status(status, diagnosis, dest, generation)
    kube.patch_session_status(namespace, name, patch)
    print(patch["diagnosis"].get("summary", ""))
    return 0
