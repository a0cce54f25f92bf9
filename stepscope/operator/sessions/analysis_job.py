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
        diagnosis = analysis.report(
            dest,
            endpoint=spec.storage.endpoint,
            region=spec.storage.region,
            credentials=creds,
            progress=False,
            ambient_credentials=False,
            comm_kernel_patterns=spec.analysis.commKernelPatterns,
        )
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
    print(
        f"shard {index} of {shards}: ranks {compact_ranks(result.ranks)}; summarised {compact_ranks(result.written)}; "
        f"{len(result.kept)} had a summary"
    )
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
