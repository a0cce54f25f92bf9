"""Object-store keys of one session (docs/design.md, "Object-store layout"); every part builds
its keys here so that writers and readers cannot drift apart."""

from __future__ import annotations

import re

from . import wire
from .schema import Record, boolean, string


def session_prefix(namespace: str, name: str, uid: str) -> str:
    return f"{namespace}/{name}-{uid[:8]}"


def session_json() -> str:
    return "session.json"


def rank_trace(rank: int) -> str:
    return f"ranks/{wire.trace_file(rank)}"


def rank_summary(rank: int) -> str:
    return f"ranks/rank-{rank}.summary.arrow"


def rank_stacks(rank: int) -> str:
    return f"ranks/{wire.stacks_file(rank)}"


def node_metrics(pod: str) -> str:
    return f"nodes/{pod}/gpu-metrics.csv.gz"


# The readers' side of the keys above: rank_summary (also in JSON, as older sidecars wrote it),
# rank_trace (also uncompressed, as older agents wrote it) and rank_stacks (group 1 the rank,
# group 2 the kind); node_metrics (group 1 the pod).
RANK_FILE = re.compile(r"^ranks/rank-(\d+)\.(summary\.(?:arrow|json)|trace\.json(?:\.gz)?|stacks\.json)$")
NODE_METRICS = re.compile(r"^nodes/([^/]+)/gpu-metrics\.csv\.gz$")


REPORT_DIAGNOSIS = "report/diagnosis.json"
REPORT_HTML = "report/index.html"
REPORT_MERGED_TRACE = "report/merged.trace.json.gz"
REPORT_TABLES = (
    "report/step_trace_time.csv",
    "report/kernel_details.csv",
    "report/op_statistic.csv",
    "report/communication.csv",
)
# What the analysis Job leaves for the operator, which alone writes the session's status: the
# result (below), and on success REPORT_DIAGNOSIS, which the operator compacts into status.diagnosis.
REPORT_RESULT = "report/result.json"


class AnalysisResult(Record):
    """report/result.json: how the analysis Job ended, for the session's Analyzed condition."""

    analyzed: bool = boolean("Whether the analysis wrote its report and diagnosis.", default=False)
    reason: str = string("One CamelCase word: Analyzed or AnalysisFailed.", default="AnalysisFailed", max_length=64)
    message: str = string("The diagnosis' summary, or why the analysis failed.", default="", max_length=32768)
