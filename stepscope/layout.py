"""Object-store keys of one session (ARCHITECTURE.md, "Object-store layout"); every part builds
its keys here so that writers and readers cannot drift apart."""
from __future__ import annotations

import re

from stepscope import wire


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
REPORT_TABLES = ("report/step_trace_time.csv", "report/kernel_details.csv", "report/op_statistic.csv", "report/communication.csv")
