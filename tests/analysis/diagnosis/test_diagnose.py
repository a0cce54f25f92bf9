"""The cross-rank diagnosis on synthetic summaries of a synchronous job (stepscope/testing/synthetic_ranks.py)."""
from __future__ import annotations

import re

import msgspec
import pytest

from stepscope.analysis.diagnosis.diagnose import MAX_FINDINGS, diagnose
from stepscope.analysis.diagnosis.outliers import peer_median
from stepscope.analysis.diagnosis.wording import short
from stepscope.analysis.model import RankSummary, encode
from stepscope.testing.synthetic_ranks import make_summaries


def _by_category(full: list[dict], category: str) -> list[dict]:
    return [f for f in full if f.category == category]


def test_healthy_run_names_no_slow_worker():
    diagnosis, full = diagnose(make_summaries(8, seed=1))
    assert diagnosis.slowWorkers == []
    assert not _by_category(full, "slow-worker")
    assert diagnosis.summary.startswith("no problem found across 8 rank(s)")
    assert all(f.severity == "info" for f in full)
    assert diagnosis.stepTimeMs.min <= diagnosis.stepTimeMs.median <= diagnosis.stepTimeMs.max
    assert diagnosis.breakdown.computePct > 0


def test_slow_kernels_name_the_rank_and_the_kernels():
    summaries = make_summaries(8, slow_rank=5, kernel_factor=1.3, seed=2)
    diagnosis, full = diagnose(summaries)
    assert [w.rank for w in diagnosis.slowWorkers] == [5]
    worker = diagnosis.slowWorkers[0]
    assert 1.2 < worker.slowdown < 1.4
    assert (worker.pod, worker.node) == ("train-0", "node-0")
    slow = _by_category(full, "slow-worker")[0]
    assert slow is full[0] and slow.severity == "critical"
    assert 1.25 < slow.data["kernelRatio"] < 1.35
    # The kernels that cost most extra time are named: the largest compute kernels, not the collective.
    named = [k["name"] for k in slow.data["slowKernels"]]
    assert named and all(n.startswith(("volta_sgemm", "void at::native")) for n in named)
    # Every rank's step is as long (they wait for rank 5): the figures are its peers' wait, not "1.3x slower".
    assert diagnosis.summary.startswith("rank 5 holds its peers back, they wait ") and "kernels run 3" in diagnosis.summary
    assert short(named[0]) in diagnosis.summary


def test_step_time_outlier_without_synchronisation():
    summaries = make_summaries(16, seed=3)
    slow = summaries[11]
    for row in slow.steps:
        row.durationUs *= 1.5
    diagnosis, full = diagnose(summaries)
    assert [w.rank for w in diagnosis.slowWorkers] == [11]
    assert diagnosis.slowWorkers[0].slowdown == pytest.approx(1.5, rel=0.05)
    assert "its step takes" in _by_category(full, "slow-worker")[0].message


def test_collective_voting_finds_the_late_rank_when_step_times_are_equal():
    # Extra host time on rank 3 only: its kernels are normal and every rank's step time is the
    # same (all wait for rank 3), so only the collectives show who is late.
    diagnosis, full = diagnose(make_summaries(8, slow_rank=3, extra_step_us=60_000, seed=4))
    assert [w.rank for w in diagnosis.slowWorkers] == [3]
    data = _by_category(full, "slow-worker")[0].data
    assert data["kernelRatio"] is None and data["stepRatio"] is None
    assert data["voteShare"] > 0.9 and data["rounds"] == 80
    assert 50_000 < data["peersWaitUsPerStep"] < 70_000


def test_two_ranks_are_enough_to_name_the_slower_one():
    diagnosis, _ = diagnose(make_summaries(2, slow_rank=1, kernel_factor=1.3, seed=5))
    assert [w.rank for w in diagnosis.slowWorkers] == [1]


def test_python_function_straggler_is_named_with_its_place():
    diagnosis, full = diagnose(make_summaries(8, python_rank=2, python_us=140_000, seed=6))
    python = _by_category(full, "python")
    assert [f.ranks for f in python] == [[2]]
    assert python[0].message.startswith("rank 2 spends 140 ms/step in augment_batch_slowly (train.py:42), 10x its peers")
    assert [w.rank for w in diagnosis.slowWorkers] == [2]
    assert "augment_batch_slowly (train.py:42)" in diagnosis.summary


def test_c_functions_are_named_without_their_repr():
    summaries = make_summaries(8, python_rank=2, python_us=140_000, seed=6)
    owner = "pybind11_builtins.pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1"
    for s in summaries:
        for f in s.functions:
            if "augment_batch_slowly" in f.name:
                # (A C function that computes: allreduce and wait are where a rank waits, never a cause.)
                f.name = f"<built-in method decode_jpeg of {owner} object at 0x7fef72c6{s.rank:04x}>"
    diagnosis, full = diagnose(summaries)
    python = _by_category(full, "python")
    assert python[0].message.startswith("rank 2 spends 140 ms/step in decode_jpeg (built-in), 10x its peers")
    assert "decode_jpeg (built-in)" in diagnosis.summary
    assert not [f.message for f in full if re.search(r"0x[0-9a-f]{4}|pybind11|<", f.message)]


