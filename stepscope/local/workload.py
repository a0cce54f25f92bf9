"""A small data-parallel training job (DDP over gloo on CPU) to profile: run by path, one process
per rank, with torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK).

It knows nothing of stepscope: the agent attaches through the bootstrap. Faults can be injected on
--slow-rank (--fault, each with a known cause, for stepscope's fault-injection scenarios):

- cpu: extra CPU work in the Python function `augment_batch_slowly` (--slow-ms a step), or in
  `prepare_features`, `mix_samples`, `jitter_crops` or `warp_images` (--fault-function), which spread it over
  helpers of their own
- helpers: CPU work spread over many calls of small helpers, made by `augment_with_helpers`
- sleep: blocking, not computing: `fetch_remote_features` (or `load_side_inputs`, `await_feature_store`,
  `wait_for_lease`, `pull_shard_index`, --fault-function) sleeps --slow-ms a step
- compute: more operator work (its batch repeated --compute-factor times), no Python function of its own
- data: slow data loading: the rank's Dataset decodes each sample for --slow-ms / batch size
- hook: a slow DDP communication hook (`compressing_allreduce_hook` works --slow-ms a step)
- gc: garbage collection pauses (`release_memory` runs gc.collect() over many live objects)
- log: a slow step between backward and the optimizer step (`log_gradients` blocks --slow-ms a
  step), so that the rank's steps end that much later than its peers'
- host: the same operators run slower (a slow host or device): the rank's CPU is stopped, as a
  paused container's is, --slow-ms of every 10 ms by a helper process, so every
  operator of the rank takes longer with the same shapes
- limit: the same operators run slower as a container's CPU limit throttles them: the rank moves
  itself into a cgroup of its own that may use 10 - --slow-ms ms of CPU of every 10 ms (needs root)
- batch: larger batches (uneven shards): the rank's DataLoader gives --batch-factor times the batch
- thread: a background thread of the rank (--fault-function: publish_metrics, flush_log_records,
  compress_telemetry, sync_feature_flags, export_dashboard or upload_traces)
  runs pure Python for --slow-ms of every --period-ms, holding the GIL the training thread needs
- periodic: every --every-steps steps the rank spends --slow-ms in --fault-function
  (save_checkpoint or compact_cache, which block as a write does; run_evaluation, refresh_embeddings,
  three calls deep, validate_model, in two helpers, rebuild_vocab, snapshot_optimizer,
  score_holdout or rebalance_buckets, in one helper, which compute), not in the others
- calls: Python-heavy work: --fault-function (tokenize_records, parse_annotations, normalize_text,
  canonicalize_tokens, strip_markup or detokenize_spans)
  makes tens of thousands of tiny calls for --slow-ms a step, more than the capture budget's stacks hold

--fault-function may name several functions (comma-separated): each fault takes the first of its own.

and a hung rank (blocks in `block_forever` after its optimizer step, so its peers wait in the loss
all-reduce; forever, or for --hang-seconds). Every rank reads its batches through a DataLoader
whose shard reads block for --step-sleep-ms a step (the job's natural I/O wait). With
--restart-at-step every rank replaces itself with a fresh run after that many steps, keeping its
pid, as a restarted container's processes do.

    python stepscope/local/workload.py --steps 50 --slow-rank 1 --fault sleep --slow-ms 20
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

FAULTS = (
    "cpu",
    "helpers",
    "sleep",
    "compute",
    "data",
    "hook",
    "gc",
    "log",
    "host",
    "limit",
    "batch",
    "thread",
    "periodic",
    "calls",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=0, help="training steps to run; 0 runs until killed")
    p.add_argument(
        "--step-sleep-ms", type=float, default=0.0, help="sleep this long in every step (simulates data loading)"
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--slow-rank", type=int, default=None, help="the rank --fault slows down")
    p.add_argument("--fault", choices=FAULTS, default="cpu", help="how --slow-rank is slowed (default %(default)s)")
    p.add_argument("--slow-ms", type=float, default=0.0, help="milliseconds a step the fault costs --slow-rank")
    p.add_argument(
        "--slow-from-step",
        type=int,
        default=0,
        help="the cpu, helpers, sleep and gc faults start at this zero-based step (a slowdown mid-run)",
    )
    p.add_argument(
        "--compute-factor", type=int, default=4, help="--fault compute: how many times --slow-rank repeats its batch"
    )
    p.add_argument(
        "--python-calls", type=int, default=0, help="call a small Python helper this many times in every step"
    )
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="RANK:FAULT:MS",
        help="one more slow rank with its own fault and milliseconds (repeatable)",
    )
    p.add_argument("--batch-factor", type=float, default=1.5, help="--fault batch: the rank's batch over its peers'")
    p.add_argument("--every-steps", type=int, default=4, help="--fault periodic: the period in steps")
    p.add_argument("--period-ms", type=float, default=100.0, help="--fault thread: the background thread's period")
    p.add_argument(
        "--fault-function", default="", help="the function the thread, periodic and calls faults run (see above)"
    )
    p.add_argument("--hang-rank", type=int, default=None, help="this rank blocks forever at --hang-at-step")
    p.add_argument("--hang-at-step", type=int, default=None, help="zero-based step index where --hang-rank blocks")
    p.add_argument(
        "--hang-seconds", type=float, default=0.0, help="block this long instead of forever (a hang that recovers)"
    )
    p.add_argument(
        "--no-optimizer", action="store_true", help="update weights by hand and mark steps with stepscope.step()"
    )
    p.add_argument("--collective-timeout-s", type=float, default=1800.0, help="gloo timeout for collectives")
    p.add_argument(
        "--restart-at-step",
        type=int,
        default=None,
        help="after this many steps every rank replaces itself with a fresh run of the workload, keeping its pid "
        "(as a restarted container's process gets the pid of the one before)",
    )
    return p.parse_args(argv)


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def augment_batch_slowly(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Real CPU work in Python for about `milliseconds`, as a slow data augmentation would do."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        for i in range(200):
            acc = (acc * 31 + i) % 1_000_003
    return batch + (acc % 7) * 1e-6


def small_helper(i: int) -> int:
    return (i * 31) % 7


def call_many_small_functions(count: int) -> int:
    """Ordinary CPU-heavy Python: many calls of a small function (each one a Python event when
    the profiler records stacks)."""
    return sum(small_helper(i) for i in range(count))


def _jitter(value: int, i: int) -> int:
    return (value * 31 + i) % 1_000_003


def _clip(value: int) -> int:
    return value if value < 900_000 else value - 900_000


def augment_with_helpers(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """CPU work for about `milliseconds`, all of it in many calls of two tiny helpers: no single
    function but this one holds the time."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        for i in range(50):
            acc = _clip(_jitter(acc, i))
    return batch + (acc % 7) * 1e-6


