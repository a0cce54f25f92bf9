"""A small data-parallel training job (DDP over gloo on CPU) to profile: run by path, one process
per rank, with torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK).

It knows nothing of stepscope: the agent attaches through the bootstrap. Faults can be injected:
a slow rank (extra CPU work in `augment_batch_slowly`) and a hung rank (blocks in
`block_forever` after its optimizer step, so its peers wait in the loss all-reduce; forever, or
for --hang-seconds).

    python stepscope/workload.py --steps 50 --slow-rank 1 --slow-ms 20
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=0, help="training steps to run; 0 runs until killed")
    p.add_argument("--step-sleep-ms", type=float, default=0.0, help="sleep this long in every step (simulates data loading)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--slow-rank", type=int, default=None, help="this rank does extra CPU work every step")
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra milliseconds of CPU work on --slow-rank")
    p.add_argument("--python-calls", type=int, default=0, help="call a small Python helper this many times in every step")
    p.add_argument("--hang-rank", type=int, default=None, help="this rank blocks forever at --hang-at-step")
    p.add_argument("--hang-at-step", type=int, default=None, help="zero-based step index where --hang-rank blocks")
    p.add_argument("--hang-seconds", type=float, default=0.0, help="block this long instead of forever (a hang that recovers)")
    p.add_argument("--no-optimizer", action="store_true", help="update weights by hand and mark steps with stepscope.step()")
    p.add_argument("--collective-timeout-s", type=float, default=1800.0, help="gloo timeout for collectives")
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


def block_forever(step: int, seconds: float = 0.0) -> None:
    """The injected hang: this rank does not reach its next collective (for `seconds`, 0 = ever)."""
    print(f"rank {dist.get_rank()} blocks {'for %g s' % seconds if seconds else 'forever'} at step {step}", flush=True)
    deadline = time.monotonic() + seconds
    while not seconds or time.monotonic() < deadline:
        time.sleep(0.1 if seconds else 3600)


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
    optimizer = None if args.no_optimizer else torch.optim.SGD(model.parameters(), lr=0.01)
    mark_step = step_marker() if args.no_optimizer else None
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    step = 0
    started = time.perf_counter()
    while args.steps <= 0 or step < args.steps:
        batch = torch.randn(args.batch_size, 64, generator=generator)
        target = torch.randint(0, 10, (args.batch_size,), generator=generator)
        if rank == args.slow_rank and args.slow_ms > 0:
            batch = augment_batch_slowly(batch, args.slow_ms)
        if args.python_calls > 0:
            call_many_small_functions(args.python_calls)
        if args.step_sleep_ms > 0:
            time.sleep(args.step_sleep_ms / 1000.0)
        loss = loss_fn(model(batch), target)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
            mark_step()
        if rank == args.hang_rank and step == args.hang_at_step:
            block_forever(step, args.hang_seconds)
        average_loss_across_ranks(loss)
        step += 1
    dist.barrier()
    print(f"rank {rank}/{world}: {step} steps in {time.perf_counter() - started:.2f} s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(train(parse_args()))
