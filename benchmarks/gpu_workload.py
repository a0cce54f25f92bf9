"""A small data-parallel CUDA training job for benchmarks/gpu_check.py, one process per rank with
torchrun's environment. It knows nothing of stepscope: the agent attaches through the bootstrap.

Every rank trains an MLP under DistributedDataParallel over gloo, all ranks on the same GPU when
the machine has one (NCCL refuses two ranks on one device; gloo copies through the host). Each
step every rank also runs `postprocess_on_gpu`: one spin kernel of --spin-ms (torch.cuda._sleep,
whose length in SM cycles is known), on --slow-rank --slow-ms longer, between the backward pass
and the optimizer step, so that the slow rank's peers wait for it in the loss all-reduce while
their own GPU work is done. The diagnosis should name that rank and that kernel. On the CPU
(--device cpu, for checking the script without a GPU) the same function busy-waits instead.

    python benchmarks/gpu_workload.py --device cuda --slow-rank 1 --slow-ms 10
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=0, help="training steps to run; 0 runs until killed")
    p.add_argument("--hidden", type=int, default=None, help="width (default 2048 on CUDA, 256 on the CPU)")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=None, help="rows (default 8192 on CUDA, 64 on the CPU)")
    p.add_argument("--spin-ms", type=float, default=1.0, help="every rank's spin kernel a step")
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-ms", type=float, default=0.0, help="how much longer --slow-rank's spin kernel runs")
    return p.parse_args(argv)


def cycles_per_ms() -> float:
    """SM cycles the spin kernel takes per millisecond on this GPU now, timed with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # leaves the idle clock
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


def postprocess_on_gpu(milliseconds: float, cycles: float) -> None:
    if milliseconds <= 0:
        return
    if cycles > 0:
        torch.cuda._sleep(int(milliseconds * cycles))
        return
    deadline = time.perf_counter() + milliseconds / 1e3
    while time.perf_counter() < deadline:
        pass


def average_loss_across_ranks(loss: torch.Tensor) -> float:
    value = loss.detach().cpu()  # waits for this rank's GPU work, the spin kernel included
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value.item() / dist.get_world_size()


def train(args: argparse.Namespace) -> int:
    cuda = args.device == "cuda"
    hidden = args.hidden or (2048 if cuda else 256)
    batch_size = args.batch_size or (8192 if cuda else 64)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    model = DistributedDataParallel(
        nn.Sequential(*layers, nn.Linear(hidden, 10)).to(device), device_ids=[device.index] if cuda else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = torch.randn(batch_size, hidden, device=device)
    target = torch.randint(0, 10, (batch_size,), device=device)
    cycles = cycles_per_ms() if cuda else 0.0
    spin = args.spin_ms + (args.slow_ms if rank == args.slow_rank else 0.0)
    print(f"rank {rank}/{world} on {device}: spin kernel {spin:.2f} ms a step ({cycles:.0f} cycles/ms)", flush=True)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    started = time.perf_counter()
    while args.steps <= 0 or step < args.steps:
        loss = loss_fn(model(batch), target)
        loss.backward()
        postprocess_on_gpu(spin, cycles)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        average_loss_across_ranks(loss)
        step += 1
    dist.barrier()
    print(f"rank {rank}/{world}: {step} steps in {time.perf_counter() - started:.2f} s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(train(parse_args()))