def fetch_remote_features(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Blocks (as a slow remote read would), using no CPU."""
    time.sleep(milliseconds / 1000.0)
    return batch


def load_side_inputs(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Blocks on a side input (a lookup table, a feature store), using no CPU."""
    time.sleep(milliseconds / 1000.0)
    return batch


def await_feature_store(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Blocks on a feature store's answer, using no CPU."""
    time.sleep(milliseconds / 1000.0)
    return batch


def log_gradients(milliseconds: float) -> None:
    """Blocks after the gradients are reduced and before the optimizer step, as writing a log would."""
    time.sleep(milliseconds / 1000.0)


def _busy(milliseconds: float) -> int:
    """Pure Python work for about `milliseconds`: it holds the GIL but every switch interval."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        for i in range(200):
            acc = (acc * 31 + i) % 1_000_003
    return acc


def publish_metrics(milliseconds: float, period_ms: float, stop: threading.Event) -> None:
    """A metrics thread: every `period_ms` it aggregates in pure Python for `milliseconds`."""
    while not stop.wait(max(period_ms - milliseconds, 1.0) / 1000.0):
        _busy(milliseconds)


def flush_log_records(milliseconds: float, period_ms: float, stop: threading.Event) -> None:
    """A logging thread: every `period_ms` it formats records in pure Python for `milliseconds`."""
    while not stop.wait(max(period_ms - milliseconds, 1.0) / 1000.0):
        _busy(milliseconds)


def save_checkpoint(milliseconds: float) -> None:
    """A checkpoint write every few steps: blocks, as a write to remote storage does."""
    time.sleep(milliseconds / 1000.0)


def run_evaluation(milliseconds: float) -> None:
    """An evaluation every few steps: computes in Python."""
    _busy(milliseconds)


def _score_rows(milliseconds: float) -> int:
    return _busy(milliseconds)


def _rebuild_index(milliseconds: float) -> int:
    return _score_rows(milliseconds)


def refresh_embeddings(milliseconds: float) -> None:
    """A periodic refresh of an embedding index: its work is three calls deep."""
    _rebuild_index(milliseconds)


def _eval_batches(milliseconds: float) -> int:
    return _busy(milliseconds)


def _accumulate_metrics(milliseconds: float) -> int:
    return _busy(milliseconds)


def validate_model(milliseconds: float) -> None:
    """A validation pass every few steps: its time in two helpers of its own."""
    _eval_batches(milliseconds * 0.7)
    _accumulate_metrics(milliseconds * 0.3)


def _normalize(batch: torch.Tensor, milliseconds: float) -> int:
    return _busy(milliseconds)


def _pad(milliseconds: float) -> int:
    return _busy(milliseconds)


def _hash_features(milliseconds: float) -> int:
    return _busy(milliseconds)


def prepare_features(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Feature preparation in Python, its time spread over three helpers of its own."""
    acc = _normalize(batch, milliseconds * 0.4) + _pad(milliseconds * 0.25) + _hash_features(milliseconds * 0.35)
    return batch + (acc % 7) * 1e-6


def _encode_record(milliseconds: float) -> int:
    return _busy(milliseconds)


def compress_telemetry(milliseconds: float, period_ms: float, stop: threading.Event) -> None:
    """A telemetry thread: every `period_ms` it encodes records in pure Python for `milliseconds`."""
    while not stop.wait(max(period_ms - milliseconds, 1.0) / 1000.0):
        _encode_record(milliseconds)


def _diff_flags(milliseconds: float) -> int:
    return _busy(milliseconds)


def sync_feature_flags(milliseconds: float, period_ms: float, stop: threading.Event) -> None:
    """A configuration thread: every `period_ms` it diffs feature flags in pure Python for `milliseconds`."""
    while not stop.wait(max(period_ms - milliseconds, 1.0) / 1000.0):
        _diff_flags(milliseconds)


def rebuild_vocab(milliseconds: float) -> None:
    """A vocabulary rebuild every few steps: computes in Python."""
    _busy(milliseconds)


def _pack_state(milliseconds: float) -> int:
    return _busy(milliseconds)


def snapshot_optimizer(milliseconds: float) -> None:
    """An in-memory optimizer snapshot every few steps: its work in one helper."""
    _pack_state(milliseconds)


def _shuffle_rows(milliseconds: float) -> int:
    return _busy(milliseconds)


def _blend_pairs(milliseconds: float) -> int:
    return _busy(milliseconds)


def mix_samples(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Sample mixing in Python, its time in two helpers of its own."""
    acc = _shuffle_rows(milliseconds * 0.55) + _blend_pairs(milliseconds * 0.45)
    return batch + (acc % 5) * 1e-6


def _fold_case(i: int) -> int:
    return (i * 3) % 17


def canonicalize_tokens(milliseconds: float) -> int:
    """Python-heavy canonicalisation: tiny calls, tens of thousands a step."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        acc += sum(_fold_case(i) for i in range(100))
    return acc


def _lower_word(i: int) -> int:
    return (i * 5) % 11


def _split_words(count: int) -> int:
    return sum(_lower_word(i) for i in range(count))


def normalize_text(milliseconds: float) -> int:
    """Python-heavy text normalisation: tiny calls two deep, tens of thousands a step."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        acc += _split_words(100)
    return acc


def _token(i: int) -> int:
    return (i * 7) % 13


def tokenize_records(milliseconds: float) -> int:
    """Python-heavy preprocessing: tiny calls, tens of thousands a step."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        acc += sum(_token(i) for i in range(100))
    return acc


def parse_annotations(milliseconds: float) -> int:
    """Python-heavy parsing: tiny calls, tens of thousands a step."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        acc += sum(map(_token, range(100)))
    return acc


def _crop(milliseconds: float) -> int:
    return _busy(milliseconds)


def _flip(milliseconds: float) -> int:
    return _busy(milliseconds)


def jitter_crops(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Random crops and flips in Python, its time in two helpers of its own."""
    acc = _crop(milliseconds * 0.6) + _flip(milliseconds * 0.4)
    return batch + (acc % 3) * 1e-6


def wait_for_lease(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Blocks on a coordination service's lease, using no CPU."""
    time.sleep(milliseconds / 1000.0)
    return batch


def _render_panel(milliseconds: float) -> int:
    return _busy(milliseconds)


def export_dashboard(milliseconds: float, period_ms: float, stop: threading.Event) -> None:
    """A dashboard thread: every `period_ms` it renders panels in pure Python for `milliseconds`."""
    while not stop.wait(max(period_ms - milliseconds, 1.0) / 1000.0):
        _render_panel(milliseconds)


def compact_cache(milliseconds: float) -> None:
    """A cache compaction every few steps: blocks, as a write to local disk does."""
    time.sleep(milliseconds / 1000.0)


def _rank_candidates(milliseconds: float) -> int:
    return _busy(milliseconds)


def score_holdout(milliseconds: float) -> None:
    """A held-out scoring pass every few steps: its work in one helper."""
    _rank_candidates(milliseconds)


def _unescape(i: int) -> int:
    return (i * 11) % 19


def strip_markup(milliseconds: float) -> int:
    """Python-heavy markup stripping: tiny calls, tens of thousands a step."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        acc += sum([_unescape(i) for i in range(100)])
    return acc


def _tile(milliseconds: float) -> int:
    return _busy(milliseconds)


def _shear(milliseconds: float) -> int:
    return _busy(milliseconds)


def warp_images(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Affine warps in Python, its time in two helpers of its own."""
    acc = _tile(milliseconds * 0.5) + _shear(milliseconds * 0.5)
    return batch + (acc % 5) * 1e-6


def pull_shard_index(batch: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Blocks on a remote index of the next shard, using no CPU."""
    time.sleep(milliseconds / 1000.0)
    return batch


def _pack_span(milliseconds: float) -> int:
    return _busy(milliseconds)


def upload_traces(milliseconds: float, period_ms: float, stop: threading.Event) -> None:
    """A tracing exporter thread: every `period_ms` it packs spans in pure Python for `milliseconds`."""
    while not stop.wait(max(period_ms - milliseconds, 1.0) / 1000.0):
        _pack_span(milliseconds)


def _merge_counts(milliseconds: float) -> int:
    return _busy(milliseconds)


def rebalance_buckets(milliseconds: float) -> None:
    """A bucket rebalancing every few steps: its work in one helper."""
    _merge_counts(milliseconds)


def _fold_span(i: int) -> int:
    return (i * 13) % 23


def detokenize_spans(milliseconds: float) -> int:
    """Python-heavy detokenising: tiny calls, tens of thousands a step."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        acc += sum([_fold_span(i) for i in range(100)])
    return acc


THREAD_FUNCTIONS = {
    f.__name__: f
    for f in (
        publish_metrics,
        flush_log_records,
        compress_telemetry,
        sync_feature_flags,
        export_dashboard,
        upload_traces,
    )
}
PERIODIC_FUNCTIONS = {
    f.__name__: f
    for f in (
        save_checkpoint,
        run_evaluation,
        refresh_embeddings,
        validate_model,
        rebuild_vocab,
        snapshot_optimizer,
        compact_cache,
        score_holdout,
        rebalance_buckets,
    )
}
CALLS_FUNCTIONS = {
    f.__name__: f
    for f in (tokenize_records, parse_annotations, normalize_text, canonicalize_tokens, strip_markup, detokenize_spans)
}
CPU_FUNCTIONS = {
    f.__name__: f for f in (augment_batch_slowly, prepare_features, mix_samples, jitter_crops, warp_images)
}
SLEEP_FUNCTIONS = {
    f.__name__: f
    for f in (fetch_remote_features, load_side_inputs, await_feature_store, wait_for_lease, pull_shard_index)
}


def fault_function(table: dict[str, Callable], names: str) -> Callable:
    """The first of the comma-separated `names` that `table` holds, else its first function."""
    return next((table[n] for n in names.split(",") if n in table), next(iter(table.values())))


THROTTLE = """
import os, signal, sys, time
pid, stopped = int(sys.argv[1]), float(sys.argv[2]) / 1000.0
while os.getppid() == pid:
    os.kill(pid, signal.SIGSTOP)
    time.sleep(stopped)
    os.kill(pid, signal.SIGCONT)
    time.sleep(0.010 - stopped)
"""


def throttle_cpu(stopped_ms: float) -> subprocess.Popen:
    """A slower host for this rank: a helper process stops it `stopped_ms` of every 10 ms (as a
    paused container or a process that stops it does) until it ends."""
    return subprocess.Popen([sys.executable, "-c", THROTTLE, str(os.getpid()), f"{min(stopped_ms, 9.0):g}"])


def limit_cpu(throttled_ms: float) -> Path:
    """A CPU limit for this rank, as Kubernetes sets a container's: a cgroup of its own that may use
    10 - `throttled_ms` ms of CPU of every 10 ms (cgroup v1's cfs quota, or v2's cpu.max). Needs
    root and a writable cpu controller; says so and exits where there is none. Empty cgroups of
    earlier runs are removed first. Returns the cgroup's folder."""
    quota = round((10.0 - min(throttled_ms, 9.0)) * 1000)
    v1 = Path("/sys/fs/cgroup/cpu")
    v2 = Path("/sys/fs/cgroup")
    try:
        parent, files = (
            (v1, {"cpu.cfs_period_us": "10000", "cpu.cfs_quota_us": str(quota)})
            if (v1 / "cpu.cfs_quota_us").exists()
            else (v2, {"cpu.max": f"{quota} 10000"})
        )
        for stale in parent.glob("stepscope-limit-*"):
            if not (stale / "cgroup.procs").read_text().strip():
                stale.rmdir()
        group = parent / f"stepscope-limit-{os.getpid()}"
        group.mkdir(exist_ok=True)
        for name, value in files.items():
            (group / name).write_text(value)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        raise SystemExit(f"the limit fault needs root and a writable cgroup cpu controller: {e}") from e
    return group


def release_memory(live: list) -> None:
    """A full collection over many live objects: the pause a gc.collect() per step costs."""
    gc.collect()


def read_shard(milliseconds: float) -> None:
    """The job's natural I/O wait for its next shard (every rank)."""
    if milliseconds > 0:
        time.sleep(milliseconds / 1000.0)


class SyntheticDataset(Dataset):
    """Random samples; decoding one costs `decode_ms` of CPU work (0 on healthy ranks)."""

    def __init__(self, rank: int, decode_ms: float) -> None:
        self.generator = torch.Generator().manual_seed(rank)
        self.decode_ms = decode_ms

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample = torch.randn(64, generator=self.generator)
        if self.decode_ms > 0:
            sample = decode_sample(sample, self.decode_ms)
        return sample, torch.randint(0, 10, (), generator=self.generator)


def decode_sample(sample: torch.Tensor, milliseconds: float) -> torch.Tensor:
    """Tensor work on one sample for about `milliseconds`, as an image decode and resize would do."""
    deadline = time.perf_counter() + milliseconds / 1000.0
    pixels = sample.repeat(64)
    while time.perf_counter() < deadline:
        pixels = (pixels * 0.999).clamp_(-4.0, 4.0)
    return sample + pixels[:64] * 1e-6


def compressing_allreduce_hook(state, bucket):
    """A DDP communication hook that works `state` ms on each bucket before its all-reduce.
    Unannotated: DDP checks the annotations' values, and this module's are strings."""
    if state > 0:
        deadline = time.perf_counter() + state / 1000.0
        while time.perf_counter() < deadline:
            pass
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


def block_forever(step: int, seconds: float = 0.0) -> None:
    """The injected hang: this rank does not reach its next collective (for `seconds`, 0 = ever)."""
    print(f"rank {dist.get_rank()} blocks {f'for {seconds:g} s' if seconds else 'forever'} at step {step}", flush=True)
    deadline = time.monotonic() + seconds
    while not seconds or time.monotonic() < deadline:
        time.sleep(0.1 if seconds else 3600)


def restart_in_place(argv: list[str]) -> None:
    """Exec this workload again without --restart-at-step: a new process image, the same pid. Every
    rank does it after the same step, once all are there; the new rank 0 serves the rendezvous
    again on MASTER_PORT."""
    dist.barrier()
    rank = dist.get_rank()
    dist.destroy_process_group()
    at = argv.index("--restart-at-step")
    print(f"rank {rank} restarts in place (pid {os.getpid()})", flush=True)
    os.execv(sys.executable, [sys.executable, *argv[:at], *argv[at + 2 :]])


def average_loss_across_ranks(loss: torch.Tensor) -> float:
    value = loss.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value.item() / dist.get_world_size()


def step_marker() -> Callable[[], None]:
    """stepscope.step() when the package is installed, else the bootstrap agent's, else nothing."""
    try:
        import stepscope

        return stepscope.step
    except ImportError:
        agent = sys.modules.get("stepscope_agent")
        return agent.step if agent is not None else (lambda: None)


def train(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.collective_timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(build_model(args.hidden))
    fault = args.fault if rank == args.slow_rank else None
    for extra in args.also:
        other, kind, ms = extra.split(":")
        if int(other) == rank:
            args.slow_rank, fault, args.slow_ms = rank, kind, float(ms)
    slow = rank == args.slow_rank and args.slow_ms > 0
    if args.fault == "hook" and args.slow_rank is not None:
        # Every rank runs the hook; only the slow one works in it. DDP's default buckets of 25 MB
        # hold this model's gradients in one, so the hook runs once a step.
        model.register_comm_hook(args.slow_ms if slow else 0.0, compressing_allreduce_hook)
    decode_ms = args.slow_ms / args.batch_size if slow and fault == "data" else 0.0
    batch_size = round(args.batch_size * args.batch_factor) if slow and fault == "batch" else args.batch_size
    batches = iter(DataLoader(SyntheticDataset(rank, decode_ms), batch_size=batch_size, num_workers=0))
    hog = throttle_cpu(args.slow_ms) if slow and fault == "host" else None
    limited = limit_cpu(args.slow_ms) if slow and fault == "limit" else None
    stop = threading.Event()
    if slow and fault == "thread":
        target = fault_function(THREAD_FUNCTIONS, args.fault_function)
        threading.Thread(target=target, args=(args.slow_ms, args.period_ms, stop), name="metrics", daemon=True).start()
    # Live objects a collection must walk on the gc rank (about 1 ms of gc.collect() per 1,700 on
    # this 2-core machine under load).
    live = [[i] for i in range(int(1_700 * args.slow_ms))] if slow and fault == "gc" else []
    optimizer = None if args.no_optimizer else torch.optim.SGD(model.parameters(), lr=0.01)
    mark_step = step_marker() if args.no_optimizer else None
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    started = time.perf_counter()
    while args.steps <= 0 or step < args.steps:
        slow = rank == args.slow_rank and args.slow_ms > 0 and step >= args.slow_from_step
        read_shard(args.step_sleep_ms)
        batch, target = next(batches)
        if fault == "compute":
            batch, target = batch.repeat(args.compute_factor, 1), target.repeat(args.compute_factor)
        if slow and fault == "cpu":
            batch = fault_function(CPU_FUNCTIONS, args.fault_function)(batch, args.slow_ms)
        elif slow and fault == "helpers":
            batch = augment_with_helpers(batch, args.slow_ms)
        elif slow and fault == "sleep":
            batch = fault_function(SLEEP_FUNCTIONS, args.fault_function)(batch, args.slow_ms)
        elif slow and fault == "calls":
            fault_function(CALLS_FUNCTIONS, args.fault_function)(args.slow_ms)
        if args.python_calls > 0:
            call_many_small_functions(args.python_calls)
        loss = loss_fn(model(batch), target)
        loss.backward()
        if slow and fault == "log":
            log_gradients(args.slow_ms)
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
            if mark_step is not None:
                mark_step()
        if slow and fault == "gc":
            release_memory(live)
        if slow and fault == "periodic" and step % args.every_steps == args.every_steps - 1:
            fault_function(PERIODIC_FUNCTIONS, args.fault_function)(args.slow_ms)
        if rank == args.hang_rank and step == args.hang_at_step:
            block_forever(step, args.hang_seconds)
        average_loss_across_ranks(loss)
        step += 1
        if step == args.restart_at_step:
            restart_in_place(sys.argv)
    stop.set()
    if hog is not None:
        hog.kill()
        hog.wait()
        os.kill(os.getpid(), signal.SIGCONT)
    if limited is not None:
        (limited.parent / "cgroup.procs").write_text(str(os.getpid()))
        limited.rmdir()
    dist.barrier()
    print(f"rank {rank}/{world}: {step} steps in {time.perf_counter() - started:.2f} s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(train(parse_args()))