def test_memory_operations_follow_the_one_percent_rule():
    _, below = diagnose(make_summaries(4, memcpy_ratio=0.009, seed=7))
    assert not _by_category(below, "memory")
    summaries = make_summaries(4, memcpy_ratio=0.009, seed=7)
    summaries[1].memoryOps[0].bottleneckRatio = 0.031
    _, above = diagnose(summaries)
    memory = _by_category(above, "memory")
    assert len(memory) == 1 and memory[0].ranks == [1]
    assert "Memcpy HtoD" in memory[0].message and "3.1%" in memory[0].message


def test_low_bandwidth_rank_is_a_communication_finding():
    _, full = diagnose(make_summaries(8, bandwidth_rank=6, seed=8))
    comm = _by_category(full, "communication")
    assert [f.ranks for f in comm] == [[6]]
    assert "0.3x the other ranks" in comm[0].message


def _stacks(rank: int, frames: list[tuple[str, str, int]]) -> dict:
    return {"version": 1, "rank": rank, "step": 41, "secondsSinceStep": 312.0,
            "threads": [{"id": 1, "name": "watchdog", "main": False, "frames": [{"file": "stepscope_agent.py", "line": 1, "function": "run"}]},
                        {"id": 2, "name": "MainThread", "main": True,
                         "frames": [{"file": f, "function": fn, "line": ln} for f, fn, ln in frames]}]}


def test_hang_odd_rank_out_is_the_culprit():
    waiting = [("train.py", "main", 100), ("train.py", "train_step", 57), ("/usr/lib/python3/site-packages/torch/distributed/c10d.py", "all_reduce", 2100)]
    stuck = [("train.py", "main", 100), ("train.py", "train_step", 50), ("data.py", "read_shard", 12)]
    stacks = {r: _stacks(r, stuck if r == 2 else waiting) for r in range(4)}
    diagnosis, full = diagnose(make_summaries(4, seed=9), stacks=stacks)
    hang = _by_category(full, "hang")
    assert hang[0] is full[0] and hang[0].ranks == [2]
    assert "read_shard (data.py:12)" in hang[0].message and "train_step (train.py:57)" in hang[0].message
    assert diagnosis.summary == hang[0].message


def test_hang_rank_without_stacks_is_named():
    waiting = [("train.py", "train_step", 57)]
    stacks = {r: _stacks(r, waiting) for r in (0, 1, 3)}
    _, full = diagnose(make_summaries(4, seed=10), stacks=stacks)
    hang = _by_category(full, "hang")
    assert [f.ranks for f in hang] == [[0, 1, 3], [2]]
    assert "3 ranks hung for 312 s, all at train_step (train.py:57)" == hang[0].message


def test_rank_errors_become_findings_and_the_rest_is_diagnosed():
    summaries = make_summaries(6, slow_rank=4, kernel_factor=1.3, seed=11)
    summaries[1] = RankSummary(version=1, rank=1, error="truncated gzip: rank-1.trace.json.gz ends after 1.2 MB")
    summaries[2] = RankSummary(version=1, rank=2, error="truncated gzip: rank-1.trace.json.gz ends after 1.2 MB")
    summaries[3].warnings.append("no ProfilerStep found: step times unknown")
    diagnosis, full = diagnose(summaries)
    trace = _by_category(full, "trace")
    assert [(f.severity, f.ranks) for f in trace] == [("critical", [1, 2]), ("info", [3])]
    assert "ranks 1-2 could not be analysed: truncated gzip" in trace[0].message
    assert [w.rank for w in diagnosis.slowWorkers] == [4]


def test_only_errors_still_gives_a_diagnosis():
    diagnosis, full = diagnose([RankSummary(version=1, rank=0, error="invalid JSON at byte 12")])
    assert diagnosis.stepTimeMs is None and diagnosis.slowWorkers == []
    assert diagnosis.summary == "rank 0 could not be analysed: invalid JSON at byte 12"
    assert diagnose([])[0].summary == "no problem found across 0 rank(s)"


def test_compact_form_stays_small_for_thousands_of_ranks():
    summaries = make_summaries(4096, steps=2, collectives_per_step=4, seed=12)
    # Many distinct problems at once: slow kernels on 40 ranks, distinct errors on 200 more.
    for r in range(0, 4000, 100):
        for k in summaries[r].kernels:
            k.meanUs *= 1.5
            k.sumUs *= 1.5
    for r in range(1, 4000, 20):
        summaries[r] = RankSummary(version=1, rank=r, error=f"trace of rank {r} is not valid JSON: " + "x" * 200)
    diagnosis, full = diagnose(summaries)
    size = len(encode(diagnosis))
    assert size < 32 * 1024, size
    assert len(diagnosis.findings) == MAX_FINDINGS < len(full)
    assert len(diagnosis.slowWorkers) <= 16
    assert {w.rank for w in diagnosis.slowWorkers} <= set(range(0, 4000, 100))
    assert msgspec.json.decode(encode(diagnosis))["summary"]


