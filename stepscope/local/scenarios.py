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


def _position(where: str, ranks: int) -> int:
    return {"middle": ranks // 2, "first": 0, "last": ranks - 1, "second": 1}[where]


@dataclass(frozen=True)
class Second:
    """A second slow rank of a scenario, with its own fault and cause."""

    fault: str
    slow_ms: float
    causes: tuple[str, ...]
    where: str = "last"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    fault: str | None  # workload.py's --fault; None: healthy, "hang": a hung rank
    slow_ms: float = SLOW_MS
    causes: tuple[str, ...] = ()  # words of which a right headline contains at least one
    requires: tuple[str, ...] = ()  # words a right headline contains all of (a cause's pattern)
    where: str = "middle"  # the slow rank: middle, first, second or last
    extra: tuple[str, ...] = ()  # more workload.py arguments
    second: Second | None = None
    min_ranks: int = 2
    held_aside: str = ""  # the held-aside set ("b" to "j") it belongs to; its scoring is apart

    def slow_rank(self, ranks: int) -> int | None:
        """The rank the fault is put on: the middle one unless said otherwise, so that neither
        rank 0 nor file order can make a guess look right."""
        return None if self.fault is None else _position(self.where, ranks)

    def slow_ranks(self, ranks: int) -> dict[int, tuple[str, ...]]:
        """Every slow rank with the words of its cause."""
        rank = self.slow_rank(ranks)
        out = {} if rank is None else {rank: self.causes}
        if self.second is not None:
            out[_position(self.second.where, ranks)] = self.second.causes
        return out

    def workload_args(self, ranks: int, hang_at_step: int = 4) -> list[str]:
        args = [*BASE_ARGS, "--steps", "0", *self.extra]
        rank = self.slow_rank(ranks)
        if self.fault == "hang":
            return args + ["--hang-rank", str(rank), "--hang-at-step", str(hang_at_step)]
        if self.fault is not None:
            args += ["--slow-rank", str(rank), "--fault", self.fault, "--slow-ms", f"{self.slow_ms:g}"]
        if self.fault == "compute":
            args += ["--compute-factor", str(COMPUTE_FACTOR)]
        if self.second is not None:
            args += ["--also", f"{_position(self.second.where, ranks)}:{self.second.fault}:{self.second.slow_ms:g}"]
        return args


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "slow-function",
            "one rank computes 40 ms a step in a Python function (augment_batch_slowly)",
            "cpu",
            causes=("augment_batch_slowly",),
        ),
        Scenario(
            "slow-helpers",
            "one rank computes 40 ms a step in many calls of small helpers made by augment_with_helpers",
            "helpers",
            causes=("augment_with_helpers",),
        ),
        Scenario(
            "blocking-io",
            "one rank blocks 40 ms a step in fetch_remote_features (sleeps, no CPU)",
            "sleep",
            causes=("fetch_remote_features",),
        ),
        Scenario(
            "slow-compute",
            "one rank runs a 60x larger batch through the model: more operator work, no Python function of its own",
            "compute",
            causes=("forward", "backward", "linear", "addmm", "compute"),
        ),
        Scenario(
            "slow-data",
            "one rank's Dataset decodes each sample slowly (40 ms a batch) in its DataLoader",
            "data",
            causes=("decode_sample", "__getitem__", "data loading"),
        ),
        Scenario(
            "slow-comm-hook",
            "one rank's DDP communication hook works 40 ms a step before its all-reduce",
            "hook",
            causes=("compressing_allreduce_hook", "communication hook"),
        ),
        Scenario(
            "gc-pauses",
            "one rank runs gc.collect() over many live objects every step (release_memory)",
            "gc",
            causes=("release_memory", "collect", "garbage collection"),
        ),
        Scenario(
            "modest",
            "one rank computes 5 ms a step more (about 12 % of the step) in augment_batch_slowly",
            "cpu",
            slow_ms=5.0,
            causes=("augment_batch_slowly",),
        ),
        Scenario("healthy", "no fault: only the natural noise of a shared machine", None),
        Scenario(
            "hang",
            "one rank blocks forever in block_forever, a non-collective function, after its optimizer step",
            "hang",
            causes=("block_forever",),
        ),
        # The common stragglers of real fleets. Larger models give the operators enough of the step for
        # a slower host or larger inputs to show in them.
        Scenario(
            "slow-host",
            "one rank's operators run slower with the same shapes: its CPU is stopped 7 ms of every 10 ms",
            "host",
            slow_ms=7.0,
            causes=("same shapes",),
            extra=("--hidden", "512", "--batch-size", "64"),
        ),
        Scenario(
            "uneven-batches",
            "one rank's batches are 4x its peers' (uneven shards): more operator work, same code",
            "batch",
            causes=("larger", "uneven"),
            extra=("--hidden", "1024", "--batch-factor", "4"),
        ),
        Scenario(
            "gil-thread",
            "a background thread of one rank runs pure Python 30 ms of every 50 ms (publish_metrics)",
            "thread",
            slow_ms=30.0,
            causes=("publish_metrics",),
            requires=("thread",),
            extra=("--period-ms", "50"),
        ),
        Scenario(
            "periodic-stall",
            "every 4th step one rank blocks 150 ms in save_checkpoint",
            "periodic",
            slow_ms=150.0,
            causes=("save_checkpoint",),
            requires=("every 4",),
            extra=("--every-steps", "4"),
        ),
        Scenario(
            "two-slow",
            "two ranks slow for two reasons: 40 ms in augment_batch_slowly on one, 25 ms in fetch_remote_features "
            "on the other",
            "cpu",
            causes=("augment_batch_slowly",),
            where="second",
            second=Second("sleep", 25.0, ("fetch_remote_features",), "last"),
            min_ranks=3,
        ),
        Scenario(
            "python-heavy",
            "every rank makes 3,000 small calls a step; one rank also spends 20 ms a step in tokenize_records, "
            "tens of thousands of tiny calls (its stacks beyond the capture budget)",
            "calls",
            slow_ms=20.0,
            causes=("tokenize_records",),
            extra=("--python-calls", "3000"),
        ),
        # Held aside (set b, since scored and developed on): other magnitudes, functions, periods, rank positions and
        # counts of the kinds above.
        Scenario(
            "slow-host-b",
            "the last rank's operators run slower with the same shapes: its CPU is stopped 4 ms of every 10 ms "
            "(hidden 768, batch 96)",
            "host",
            slow_ms=4.0,
            causes=("same shapes",),
            where="last",
            extra=("--hidden", "768", "--batch-size", "96"),
            held_aside="b",
        ),
        Scenario(
            "uneven-batches-b",
            "rank 0's batches are 2.5x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="first",
            extra=("--hidden", "1536", "--batch-factor", "2.5"),
            held_aside="b",
        ),
        Scenario(
            "gil-thread-b",
            "a logging thread of the last rank formats records in pure Python 20 ms of every 40 ms (flush_log_records)",
            "thread",
            slow_ms=20.0,
            causes=("flush_log_records",),
            requires=("thread",),
            where="last",
            extra=("--period-ms", "40", "--fault-function", "flush_log_records"),
            held_aside="b",
        ),
        Scenario(
            "periodic-eval-b",
            "every 3rd step rank 0 computes 90 ms in run_evaluation",
            "periodic",
            slow_ms=90.0,
            causes=("run_evaluation",),
            requires=("every 3",),
            where="first",
            extra=("--every-steps", "3", "--fault-function", "run_evaluation"),
            held_aside="b",
        ),
        Scenario(
            "two-slow-b",
            "rank 0 blocks 50 ms a step in fetch_remote_features, the middle rank computes 30 ms in "
            "augment_with_helpers",
            "sleep",
            slow_ms=50.0,
            causes=("fetch_remote_features",),
            where="first",
            second=Second("helpers", 30.0, ("augment_with_helpers",), "middle"),
            min_ranks=3,
            held_aside="b",
        ),
        Scenario(
            "python-heavy-b",
            "every rank makes 5,000 small calls a step; the last rank also spends 15 ms a step in "
            "parse_annotations, tens of thousands of tiny calls",
            "calls",
            slow_ms=15.0,
            causes=("parse_annotations",),
            where="last",
            extra=("--python-calls", "5000", "--fault-function", "parse_annotations"),
            held_aside="b",
        ),
        # Held aside (set c): other functions and call structures (a cause two or three calls deep, a
        # caller with several helpers), magnitudes, periods, rank positions and counts.
        Scenario(
            "slow-host-c",
            "the second rank's operators run slower with the same shapes: its CPU is stopped 5 ms of every 10 ms "
            "(hidden 640, batch 80)",
            "host",
            slow_ms=5.0,
            causes=("same shapes",),
            where="second",
            extra=("--hidden", "640", "--batch-size", "80"),
            held_aside="c",
        ),
        Scenario(
            "slow-host-c6",
            "the middle rank's CPU is stopped 6 ms of every 10 ms (hidden 896, batch 48)",
            "host",
            slow_ms=6.0,
            causes=("same shapes",),
            extra=("--hidden", "896", "--batch-size", "48"),
            held_aside="c",
        ),
        Scenario(
            "uneven-batches-c",
            "the second rank's batches are 3x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="second",
            extra=("--hidden", "1280", "--batch-factor", "3"),
            held_aside="c",
        ),
        Scenario(
            "gil-thread-c",
            "a telemetry thread of the middle rank encodes records in pure Python 12 ms of every 30 ms "
            "(compress_telemetry, its work in a helper)",
            "thread",
            slow_ms=12.0,
            causes=("compress_telemetry",),
            requires=("thread",),
            extra=("--period-ms", "30", "--fault-function", "compress_telemetry"),
            held_aside="c",
        ),
        Scenario(
            "gil-thread-c70",
            "a telemetry thread of the second rank encodes records 35 ms of every 50 ms (compress_telemetry)",
            "thread",
            slow_ms=35.0,
            causes=("compress_telemetry",),
            requires=("thread",),
            where="second",
            extra=("--period-ms", "50", "--fault-function", "compress_telemetry"),
            held_aside="c",
        ),
        Scenario(
            "periodic-refresh-c",
            "every 2nd step the second rank computes 70 ms in refresh_embeddings, three calls deep",
            "periodic",
            slow_ms=70.0,
            causes=("refresh_embeddings",),
            requires=("every 2",),
            where="second",
            extra=("--every-steps", "2", "--fault-function", "refresh_embeddings"),
            held_aside="c",
        ),
        Scenario(
            "periodic-validate-c",
            "every 5th step the middle rank computes 150 ms in validate_model, in two helpers of its own",
            "periodic",
            slow_ms=150.0,
            causes=("validate_model",),
            requires=("every 5",),
            extra=("--every-steps", "5", "--fault-function", "validate_model"),
            held_aside="c",
        ),
        Scenario(
            "prepare-features-c",
            "the middle rank computes 35 ms a step in prepare_features, spread over three helpers of its own",
            "cpu",
            slow_ms=35.0,
            causes=("prepare_features",),
            extra=("--fault-function", "prepare_features"),
            held_aside="c",
        ),
        Scenario(
            "python-heavy-c",
            "every rank makes 4,000 small calls a step; the second rank also spends 25 ms a step in "
            "normalize_text, tiny calls two deep",
            "calls",
            slow_ms=25.0,
            causes=("normalize_text",),
            where="second",
            extra=("--python-calls", "4000", "--fault-function", "normalize_text"),
            held_aside="c",
        ),
        Scenario(
            "two-slow-c",
            "rank 0 blocks 35 ms a step in load_side_inputs, the middle rank computes 30 ms in prepare_features",
            "sleep",
            slow_ms=35.0,
            causes=("load_side_inputs",),
            where="first",
            second=Second("cpu", 30.0, ("prepare_features",), "middle"),
            min_ranks=3,
            extra=("--fault-function", "load_side_inputs,prepare_features"),
            held_aside="c",
        ),
        # Held aside (set d): other throttles (3, 5, 7 of 10 ms), periods (every 3rd and 6th step of the
        # captured 8), functions and rank positions, and one of each earlier fleet kind with new names.
        Scenario(
            "slow-host-d3",
            "rank 0's CPU is stopped 3 ms of every 10 ms (hidden 704, batch 72)",
            "host",
            slow_ms=3.0,
            causes=("same shapes",),
            where="first",
            extra=("--hidden", "704", "--batch-size", "72"),
            held_aside="d",
        ),
        Scenario(
            "slow-host-d5",
            "the last rank's CPU is stopped 5 ms of every 10 ms (hidden 576, batch 112)",
            "host",
            slow_ms=5.0,
            causes=("same shapes",),
            where="last",
            extra=("--hidden", "576", "--batch-size", "112"),
            held_aside="d",
        ),
        Scenario(
            "slow-host-d7",
            "the second rank's CPU is stopped 7 ms of every 10 ms (hidden 960, batch 40)",
            "host",
            slow_ms=7.0,
            causes=("same shapes",),
            where="second",
            extra=("--hidden", "960", "--batch-size", "40"),
            held_aside="d",
        ),
        Scenario(
            "periodic-vocab-d",
            "every 3rd step the last rank computes 80 ms in rebuild_vocab",
            "periodic",
            slow_ms=80.0,
            causes=("rebuild_vocab",),
            requires=("every 3",),
            where="last",
            extra=("--every-steps", "3", "--fault-function", "rebuild_vocab"),
            held_aside="d",
        ),
        Scenario(
            "periodic-snapshot-d",
            "every 6th step the second rank computes 130 ms in snapshot_optimizer, in one helper",
            "periodic",
            slow_ms=130.0,
            causes=("snapshot_optimizer",),
            requires=("every 6",),
            where="second",
            extra=("--every-steps", "6", "--fault-function", "snapshot_optimizer"),
            held_aside="d",
        ),
        Scenario(
            "uneven-batches-d",
            "rank 0's batches are 2x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="first",
            extra=("--hidden", "1152", "--batch-factor", "2"),
            held_aside="d",
        ),
        Scenario(
            "gil-thread-d",
            "a configuration thread of rank 0 diffs feature flags in pure Python 18 ms of every 45 ms "
            "(sync_feature_flags, its work in a helper)",
            "thread",
            slow_ms=18.0,
            causes=("sync_feature_flags",),
            requires=("thread",),
            where="first",
            extra=("--period-ms", "45", "--fault-function", "sync_feature_flags"),
            held_aside="d",
        ),
        Scenario(
            "mix-samples-d",
            "the last rank computes 30 ms a step in mix_samples, in two helpers of its own",
            "cpu",
            slow_ms=30.0,
            causes=("mix_samples",),
            where="last",
            extra=("--fault-function", "mix_samples"),
            held_aside="d",
        ),
        Scenario(
            "python-heavy-d",
            "every rank makes 3,500 small calls a step; rank 0 also spends 20 ms a step in "
            "canonicalize_tokens, tens of thousands of tiny calls",
            "calls",
            slow_ms=20.0,
            causes=("canonicalize_tokens",),
            where="first",
            extra=("--python-calls", "3500", "--fault-function", "canonicalize_tokens"),
            held_aside="d",
        ),
        Scenario(
            "two-slow-d",
            "the last rank blocks 40 ms a step in await_feature_store, the second rank computes 30 ms in mix_samples",
            "sleep",
            slow_ms=40.0,
            causes=("await_feature_store",),
            where="last",
            second=Second("cpu", 30.0, ("mix_samples",), "second"),
            min_ranks=3,
            extra=("--fault-function", "await_feature_store,mix_samples"),
            held_aside="d",
        ),
        # Held aside (set e): throttles of 4 and 6 of 10 ms on other model sizes, batches 1.8x and
        # 3.5x, a GIL thread at 40 % of its period, a blocking cost every 2nd and a computing one every
        # 4th step, new functions, two slow ranks with a thread among them, and a healthy job whose
        # operators are most of its step; 2 to 4 ranks.
        Scenario(
            "slow-host-e4",
            "the middle rank's CPU is stopped 4 ms of every 10 ms (hidden 800, batch 60)",
            "host",
            slow_ms=4.0,
            causes=("same shapes",),
            extra=("--hidden", "800", "--batch-size", "60"),
            held_aside="e",
        ),
        Scenario(
            "slow-host-e6",
            "the last rank's CPU is stopped 6 ms of every 10 ms (hidden 608, batch 96)",
            "host",
            slow_ms=6.0,
            causes=("same shapes",),
            where="last",
            extra=("--hidden", "608", "--batch-size", "96"),
            held_aside="e",
        ),
        Scenario(
            "uneven-batches-e",
            "the second rank's batches are 1.8x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="second",
            extra=("--hidden", "1088", "--batch-factor", "1.8"),
            held_aside="e",
        ),
        Scenario(
            "uneven-batches-e35",
            "the last rank's batches are 3.5x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="last",
            extra=("--hidden", "896", "--batch-factor", "3.5"),
            held_aside="e",
        ),
        Scenario(
            "gil-thread-e",
            "a dashboard thread of the last rank renders panels in pure Python 22 ms of every 55 ms "
            "(export_dashboard, its work in a helper)",
            "thread",
            slow_ms=22.0,
            causes=("export_dashboard",),
            requires=("thread",),
            where="last",
            extra=("--period-ms", "55", "--fault-function", "export_dashboard"),
            held_aside="e",
        ),
        Scenario(
            "periodic-compact-e",
            "every 2nd step the middle rank blocks 60 ms in compact_cache",
            "periodic",
            slow_ms=60.0,
            causes=("compact_cache",),
            requires=("every 2",),
            extra=("--every-steps", "2", "--fault-function", "compact_cache"),
            held_aside="e",
        ),
        Scenario(
            "periodic-holdout-e",
            "every 4th step rank 0 computes 110 ms in score_holdout, in one helper",
            "periodic",
            slow_ms=110.0,
            causes=("score_holdout",),
            requires=("every 4",),
            where="first",
            extra=("--every-steps", "4", "--fault-function", "score_holdout"),
            held_aside="e",
        ),
        Scenario(
            "jitter-crops-e",
            "rank 0 computes 25 ms a step in jitter_crops, in two helpers of its own",
            "cpu",
            slow_ms=25.0,
            causes=("jitter_crops",),
            where="first",
            extra=("--fault-function", "jitter_crops"),
            held_aside="e",
        ),
        Scenario(
            "python-heavy-e",
            "every rank makes 2,500 small calls a step; the middle rank also spends 18 ms a step in "
            "strip_markup, tens of thousands of tiny calls",
            "calls",
            slow_ms=18.0,
            causes=("strip_markup",),
            extra=("--python-calls", "2500", "--fault-function", "strip_markup"),
            held_aside="e",
        ),
        Scenario(
            "two-slow-e",
            "rank 0 blocks 30 ms a step in wait_for_lease, the last rank computes 35 ms in jitter_crops",
            "sleep",
            slow_ms=30.0,
            causes=("wait_for_lease",),
            where="first",
            second=Second("cpu", 35.0, ("jitter_crops",), "last"),
            min_ranks=3,
            extra=("--fault-function", "wait_for_lease,jitter_crops"),
            held_aside="e",
        ),
        Scenario(
            "two-slow-thread-e",
            "a dashboard thread of the second rank renders panels 25 ms of every 50 ms, the last rank "
            "blocks 35 ms a step in wait_for_lease",
            "thread",
            slow_ms=25.0,
            causes=("export_dashboard",),
            where="second",
            second=Second("sleep", 35.0, ("wait_for_lease",), "last"),
            min_ranks=3,
            extra=("--period-ms", "50", "--fault-function", "export_dashboard,wait_for_lease"),
            held_aside="e",
        ),
        Scenario(
            "healthy-e",
            "no fault, a larger model (hidden 1024, batch 64): the operators are most of the step",
            None,
            extra=("--hidden", "1024", "--batch-size", "64"),
            held_aside="e",
        ),
        # Held aside (set f): throttles of 5 and 8 of 10 ms on other model sizes and positions, batches 2x
        # and 3x, a GIL thread at half its period, a blocking cost every 4th and a computing one every
        # 2nd step, other functions and positions, two slow ranks (many small calls and a sleep), and a healthy
        # job of another size; 2 to 4 ranks.
        Scenario(
            "slow-host-f5",
            "the middle rank's CPU is stopped 5 ms of every 10 ms (hidden 704, batch 80)",
            "host",
            slow_ms=5.0,
            causes=("same shapes",),
            extra=("--hidden", "704", "--batch-size", "80"),
            held_aside="f",
        ),
        Scenario(
            "slow-host-f8",
            "rank 0's CPU is stopped 8 ms of every 10 ms (hidden 640, batch 72)",
            "host",
            slow_ms=8.0,
            causes=("same shapes",),
            where="first",
            extra=("--hidden", "640", "--batch-size", "72"),
            held_aside="f",
        ),
        Scenario(
            "uneven-batches-f2",
            "the last rank's batches are 2x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="last",
            extra=("--hidden", "960", "--batch-factor", "2"),
            held_aside="f",
        ),
        Scenario(
            "uneven-batches-f3",
            "rank 0's batches are 3x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="first",
            extra=("--hidden", "1152", "--batch-factor", "3"),
            held_aside="f",
        ),
        Scenario(
            "gil-thread-f",
            "a telemetry thread of the middle rank compresses samples in pure Python 35 ms of every 70 ms "
            "(compress_telemetry)",
            "thread",
            slow_ms=35.0,
            causes=("compress_telemetry",),
            requires=("thread",),
            extra=("--period-ms", "70", "--fault-function", "compress_telemetry"),
            held_aside="f",
        ),
        Scenario(
            "periodic-checkpoint-f",
            "every 4th step the second rank blocks 120 ms in save_checkpoint",
            "periodic",
            slow_ms=120.0,
            causes=("save_checkpoint",),
            requires=("every 4",),
            where="second",
            extra=("--every-steps", "4", "--fault-function", "save_checkpoint"),
            held_aside="f",
        ),
        Scenario(
            "periodic-vocab-f",
            "every 2nd step the last rank computes 70 ms in rebuild_vocab",
            "periodic",
            slow_ms=70.0,
            causes=("rebuild_vocab",),
            requires=("every 2",),
            where="last",
            extra=("--every-steps", "2", "--fault-function", "rebuild_vocab"),
            held_aside="f",
        ),
        Scenario(
            "mix-samples-f",
            "the last rank computes 30 ms a step in mix_samples",
            "cpu",
            slow_ms=30.0,
            causes=("mix_samples",),
            where="last",
            extra=("--fault-function", "mix_samples"),
            held_aside="f",
        ),
        Scenario(
            "side-inputs-f",
            "rank 0 blocks 35 ms a step in load_side_inputs",
            "sleep",
            slow_ms=35.0,
            causes=("load_side_inputs",),
            where="first",
            extra=("--fault-function", "load_side_inputs"),
            held_aside="f",
        ),
        Scenario(
            "python-heavy-f",
            "every rank makes 4,000 small calls a step; the middle rank also spends 22 ms a step in "
            "canonicalize_tokens, tens of thousands of tiny calls",
            "calls",
            slow_ms=22.0,
            causes=("canonicalize_tokens",),
            extra=("--python-calls", "4000", "--fault-function", "canonicalize_tokens"),
            held_aside="f",
        ),
        Scenario(
            "two-slow-f",
            "the second rank computes 35 ms a step in augment_with_helpers, the last rank blocks 30 ms in "
            "fetch_remote_features",
            "helpers",
            slow_ms=35.0,
            causes=("augment_with_helpers",),
            where="second",
            second=Second("sleep", 30.0, ("fetch_remote_features",), "last"),
            min_ranks=3,
            held_aside="f",
        ),
        Scenario(
            "healthy-f",
            "no fault, another model size (hidden 768, batch 48)",
            None,
            extra=("--hidden", "768", "--batch-size", "48"),
            held_aside="f",
        ),
        # Held aside (set g): throttles of 4 and 6 of 10 ms on the second and last rank, batches 2.2x
        # and 1.6x, a GIL thread on rank 0, costs every 3rd and 4th step, other functions and
        # positions, two slow ranks (a computation and a sleep), and a healthy job of another size.
        Scenario(
            "slow-host-g6",
            "the second rank's CPU is stopped 6 ms of every 10 ms (hidden 832, batch 56)",
            "host",
            slow_ms=6.0,
            causes=("same shapes",),
            where="second",
            extra=("--hidden", "832", "--batch-size", "56"),
            held_aside="g",
        ),
        Scenario(
            "slow-host-g4",
            "the last rank's CPU is stopped 4 ms of every 10 ms (hidden 576, batch 112)",
            "host",
            slow_ms=4.0,
            causes=("same shapes",),
            where="last",
            extra=("--hidden", "576", "--batch-size", "112"),
            held_aside="g",
        ),
        Scenario(
            "uneven-batches-g22",
            "the middle rank's batches are 2.2x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            extra=("--hidden", "1024", "--batch-factor", "2.2"),
            held_aside="g",
        ),
        Scenario(
            "uneven-batches-g16",
            "the second rank's batches are 1.6x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="second",
            extra=("--hidden", "1280", "--batch-factor", "1.6"),
            held_aside="g",
        ),
        Scenario(
            "gil-thread-g",
            "a feature-flag thread of rank 0 parses flags in pure Python 28 ms of every 60 ms (sync_feature_flags)",
            "thread",
            slow_ms=28.0,
            causes=("sync_feature_flags",),
            requires=("thread",),
            where="first",
            extra=("--period-ms", "60", "--fault-function", "sync_feature_flags"),
            held_aside="g",
        ),
        Scenario(
            "periodic-refresh-g",
            "every 3rd step the middle rank computes 80 ms in refresh_embeddings",
            "periodic",
            slow_ms=80.0,
            causes=("refresh_embeddings",),
            requires=("every 3",),
            extra=("--every-steps", "3", "--fault-function", "refresh_embeddings"),
            held_aside="g",
        ),
        Scenario(
            "periodic-snapshot-g",
            "every 4th step the last rank computes 100 ms in snapshot_optimizer",
            "periodic",
            slow_ms=100.0,
            causes=("snapshot_optimizer",),
            requires=("every 4",),
            where="last",
            extra=("--every-steps", "4", "--fault-function", "snapshot_optimizer"),
            held_aside="g",
        ),
        Scenario(
            "prepare-features-g",
            "the second rank computes 35 ms a step in prepare_features",
            "cpu",
            slow_ms=35.0,
            causes=("prepare_features",),
            where="second",
            extra=("--fault-function", "prepare_features"),
            held_aside="g",
        ),
        Scenario(
            "feature-store-g",
            "the last rank blocks 45 ms a step in await_feature_store",
            "sleep",
            slow_ms=45.0,
            causes=("await_feature_store",),
            where="last",
            extra=("--fault-function", "await_feature_store"),
            held_aside="g",
        ),
        Scenario(
            "python-heavy-g",
            "every rank makes 3,000 small calls a step; rank 0 also spends 25 ms a step in normalize_text, "
            "tens of thousands of tiny calls",
            "calls",
            slow_ms=25.0,
            causes=("normalize_text",),
            where="first",
            extra=("--python-calls", "3000", "--fault-function", "normalize_text"),
            held_aside="g",
        ),
        Scenario(
            "two-slow-g",
            "the last rank computes 30 ms a step in prepare_features, rank 0 blocks 40 ms in await_feature_store",
            "cpu",
            slow_ms=30.0,
            causes=("prepare_features",),
            where="last",
            second=Second("sleep", 40.0, ("await_feature_store",), "first"),
            min_ranks=3,
            extra=("--fault-function", "prepare_features,await_feature_store"),
            held_aside="g",
        ),
        Scenario(
            "healthy-g",
            "no fault, another model size (hidden 896, batch 40)",
            None,
            extra=("--hidden", "896", "--batch-size", "40"),
            held_aside="g",
        ),
        # Held aside (set h): a throttle of 5 of 10 ms on the last rank and 7 on the second, batches 1.8x
        # and 2.6x, a GIL thread on the last rank, a blocking cost every 3rd step, other functions and
        # positions, two slow ranks (a thread and a computation), and a healthy job of another size.
        Scenario(
            "slow-host-h5",
            "the last rank's CPU is stopped 5 ms of every 10 ms (hidden 672, batch 88)",
            "host",
            slow_ms=5.0,
            causes=("same shapes",),
            where="last",
            extra=("--hidden", "672", "--batch-size", "88"),
            held_aside="h",
        ),
        Scenario(
            "slow-host-h7",
            "the second rank's CPU is stopped 7 ms of every 10 ms (hidden 896, batch 48)",
            "host",
            slow_ms=7.0,
            causes=("same shapes",),
            where="second",
            extra=("--hidden", "896", "--batch-size", "48"),
            held_aside="h",
        ),
        Scenario(
            "uneven-batches-h18",
            "rank 0's batches are 1.8x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="first",
            extra=("--hidden", "1216", "--batch-factor", "1.8"),
            held_aside="h",
        ),
        Scenario(
            "uneven-batches-h26",
            "the middle rank's batches are 2.6x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            extra=("--hidden", "864", "--batch-factor", "2.6"),
            held_aside="h",
        ),
        Scenario(
            "gil-thread-h",
            "a metrics thread of the last rank serialises samples in pure Python 24 ms of every 48 ms "
            "(publish_metrics)",
            "thread",
            slow_ms=24.0,
            causes=("publish_metrics",),
            requires=("thread",),
            where="last",
            extra=("--period-ms", "48", "--fault-function", "publish_metrics"),
            held_aside="h",
        ),
        Scenario(
            "periodic-compact-h",
            "every 3rd step rank 0 blocks 90 ms in compact_cache",
            "periodic",
            slow_ms=90.0,
            causes=("compact_cache",),
            requires=("every 3",),
            where="first",
            extra=("--every-steps", "3", "--fault-function", "compact_cache"),
            held_aside="h",
        ),
        Scenario(
            "jitter-crops-h",
            "the middle rank computes 32 ms a step in jitter_crops",
            "cpu",
            slow_ms=32.0,
            causes=("jitter_crops",),
            extra=("--fault-function", "jitter_crops"),
            held_aside="h",
        ),
        Scenario(
            "lease-h",
            "the second rank blocks 38 ms a step in wait_for_lease",
            "sleep",
            slow_ms=38.0,
            causes=("wait_for_lease",),
            where="second",
            extra=("--fault-function", "wait_for_lease"),
            held_aside="h",
        ),
        Scenario(
            "python-heavy-h",
            "every rank makes 3,500 small calls a step; the last rank also spends 20 ms a step in "
            "tokenize_records, tens of thousands of tiny calls",
            "calls",
            slow_ms=20.0,
            causes=("tokenize_records",),
            where="last",
            extra=("--python-calls", "3500", "--fault-function", "tokenize_records"),
            held_aside="h",
        ),
        Scenario(
            "two-slow-h",
            "a telemetry thread of rank 0 compresses samples 25 ms of every 50 ms, the last rank computes "
            "30 ms a step in mix_samples",
            "thread",
            slow_ms=25.0,
            causes=("compress_telemetry",),
            where="first",
            second=Second("cpu", 30.0, ("mix_samples",), "last"),
            min_ranks=3,
            extra=("--period-ms", "50", "--fault-function", "compress_telemetry,mix_samples"),
            held_aside="h",
        ),
        Scenario(
            "healthy-h",
            "no fault, another model size (hidden 640, batch 56)",
            None,
            extra=("--hidden", "640", "--batch-size", "56"),
            held_aside="h",
        ),
        # Held aside (set i): throttles of 6 of 10 ms on rank 0 and 8 on the last rank, batches 2.4x
        # and 1.7x, a GIL thread on the middle rank, costs every 2nd and 4th step, other functions and
        # positions, two jobs with two slow ranks (a thread and a sleep; a sleep and many small
        # calls), and a healthy job of another size.
        Scenario(
            "slow-host-i6",
            "rank 0's CPU is stopped 6 ms of every 10 ms (hidden 768, batch 64)",
            "host",
            slow_ms=6.0,
            causes=("same shapes",),
            where="first",
            extra=("--hidden", "768", "--batch-size", "64"),
            held_aside="i",
        ),
        Scenario(
            "slow-host-i8",
            "the last rank's CPU is stopped 8 ms of every 10 ms (hidden 512, batch 96)",
            "host",
            slow_ms=8.0,
            causes=("same shapes",),
            where="last",
            extra=("--hidden", "512", "--batch-size", "96"),
            held_aside="i",
        ),
        Scenario(
            "uneven-batches-i24",
            "the last rank's batches are 2.4x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="last",
            extra=("--hidden", "896", "--batch-factor", "2.4"),
            held_aside="i",
        ),
        Scenario(
            "uneven-batches-i17",
            "the second rank's batches are 1.7x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="second",
            extra=("--hidden", "1088", "--batch-factor", "1.7"),
            held_aside="i",
        ),
        Scenario(
            "gil-thread-i",
            "a logging thread of the middle rank formats records in pure Python 30 ms of every 55 ms "
            "(flush_log_records)",
            "thread",
            slow_ms=30.0,
            causes=("flush_log_records",),
            requires=("thread",),
            extra=("--period-ms", "55", "--fault-function", "flush_log_records"),
            held_aside="i",
        ),
        Scenario(
            "periodic-validate-i",
            "every 2nd step the second rank computes 60 ms in validate_model, in two helpers of its own",
            "periodic",
            slow_ms=60.0,
            causes=("validate_model",),
            requires=("every 2",),
            where="second",
            extra=("--every-steps", "2", "--fault-function", "validate_model"),
            held_aside="i",
        ),
        Scenario(
            "periodic-holdout-i",
            "every 4th step the last rank computes 85 ms in score_holdout, in one helper",
            "periodic",
            slow_ms=85.0,
            causes=("score_holdout",),
            requires=("every 4",),
            where="last",
            extra=("--every-steps", "4", "--fault-function", "score_holdout"),
            held_aside="i",
        ),
        Scenario(
            "mix-samples-i",
            "rank 0 computes 33 ms a step in mix_samples",
            "cpu",
            slow_ms=33.0,
            causes=("mix_samples",),
            where="first",
            extra=("--fault-function", "mix_samples"),
            held_aside="i",
        ),
        Scenario(
            "side-inputs-i",
            "the last rank blocks 42 ms a step in load_side_inputs",
            "sleep",
            slow_ms=42.0,
            causes=("load_side_inputs",),
            where="last",
            extra=("--fault-function", "load_side_inputs"),
            held_aside="i",
        ),
        Scenario(
            "python-heavy-i",
            "every rank makes 4,500 small calls a step; the second rank also spends 18 ms a step in "
            "strip_markup, tens of thousands of tiny calls",
            "calls",
            slow_ms=18.0,
            causes=("strip_markup",),
            where="second",
            extra=("--python-calls", "4500", "--fault-function", "strip_markup"),
            held_aside="i",
        ),
        Scenario(
            "two-slow-i",
            "a dashboard thread of the second rank renders panels 30 ms of every 60 ms, the last rank blocks "
            "35 ms a step in wait_for_lease",
            "thread",
            slow_ms=30.0,
            causes=("export_dashboard",),
            where="second",
            second=Second("sleep", 35.0, ("wait_for_lease",), "last"),
            min_ranks=3,
            extra=("--period-ms", "60", "--fault-function", "export_dashboard,wait_for_lease"),
            held_aside="i",
        ),
        Scenario(
            "two-slow-i2",
            "rank 0 blocks 30 ms a step in await_feature_store, the middle rank spends 40 ms in augment_with_helpers",
            "sleep",
            slow_ms=30.0,
            causes=("await_feature_store",),
            where="first",
            second=Second("helpers", 40.0, ("augment_with_helpers",), "middle"),
            min_ranks=3,
            extra=("--fault-function", "await_feature_store"),
            held_aside="i",
        ),
        Scenario(
            "healthy-i",
            "no fault, another model size (hidden 512, batch 80)",
            None,
            extra=("--hidden", "512", "--batch-size", "80"),
            held_aside="i",
        ),
        # Held aside (set j): throttles of 7 of 10 ms on rank 0 and 5 on the second rank, batches 3x
        # and 2x, a GIL thread on the last rank, costs every 3rd and 4th step, other functions and
        # positions, two jobs with two slow ranks (a thread and a computation; a sleep and a
        # computation), and a healthy job of another size.
        Scenario(
            "slow-host-j7",
            "rank 0's CPU is stopped 7 ms of every 10 ms (hidden 960, batch 40)",
            "host",
            slow_ms=7.0,
            causes=("same shapes",),
            where="first",
            extra=("--hidden", "960", "--batch-size", "40"),
            held_aside="j",
        ),
        Scenario(
            "slow-host-j5",
            "the second rank's CPU is stopped 5 ms of every 10 ms (hidden 608, batch 88)",
            "host",
            slow_ms=5.0,
            causes=("same shapes",),
            where="second",
            extra=("--hidden", "608", "--batch-size", "88"),
            held_aside="j",
        ),
        Scenario(
            "uneven-batches-j3",
            "the middle rank's batches are 3x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            extra=("--hidden", "832", "--batch-factor", "3"),
            held_aside="j",
        ),
        Scenario(
            "uneven-batches-j2",
            "the last rank's batches are 2x its peers' (uneven shards)",
            "batch",
            causes=("larger", "uneven"),
            where="last",
            extra=("--hidden", "992", "--batch-factor", "2"),
            held_aside="j",
        ),
        Scenario(
            "gil-thread-j",
            "a feature-flag thread of the last rank parses flags in pure Python 26 ms of every 50 ms "
            "(sync_feature_flags)",
            "thread",
            slow_ms=26.0,
            causes=("sync_feature_flags",),
            requires=("thread",),
            where="last",
            extra=("--period-ms", "50", "--fault-function", "sync_feature_flags"),
            held_aside="j",
        ),
        Scenario(
            "periodic-checkpoint-j",
            "every 3rd step the second rank blocks 100 ms in save_checkpoint",
            "periodic",
            slow_ms=100.0,
            causes=("save_checkpoint",),
            requires=("every 3",),
            where="second",
            extra=("--every-steps", "3", "--fault-function", "save_checkpoint"),
            held_aside="j",
        ),
        Scenario(
            "periodic-evaluation-j",
            "every 4th step the middle rank computes 90 ms in run_evaluation, three calls deep",
            "periodic",
            slow_ms=90.0,
            causes=("run_evaluation",),
            requires=("every 4",),
            extra=("--every-steps", "4", "--fault-function", "run_evaluation"),
            held_aside="j",
        ),
        Scenario(
            "prepare-features-j",
            "rank 0 computes 36 ms a step in prepare_features",
            "cpu",
            slow_ms=36.0,
            causes=("prepare_features",),
            where="first",
            extra=("--fault-function", "prepare_features"),
            held_aside="j",
        ),
        Scenario(
            "remote-features-j",
            "the second rank blocks 45 ms a step in fetch_remote_features",
            "sleep",
            slow_ms=45.0,
            causes=("fetch_remote_features",),
            where="second",
            held_aside="j",
        ),
        Scenario(
            "python-heavy-j",
            "every rank makes 3,500 small calls a step; the middle rank also spends 21 ms a step in "
            "normalize_text, tens of thousands of tiny calls",
            "calls",
            slow_ms=21.0,
            causes=("normalize_text",),
            extra=("--python-calls", "3500", "--fault-function", "normalize_text"),
            held_aside="j",
        ),
        Scenario(
            "two-slow-j",
            "a metrics thread of the last rank serialises samples 28 ms of every 56 ms, rank 0 computes "
            "32 ms a step in jitter_crops",
            "thread",
            slow_ms=28.0,
            causes=("publish_metrics",),
            where="last",
            second=Second("cpu", 32.0, ("jitter_crops",), "first"),
            min_ranks=3,
            extra=("--period-ms", "56", "--fault-function", "publish_metrics,jitter_crops"),
            held_aside="j",
        ),
        Scenario(
            "two-slow-j2",
            "the second rank blocks 40 ms a step in load_side_inputs, the last rank computes 35 ms in mix_samples",
            "sleep",
            slow_ms=40.0,
            causes=("load_side_inputs",),
            where="second",
            second=Second("cpu", 35.0, ("mix_samples",), "last"),
            min_ranks=3,
            extra=("--fault-function", "load_side_inputs,mix_samples"),
            held_aside="j",
        ),
        Scenario(
            "healthy-j",
            "no fault, another model size (hidden 704, batch 64)",
            None,
            extra=("--hidden", "704", "--batch-size", "64"),
            held_aside="j",
        ),
    )
}
