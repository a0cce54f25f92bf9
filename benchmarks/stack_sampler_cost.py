"""What the agent's stack sampler (used where the capture budget dropped the Python stacks) costs
the training process: one process runs a step of CPU-heavy Python (many calls of a small helper)
and torch operator work, in short alternating blocks without the sampler (the reference) and with
it, and prints the median step time of each and their ratio, in CPU time of the process (both
threads: what the sampler costs, whatever else loads the machine) and in wall time (noisy on a
shared machine), the samples and trace events it kept per step, and how long turning them into
trace events took.

    .venv/bin/python benchmarks/stack_sampler_cost.py [--steps 5] [--blocks 40]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from stepscope.agent.stacks import StackSampler
from stepscope.contracts.wire import DEFAULT_MAX_STACK_EVENTS


def helper(i: int) -> int:
    return (i * 31) % 7


def step(x: torch.Tensor) -> torch.Tensor:
    sum(helper(i) for i in range(20_000))
    for _ in range(20):
        x = torch.tanh(x @ x) * 0.5
    return x


def block(steps: int, x: torch.Tensor) -> list[tuple[float, float]]:
    """(CPU seconds of the process, wall seconds) of each step."""
    times = []
    for _ in range(steps):
        cpu, wall = time.process_time(), time.perf_counter()
        step(x)
        times.append((time.process_time() - cpu, time.perf_counter() - wall))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per block (default %(default)s)")
    parser.add_argument("--blocks", type=int, default=40, help="blocks of each kind, alternating (default %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(128, 128)
    block(5, x)
    reference: list[tuple[float, float]] = []
    sampled: list[tuple[float, float]] = []
    kept, frames, export_s = 0, 0, 0.0
    for _ in range(args.blocks):
        reference += block(args.steps, x)
        sampler = StackSampler(threading.get_ident(), DEFAULT_MAX_STACK_EVENTS)
        sampler.start(0)
        sampled += block(args.steps, x)
        sampler.stop()
        t = time.perf_counter()
        events = sampler.events([{"name": "ProfilerStep#0", "ts": 0.0, "pid": 1, "tid": 1}])
        export_s += time.perf_counter() - t
        kept += len(sampler.samples)
        frames += len(events)
    n = args.blocks * args.steps
    for i, clock in enumerate(("CPU time", "wall time")):
        ref, with_sampler = statistics.median(r[i] for r in reference), statistics.median(s[i] for s in sampled)
        print(f"median step, {clock}: reference {ref * 1e3:.2f} ms, with the sampler {with_sampler * 1e3:.2f} ms: ratio {with_sampler / ref:.3f}")
    print(f"per step: {kept / n:.1f} samples, {frames / n:.1f} trace events; making the events: {export_s / n * 1e3:.3f} ms per step captured")


if __name__ == "__main__":
    main()
