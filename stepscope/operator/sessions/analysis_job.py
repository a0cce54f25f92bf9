"""What the analysis Job runs (`stepscope analyze --session NS/NAME`): read the session, diagnose
its store folder, and leave the result there (report/result.json, beside report/diagnosis.json)
for the operator, which alone writes the session's status.

It runs as the session's own ServiceAccount, which may only get this session; store credentials
arrive as env from the session's Secret."""
from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec

from stepscope import analysis
from stepscope.contracts.layout import REPORT_RESULT, AnalysisResult
from stepscope.contracts.session import SessionSpec
from stepscope.operator import credentials, kube
from stepscope.operator.sessions.record import destination, open_destination

log = logging.getLogger(__name__)


def run_session_analysis(namespace: str, name: str) -> int:
    """Diagnose one session and leave the result in its store folder; 0 on success, 1 on failure
    (the reason goes into the result, which the operator reads; where even the store cannot be
    reached, the operator says the Job failed)."""
    obj = kube.get_session(namespace, name)
    store = None
    try:
        spec = SessionSpec.from_dict(obj.get("spec") or {})
        dest = destination(spec, namespace, name, obj["metadata"]["uid"])
        creds = credentials.from_env()
        store = open_destination(spec, dest, creds)
        diagnosis = analysis.report(dest, endpoint=spec.storage.endpoint, region=spec.storage.region, credentials=creds, progress=False,
                                    ambient_credentials=False, comm_kernel_patterns=spec.analysis.commKernelPatterns)
    except Exception as exc:
        log.exception("analysis of %s/%s failed", namespace, name)
        message = f"analysis failed: {type(exc).__name__}: {exc}"[:1000]
        _leave(store, AnalysisResult(analyzed=False, reason="AnalysisFailed", message=message))
        print(message, file=sys.stderr)
        return 1
    summary = str(msgspec.to_builtins(diagnosis).get("summary", ""))
    if not _leave(store, AnalysisResult(analyzed=True, reason="Analyzed", message=summary)):
        return 1
    print(summary)
    return 0


def _leave(store: Any, result: AnalysisResult) -> bool:
    """Write the result; False (logged) where the store refuses it."""
    try:
        if store is None:
            raise OSError("the store could not be opened")
        store.put_bytes(REPORT_RESULT, msgspec.json.encode(result.to_dict()))
    except Exception:
        log.exception("the analysis result could not be written to the store")
        return False
    return True