def test_peer_median_leaves_each_rank_out():
    assert peer_median([1.0, 2.0, 3.0, 10.0]).tolist() == [3.0, 3.0, 2.0, 2.0]
    assert peer_median([100.0, 130.0]).tolist() == [130.0, 100.0]


def test_cpu_only_gloo_run_weighs_collective_wait_against_python():
    summaries = make_summaries(4, python_rank=1, python_us=300_000, seed=13)
    for s in summaries:
        s.hasGpu, s.backend, s.kernels, s.kernelTypes, s.launch, s.memoryOps, s.runtime = False, "gloo", [], [], None, [], []
    diagnosis, full = diagnose(summaries)
    assert [w.rank for w in diagnosis.slowWorkers] == [1]
    assert "augment_batch_slowly (train.py:42)" in diagnosis.summary
    comm = [f for f in full if f.category == "communication"]
    assert len(comm) == 1 and "in gloo collectives (AllReduce)" in comm[0].message and "least: rank 1" in comm[0].message
    assert not [f for f in full if f.message.startswith("the Python hot spot is ")]
    for s in summaries:
        s.functions = [f for f in s.functions if "augment_batch_slowly" not in f.name]
        s.collectives = []
    _, healthy = diagnose(summaries)
    hot = [f for f in healthy if f.message.startswith("the Python hot spot is ")]
    assert len(hot) == 1 and hot[0].severity == "info" and hot[0].ranks == [0, 1, 2, 3]


def test_kernel_names_are_shortened_to_the_name_itself():
    assert short("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)") == \
        "native::vectorized_elementwise_kernel<native::FillFunctor>"
    assert short("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == "ncclKernel_AllReduce_RING_LL_Sum_float"
    assert short("volta_sgemm_128x32_nt") == "volta_sgemm_128x32_nt"


def test_generic_kernel_names_keep_what_they_run_never_a_bare_namespace():
    """Kernels of real traces whose name alone is a wrapper (cutlass::device_kernel, Kernel2) or
    starts in an anonymous namespace: the short form names the kernel they instantiate."""
    assert short("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
                 "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)") == "at::native::cunn_SoftMaxForward<float>"
    flash = "void cutlass::device_kernel<flash::FlashAttnBwd<flash::CollectiveMainloopBwd<2, cute::tuple<cute::C<64>>>>>(flash::Params)"
    assert short(flash, 90) == "cutlass::device_kernel<flash::FlashAttnBwd>"
    gemm = "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>(dpsk::grouped_gemm::Params)"
    assert short(gemm, 50) == "cutlass::device_kernel<GemmKernel>"
    assert short(gemm, 90) == "cutlass::device_kernel<fp8_dptp128c_acc::GemmKernel>"
    cutlass2 = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(cutlass_80_wmma::Params)"
    assert short(cutlass2, 90) == "cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
    assert short("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)") == \
        "multimem_all_reduce_kernel<c10::BFloat16>"
    assert short("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*)") == "dpsk::ep::cuda::get_dispatch_layout"


def test_hang_with_two_ranks_the_one_outside_the_collective_is_the_culprit():
    waiting = [("train.py", "train_step", 57), ("/opt/torch/distributed/distributed_c10d.py", "all_reduce", 2100)]
    stuck = [("train.py", "train_step", 50), ("data.py", "read_shard", 12)]
    for culprit in (0, 1):
        stacks = {r: _stacks(r, stuck if r == culprit else waiting) for r in range(2)}
        _, full = diagnose(make_summaries(2, seed=14), stacks=stacks)
        assert full[0].category == "hang" and full[0].ranks == [culprit]
        assert "stuck at read_shard (data.py:12) while 1 other rank(s) wait at all_reduce in train_step (train.py:57)" in full[0].message


def test_one_kernel_slower_on_one_rank_is_a_kernel_finding():
    summaries = make_summaries(8, seed=15)
    # A kernel with about 3 % of the compute time: twice as long is +3 %, under the 5 % that
    # makes the whole rank slow, but still over 1 % of a step.
    compute = sum(k.sumUs for k in summaries[4].kernels if k.type == "COMP")
    kernel = min((k for k in summaries[4].kernels if k.type == "COMP"), key=lambda k: abs(k.sumUs / compute - 0.03))
    kernel.meanUs *= 2.0
    kernel.sumUs *= 2.0
    diagnosis, full = diagnose(summaries)
    assert diagnosis.slowWorkers == []
    found = [f for f in full if f.category == "kernel" and f.severity == "warning"]
    assert [(f.ranks, f.data["kernel"]) for f in found] == [([4], kernel.name)]
    assert "runs 1.99x longer on rank 4 than on the other ranks (+24.9 ms/step)" in found[0].message
