"""One story from the checks: findings that contradict each other are reconciled, one-time setup
is no bottleneck, and how loud a finding is follows the step time it costs.

The checks each look at one thing, so two can tell opposite stories about the same rank:
- many short kernels ("launch overhead dominates") while kernels wait long in a full queue ("the
  host is ahead"): with the queue full, launch cost is not the limit, so the first goes;
- the GPU idle waiting for the host while the queue is full: both are measured, at different times
  of the step (bursts of work with gaps between), so they become one finding that says so;
- "CPU-only trace" while CUDA runtime calls are there: the profiler did not record the GPU side,
  which is what the trace finding then says, and the runtime-call findings (measured against GPU
  compute that was not recorded) go.
Each finding that makes such a claim carries it in data["claim"]; CONTRADICTIONS lists the pairs
that must never be reported together (tests/analysis/diagnosis/test_consistency.py checks every shared trace).
"""

from __future__ import annotations

import re

import msgspec

from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.model import Finding

LAUNCH_BOUND, HOST_BOUND, HOST_AHEAD, CPU_ONLY, GPU_RUNTIME = (
    "launch-bound",
    "host-bound",
    "host-ahead",
    "cpu-only",
    "gpu-runtime",
)
CONTRADICTIONS = ((LAUNCH_BOUND, HOST_AHEAD), (HOST_BOUND, HOST_AHEAD), (CPU_ONLY, GPU_RUNTIME))
# Runtime calls a program makes while it sets up (streams, device queries, the first
# allocations): called fewer times than there are steps, or taking SETUP_CALL_US a call (context
# creation, first allocations; steady-state calls take microseconds), they are no per-step cost.
SETUP_CALL = re.compile(
    r"DeviceGet|GetDevice|StreamCreate|EventCreate|Malloc|Free|HostAlloc|HostRegister|ModuleLoad|FuncGetAttributes|"
    r"DeviceSetLimit|SetDevice|Ctx|Init|GetAttribute|Occupancy"
)
SETUP_CALL_US = 1000.0
# A finding's cost (its score: share of the step) from which it is a warning; below, information.
WARNING_SHARE = 0.05


def _ranks_of(found: list[Finding], claim: str) -> set[int]:
    return {r for f in found if f.data.get("claim") == claim for r in f.ranks}


def _one_time(f: Finding, tables: RankTables) -> bool:
    """A runtime-call finding about a setup call made fewer times than there are steps."""
    if f.category != "launch" or "kind" not in f.data or not SETUP_CALL.search(str(f.data["kind"])):
        return False
    rt = tables.runtime
    rows = rt[(rt["name"] == f.data["kind"]) & rt["rank"].isin(f.ranks)]
    steps = tables.step_counts(rows["rank"].to_numpy())
    count = rows["count"].to_numpy()
    return bool(len(rows)) and bool(((count <= steps) | (rows["sumUs"].to_numpy() >= SETUP_CALL_US * count)).all())


def reconcile(found: list[Finding], tables: RankTables) -> list[Finding]:
    """The findings without contradictions, setup calls told as such, severities by cost."""
    ahead = _ranks_of(found, HOST_AHEAD)
    starved = _ranks_of(found, HOST_BOUND)
    gpu_runtime = _ranks_of(found, GPU_RUNTIME)
    out = []
    for f in found:
        claim = f.data.get("claim")
        mine = set(f.ranks)
        if claim == LAUNCH_BOUND and mine <= ahead:
            continue
        if claim == HOST_AHEAD and mine <= starved:
            continue
        if claim == HOST_BOUND and mine & ahead:
            f = msgspec.structs.replace(
                f,
                message=f.message + "; while work is queued, kernels wait in a full queue, so the gaps come from "
                "synchronisation or host work between bursts, not from launch overhead",
            )
        if claim == GPU_RUNTIME and mine & _ranks_of(found, CPU_ONLY):
            continue
        if claim == CPU_ONLY and mine & gpu_runtime:
            f = msgspec.structs.replace(
                f,
                message=(
                    f"{f.message.split(':', 1)[0]}: no GPU kernels were recorded although the CUDA/HIP runtime "
                    "was called; the profiler did not record the GPU activity (ProfilerActivity.CUDA, CUPTI)"
                ),
                data={**f.data, "claim": None},
            )
        if _one_time(f, tables):
            f = msgspec.structs.replace(
                f,
                severity="info",
                score=0.0,
                message=(
                    f"one-time setup: {f.message.split(' (up to')[0]}, "
                    "called fewer times than there are steps: no per-step cost"
                ),
            )
        elif f.severity == "warning" and f.category in ("launch", "memory") and f.score < WARNING_SHARE:
            f = msgspec.structs.replace(f, severity="info")
        out.append(f)
    return out
