"""Realistic synthetic rank summaries of a synchronous data-parallel job, for the diagnosis tests
and benchmarks/diagnose_scale.py.

Each step every rank computes (its kernels), then all ranks meet in collectives: a collective
ends when the last rank arrived plus the transfer time, so the rank that computes longest has
the shortest collectives and everyone's step time evens out to the slowest rank's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from stepscope.analysis.model import (
    SUMMARY_VERSION,
    CollectiveStat,
    FunctionStat,
    IdleBreakdown,
    KernelStat,
    KernelTypeShare,
    LaunchStats,
    MemoryOpStat,
    RankSummary,
    RuntimeStat,
    StepRow,
    TemporalBreakdown,
)

COMM_KERNEL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
TRAIN_FUNCTIONS = [
    "train.py(88): train_step",
    "train.py(30): load_batch",
    "model.py(12): forward",
    "optim.py(77): step",
]


def kernel_names(count: int) -> list[str]:
    """A third GEMMs, the rest elementwise kernels, like a transformer's mix."""
    gemms = max(1, count // 3)
    return [f"volta_sgemm_128x64_nn_{i}" for i in range(gemms)] + [
        f"void at::native::elementwise_kernel<{i}>" for i in range(count - gemms)
    ]


def make_summaries(ranks: int = 8, **kwargs: Any) -> list[RankSummary]:
    """Every rank's summary of the job iter_summaries describes."""
    return list(iter_summaries(ranks, **kwargs))


def iter_summaries(
    ranks: int = 8,
    *,
    steps: int = 4,
    seed: int = 0,
    slow_rank: int | None = None,
    kernel_factor: float = 1.0,
    extra_step_us: float = 0.0,
    python_rank: int | None = None,
    python_us: float = 0.0,
    memcpy_ratio: float = 0.002,
    collectives_per_step: int = 20,
    bandwidth_rank: int | None = None,
    kernels: int = 36,
    functions: int = 0,
) -> Iterator[RankSummary]:
    """The ranks' summaries one at a time (a job of thousands of ranks need not be held at once).
    `slow_rank` runs its kernels `kernel_factor` times longer and adds `extra_step_us` of host
    time per step before the collectives; `python_rank` spends `python_us` per step in
    augment_batch_slowly (train.py:42); memory copies take `memcpy_ratio` of the captured time.
    `kernels` distinct kernel names run on every rank, plus `functions` small Python functions."""
    rng = np.random.default_rng(seed)
    compute_kernels = kernel_names(kernels)
    train_functions = TRAIN_FUNCTIONS + [f"lib/module_{i}.py({i}): helper_{i}" for i in range(functions)]
    base_kernel_us = rng.uniform(50, 2000 * 36 / kernels, len(compute_kernels))
    counts = rng.integers(4, 40, len(compute_kernels))
    compute_us = np.full(ranks, float((base_kernel_us * counts).sum()))
    factor = np.ones(ranks)
    host_us = np.full(ranks, 5000.0)
    if slow_rank is not None:
        factor[slow_rank] = kernel_factor
        host_us[slow_rank] += extra_step_us
    if python_rank is not None:
        host_us[python_rank] += python_us
    rounds = steps * collectives_per_step
    # Arrival time of each rank at each collective, relative to the round's start.
    arrival = (compute_us * factor + host_us)[:, None] / collectives_per_step * rng.uniform(0.97, 1.03, (ranks, rounds))
    transfer = rng.uniform(300, 400, rounds)
    durations = arrival.max(axis=0)[None, :] + transfer[None, :] - arrival
    step_us = (arrival.max(axis=0) + transfer).reshape(steps, collectives_per_step).sum(axis=1)
    for r in range(ranks):
        kernel_mean = base_kernel_us * factor[r] * rng.uniform(0.98, 1.02, len(compute_kernels))
        comm = durations[r]
        kernels = [
            KernelStat(
                name=n,
                type="COMP",
                count=int(c) * steps,
                sumUs=float(m * c * steps),
                meanUs=float(m),
                medianUs=float(m),
                minUs=float(m * 0.9),
                maxUs=float(m * 1.1),
            )
            for n, c, m in zip(compute_kernels, counts, kernel_mean)
        ]
        kernels.append(
            KernelStat(
                name=COMM_KERNEL,
                type="COMM",
                count=rounds,
                sumUs=float(comm.sum()),
                meanUs=float(comm.mean()),
                medianUs=float(np.median(comm)),
                minUs=float(comm.min()),
                maxUs=float(comm.max()),
            )
        )
        captured = float(step_us.sum())
        comp_sum = float(sum(k.sumUs for k in kernels if k.type == "COMP"))
        step_rows = [
            StepRow(
                step=10 + i,
                startUs=float(step_us[:i].sum()),
                durationUs=float(d),
                computingUs=comp_sum / steps,
                communicationUs=float(comm.sum()) / steps,
                commNotOverlappedUs=float(comm.sum()) / steps * 0.05,
                overlappedUs=float(comm.sum()) / steps * 0.95,
                freeUs=float(d) * 0.05,
            )
            for i, d in enumerate(step_us)
        ]
        functions = [
            FunctionStat(
                name=n, stack=n, count=steps, exclusiveUs=float(rng.uniform(1000, 3000) * steps), notOverlappedUs=0.0
            )
            for n in train_functions
        ]
        if r == python_rank:
            functions.append(
                FunctionStat(
                    name="/src/train.py(42): augment_batch_slowly",
                    stack="train.py(88): train_step;train.py(42): augment_batch_slowly",
                    count=steps,
                    exclusiveUs=python_us * steps,
                    notOverlappedUs=python_us * steps,
                )
            )
        else:
            functions.append(
                FunctionStat(
                    name="/src/train.py(42): augment_batch_slowly",
                    stack="train.py(88): train_step;train.py(42): augment_batch_slowly",
                    count=steps,
                    exclusiveUs=python_us / 10 * steps if python_us else 200.0 * steps,
                    notOverlappedUs=0.0,
                )
            )
        bw = 40.0 * (0.3 if r == bandwidth_rank else 1.0) * rng.uniform(0.97, 1.03)
        yield RankSummary(
            version=SUMMARY_VERSION,
            rank=r,
            worldSize=ranks,
            localRank=r % 8,
            gpu=r % 8,
            backend="nccl",
            pod=f"train-{r // 8}",
            node=f"node-{r // 8}",
            source=f"rank-{r}.trace.json.gz",
            hasGpu=True,
            capturedUs=captured,
            gpuUtilizationPct=90.0,
            steps=step_rows,
            temporal=TemporalBreakdown(
                idleUs=captured * 0.05,
                computeUs=comp_sum,
                nonComputeUs=float(comm.sum()),
                idlePct=5.0,
                computePct=80.0,
                nonComputePct=15.0,
            ),
            idle=IdleBreakdown(hostWaitUs=captured * 0.01, kernelWaitUs=captured * 0.03, otherUs=captured * 0.01),
            kernelTypes=[
                KernelTypeShare(type="COMP", sumUs=comp_sum, pct=80.0),
                KernelTypeShare(type="COMM", sumUs=float(comm.sum()), pct=20.0),
            ],
            kernels=kernels,
            overlapPct=95.0,
            launch=LaunchStats(
                launches=int(counts.sum()) * steps,
                launchDelayMedianUs=12.0,
                launchDelayP95Us=40.0,
                shortKernels=10,
                shortKernelThresholdUs=10.0,
            ),
            memoryOps=[
                MemoryOpStat(
                    kind="Memcpy HtoD",
                    count=steps * 2,
                    sumUs=captured * memcpy_ratio,
                    bytes=1 << 26,
                    bandwidthGBs=10.0,
                    bottleneckRatio=memcpy_ratio,
                )
            ],
            runtime=[
                RuntimeStat(
                    name="cudaLaunchKernel",
                    count=int(counts.sum()) * steps,
                    sumUs=float(counts.sum()) * steps * 4.0,
                    bottleneckRatio=0.001,
                )
            ],
            collectives=[
                CollectiveStat(
                    kind="AllReduce",
                    count=rounds,
                    sumUs=float(comm.sum()),
                    medianUs=float(np.median(comm)),
                    bytes=1 << 30,
                    busBandwidthGBs=float(bw),
                    durationsUs=[float(d) for d in comm],
                )
            ],
            functions=functions,
        )
