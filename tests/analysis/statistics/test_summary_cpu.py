"""Summaries of real CPU-only traces: two gloo ranks profiled with torch.profiler, rank 1 slowed
inside a Python function (stepscope.local.workload.augment_batch_slowly). DDP splits the gradients into
two buckets, which gloo all-reduces at once on its two threads, as it does on real models."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.diagnosis.diagnose import diagnose
from stepscope.analysis.model import decode_summary, encode
from stepscope.analysis.statistics.summary import summarize_file

SLOW_MS = 60
STEPS = 5
SCRIPT = r"""
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import profile, ProfilerActivity, schedule
from stepscope.local.workload import augment_batch_slowly, build_model
rank, out, slow_ms = int(os.environ["RANK"]), sys.argv[1], float(sys.argv[2])
torch.set_num_threads(1)
dist.init_process_group("gloo")
model = DistributedDataParallel(build_model(64), bucket_cap_mb=0.016)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with profile(activities=[ProfilerActivity.CPU], with_stack=True,
             schedule=schedule(wait=1, warmup=1, active=int(sys.argv[3]))) as prof:
    for _ in range(2 + int(sys.argv[3])):
        batch = torch.randn(32, 64)
        if rank == 1:
            batch = augment_batch_slowly(batch, slow_ms)
        model(batch).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
prof.export_chrome_trace(os.path.join(out, f"rank-{rank}.pt.trace.json" + (".gz" if rank else "")))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def gloo_traces(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(out), str(SLOW_MS), str(STEPS)],
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                   "RANK": str(r), "WORLD_SIZE": "2"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    for p in procs:
        output = p.communicate(timeout=240)[0]
        assert p.returncode == 0, output.decode()[-2000:]
    return out


def test_slow_rank_exposes_the_python_function(gloo_traces: Path):
    fast = summarize_file(gloo_traces / "rank-0.pt.trace.json")
    slow = summarize_file(gloo_traces / "rank-1.pt.trace.json.gz")
    for s, rank in ((fast, 0), (slow, 1)):
        assert (s.error, s.rank, s.worldSize, s.backend, s.hasGpu) == ("", rank, 2, "gloo", False)
        assert [x.durationUs > 0 for x in s.steps] == [True] * STEPS
        assert s.temporal is None and s.kernels == [] and s.launch is None
    augment = [f for f in slow.functions if f.name.endswith("augment_batch_slowly")]
    assert augment, [f.name for f in slow.functions]
    assert augment[0].count == STEPS
    assert augment[0].exclusiveUs >= 0.8 * STEPS * SLOW_MS * 1000
    assert augment[0].notOverlappedUs == augment[0].exclusiveUs  # no GPU to hide anything
    assert "augment_batch_slowly" in augment[0].stack and " > " in augment[0].stack
    assert not any(f.name.endswith("augment_batch_slowly") for f in fast.functions)


def test_the_fast_rank_waits_in_the_collectives(gloo_traces: Path):
    fast = summarize_file(gloo_traces / "rank-0.pt.trace.json")
    slow = summarize_file(gloo_traces / "rank-1.pt.trace.json.gz")
    fast_ar = next(c for c in fast.collectives if c.kind == "AllReduce")
    slow_ar = next(c for c in slow.collectives if c.kind == "AllReduce")
    assert fast_ar.count == slow_ar.count == len(fast_ar.durationsUs) == 2 * STEPS
    # DDP's gradient all-reduce: rank 0 arrives first and waits for the slowed rank 1. The i-th
    # call is the same bucket of the same step on both ranks; a step in which the scheduler holds
    # rank 0 back moves that step's wait to rank 1, so the typical call is compared, not the sums.
    waited_longer = np.subtract(fast_ar.durationsUs, slow_ar.durationsUs)
    assert np.median(waited_longer) > 0.5 * SLOW_MS * 1000, waited_longer


def test_calls_running_at_once_count_once_in_the_share_of_the_step(gloo_traces: Path):
    fast = summarize_file(gloo_traces / "rank-0.pt.trace.json")
    slow = summarize_file(gloo_traces / "rank-1.pt.trace.json.gz")
    step_us = sum(s.durationUs for s in fast.steps)
    # Both buckets wait for rank 1 at once: their summed time outlasts rank 0's steps.
    assert sum(c.sumUs for c in fast.collectives) > step_us
    assert all(0 < s.collectiveUs <= s.durationUs for s in fast.steps + slow.steps)
    (comm,) = [f for f in diagnose([fast, slow])[1] if f.category == "communication"]
    share = comm.data["collectiveShare"]["0"]
    assert share == pytest.approx(sum(s.collectiveUs for s in fast.steps) / step_us, abs=1e-4)
    assert 0.5 < share <= 1.0


def test_summary_round_trips_and_stays_compact(gloo_traces: Path):
    s = summarize_file(gloo_traces / "rank-1.pt.trace.json.gz", pod="trainer-1", node="node-a")
    data = encode(s)
    assert decode_summary(data) == s
    assert len(data) < 200_000 and len(s.functions) <= 50
