"""Fault-injection scenarios: small gloo jobs of stepscope/local/workload.py, each with one known cause
(or none), that `stepscope demo --scenario NAME` runs and benchmarks/diagnosis_accuracy.py scores
the diagnosis on.

A scenario says how the workload is started and what a right diagnosis says: which rank holds the
job back (none for a healthy job) and words, any one of which names the cause (the function,
operator or phase where that rank spends the time its peers wait). Every rank blocks 30 ms a step
in its shard reads (the job's natural wait, not a fault), so the step is about 40 ms on an idle
machine and the faults below cost the slow rank about as much again, the modest one about 12 %.
"""
from __future__ import annotations

from dataclasses import dataclass

BASE_ARGS = ("--step-sleep-ms", "30", "--batch-size", "32", "--hidden", "256")
SLOW_MS = 40.0
# About 40 ms more operator work a step on this 2-core machine (12 gave 8 ms).
COMPUTE_FACTOR = 60


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    fault: str | None  # workload.py's --fault; None: healthy, "hang": a hung rank
    slow_ms: float = SLOW_MS
    causes: tuple[str, ...] = ()  # words of which a right headline contains at least one

    def slow_rank(self, ranks: int) -> int | None:
        """The rank the fault is put on: the middle one, so neither rank 0 nor file order can
        make a guess look right."""
        return None if self.fault is None else ranks // 2

    def workload_args(self, ranks: int, hang_at_step: int = 4) -> list[str]:
        args = [*BASE_ARGS, "--steps", "0"]
        rank = self.slow_rank(ranks)
        if self.fault == "hang":
            return args + ["--hang-rank", str(rank), "--hang-at-step", str(hang_at_step)]
        if self.fault is not None:
            args += ["--slow-rank", str(rank), "--fault", self.fault, "--slow-ms", f"{self.slow_ms:g}"]
        if self.fault == "compute":
            args += ["--compute-factor", str(COMPUTE_FACTOR)]
        return args


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("slow-function", "one rank computes 40 ms a step in a Python function (augment_batch_slowly)", "cpu",
             causes=("augment_batch_slowly",)),
    Scenario("slow-helpers", "one rank computes 40 ms a step in many calls of small helpers made by augment_with_helpers", "helpers",
             causes=("augment_with_helpers",)),
    Scenario("blocking-io", "one rank blocks 40 ms a step in fetch_remote_features (sleeps, no CPU)", "sleep",
             causes=("fetch_remote_features",)),
    Scenario("slow-compute", "one rank runs a 60x larger batch through the model: more operator work, no Python function of its own",
             "compute", causes=("forward", "backward", "linear", "addmm", "compute")),
    Scenario("slow-data", "one rank's Dataset decodes each sample slowly (40 ms a batch) in its DataLoader", "data",
             causes=("decode_sample", "__getitem__", "data loading")),
    Scenario("slow-comm-hook", "one rank's DDP communication hook works 40 ms a step before its all-reduce", "hook",
             causes=("compressing_allreduce_hook", "communication hook")),
    Scenario("gc-pauses", "one rank runs gc.collect() over many live objects every step (release_memory)", "gc",
             causes=("release_memory", "collect", "garbage collection")),
    Scenario("modest", "one rank computes 5 ms a step more (about 12 % of the step) in augment_batch_slowly", "cpu", slow_ms=5.0,
             causes=("augment_batch_slowly",)),
    Scenario("healthy", "no fault: only the natural noise of a shared machine", None),
    Scenario("hang", "one rank blocks forever in block_forever, a non-collective function, after its optimizer step", "hang",
             causes=("block_forever",)),
)}
