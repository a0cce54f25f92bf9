"""Communication kernels recognised by what they do (DeepEP, NVSHMEM, RCCL, all-to-alls, the user's
own patterns), counted in the breakdown, the overlap and the communication table; HTA's nccl-only
definition still gives HTA's numbers.

The real DeepSeek-V3 training trace (deepseek-ai/profile-data, train.json: one H800 rank of EP64)
is read from $STEPSCOPE_EXTDATA/deepseek-profile-data (default: ../extdata next to the checkout)
and the test skips without it; it is never copied into the repository.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from stepscope.analysis.loading.trace import load_trace
from stepscope.analysis.pipeline import EXIT_OK, EXIT_USAGE
from stepscope.analysis.statistics.gpu_scope import COMM, COMP, HTA_COMM_KERNELS, CommKernels, kernel_type
from stepscope.analysis.statistics.summary import summarize
from stepscope.cli import main
from tests.analysis.statistics.test_statistics import ev, gpu
from tests.conftest import REPO

EXTDATA = Path(os.environ.get("STEPSCOPE_EXTDATA", REPO.parent / "extdata"))
DEEPSEEK_TRAIN = EXTDATA / "deepseek-profile-data" / "train.json"

DISPATCH = "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*)"
COMBINE = "void deep_ep::internode::combine<__nv_bfloat16, 8, 2>(int4*, float*, bool const*, int4 const*)"
GEMM = "void cutlass::device_kernel<flash::FlashAttnFwd<x>>(flash::Params)"


@pytest.mark.parametrize("name, library", [
    (DISPATCH, "DeepEP"),
    ("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int)", "DeepEP"),
    ("void deep_ep::internode_ll::combine<8, 7168>(void*, int*)", "DeepEP"),
    ("nvshmemi_transfer_rma_nbi_kernel(void*)", "NVSHMEM"),
    ("void nvshmemi_barrier_all_on_stream_kernel()", "NVSHMEM"),
    ("rcclKernel_AllToAllPivot(ncclDevComm*)", "RCCL"),
    ("void fused_moe_all_to_all_kernel<float>(float*)", "all-to-all"),
    ("void moe_a2a_combine(float*)", "all-to-all"),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)", "collective"),
    ("void vllm::cross_device_reduce_1stage<half, 8>(vllm::RankData*)", "collective"),
    ("void mscclpp::allreduce6<float>(float*)", "MSCCL"),
])
def test_communication_kernels_outside_nccl_are_recognised(name: str, library: str):
    assert CommKernels().library(name) == library
    assert kernel_type(name) == COMM
    assert kernel_type(name, HTA_COMM_KERNELS) == COMP  # HTA's definition: an nccl prefix only


@pytest.mark.parametrize("name", [
    GEMM, "volta_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*)",  # computes the routing, moves nothing
])
def test_compute_kernels_stay_compute(name: str):
    assert kernel_type(name) == COMP


def test_user_patterns_extend_the_list():
    comm = CommKernels().with_user(["^my_exchange", "halo_swap"])
    assert comm.library("my_exchange_tokens(float*)") == "user"
    assert comm.library("void halo_swap<4>(float*)") == "user"
    assert kernel_type("my_exchange_tokens(float*)", comm) == COMM
    assert kernel_type("my_exchange_tokens(float*)") == COMP
    assert HTA_COMM_KERNELS.with_user(["halo"]).library(DISPATCH) is None
    with pytest.raises(Exception, match="missing"):
        CommKernels().with_user(["("])


def _ep_trace(path: Path, exchange: str = DISPATCH) -> Path:
    """One step of 300 µs: a GEMM 0-100 on stream 7, a dispatch 50-150 on stream 20 (50 µs of it
    under the GEMM), a combine 200-240 alone."""
    events = [ev("user_annotation", "ProfilerStep#1", 0, 300),
              *(ev("cuda_runtime", "cudaLaunchKernel", t, 1, correlation=c) for t, c in ((0, 1), (1, 2), (2, 3))),
              gpu(GEMM, 0, 100, 1), gpu(exchange, 50, 100, 2, stream=20), gpu(COMBINE, 200, 40, 3, stream=20)]
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 64, "backend": "nccl"}, "traceEvents": events}))
    return path


def test_expert_parallel_time_is_communication_in_breakdown_overlap_and_table(tmp_path: Path):
    trace = load_trace(_ep_trace(tmp_path / "rank-0.json"))
    s = summarize(trace)
    assert s.overlapPct == pytest.approx(100 * 50 / 140, abs=0.01)
    (step,) = s.steps
    assert (step.computingUs, step.communicationUs, step.overlappedUs, step.commNotOverlappedUs) == (100, 140, 50, 90)
    assert step.freeUs == 300 - 100 - 90
    kinds = {(c.kind, c.algorithm): c for c in s.collectives}
    assert set(kinds) == {("Dispatch", "DeepEP"), ("Combine", "DeepEP")}
    assert kinds["Dispatch", "DeepEP"].sumUs == 100 and kinds["Combine", "DeepEP"].sumUs == 40
    assert kinds["Dispatch", "DeepEP"].bottleneckRatio == pytest.approx(50 / 300)
    assert {k.type for k in s.kernels if "deep_ep" in k.name} == {"COMM"}
    assert {t.type for t in s.kernelTypes} == {"COMP", "COMP+COMM", "COMM"}
    hta = summarize(trace, comm=HTA_COMM_KERNELS)
    assert hta.overlapPct is None and hta.collectives == [] and hta.steps[0].communicationUs == 0
    assert s.temporal.computePct == round(100 * 100 / 240, 2)  # the GEMM alone, over 0-240
    assert hta.temporal.computePct == round(100 * 190 / 240, 2)  # the exchanges taken for compute too


def test_cli_takes_user_patterns_and_refuses_bad_ones(tmp_path: Path, capsys: pytest.CaptureFixture):
    trace = _ep_trace(tmp_path / "rank-0.json", exchange="void halo_swap<4>(float*)")
    out = tmp_path / "out"
    assert main(["analyze", str(trace), "--output", str(out), "--no-progress", "--comm-kernel", "halo_swap"]) == EXIT_OK
    with open(out / "communication.csv", newline="") as f:
        table = {(r["Collective"], r["Algorithm"]): float(r["Total Time(us)"]) for r in csv.DictReader(f)}
    assert table == {("Other", "user"): 100.0, ("Combine", "DeepEP"): 40.0}
    assert main(["analyze", str(trace), "--output", str(tmp_path / "hta"), "--no-progress", "--hta-comm-kernels"]) == EXIT_OK
    with open(tmp_path / "hta" / "communication.csv", newline="") as f:
        assert list(csv.DictReader(f)) == []
    assert main(["analyze", str(trace), "--no-progress", "--comm-kernel", "("]) == EXIT_USAGE
    assert "--comm-kernel: not a regular expression" in capsys.readouterr().err


@pytest.fixture(scope="module")
def deepseek_train():
    if not DEEPSEEK_TRAIN.is_file():
        pytest.skip(f"DeepSeek-V3 training trace not found at {DEEPSEEK_TRAIN} (deepseek-ai/profile-data train.json; set STEPSCOPE_EXTDATA)")
    return load_trace(DEEPSEEK_TRAIN)


def test_deepseek_v3_expert_parallel_communication_is_counted(deepseek_train):
    """DeepEP's dispatch, combine and notify kernels are most of this rank's communication: about
    47 % of its kernel time, nearly all of it overlapped with the GEMMs of the other micro-batch
    (DualPipe)."""
    s = summarize(deepseek_train, top=10_000)
    total = sum(k.sumUs for k in s.kernels)
    comm = sum(k.sumUs for k in s.kernels if k.type == "COMM")
    assert 0.40 < comm / total < 0.55
    kinds = {c.kind: c for c in s.collectives}
    assert set(kinds) == {"Dispatch", "Combine", "Notify"} and {c.algorithm for c in s.collectives} == {"DeepEP"}
    assert sum(c.sumUs for c in s.collectives) == pytest.approx(comm)
    assert s.overlapPct is not None and s.overlapPct > 90
    (step,) = s.steps
    assert 0.5 * comm < step.communicationUs <= comm  # the union of the kernels' intervals
    assert step.overlappedUs > 0.9 * step.communicationUs
    # HTA's definition gives HTA 0.5.0's own numbers for this trace (run_hta.py --mode full on it):
    # idle 497 µs, compute 128,500 µs, non-compute 15 µs, no overlap, all kernel time COMPUTATION.
    hta = summarize(deepseek_train, comm=HTA_COMM_KERNELS)
    assert (hta.temporal.idleUs, hta.temporal.computeUs, hta.temporal.nonComputeUs, hta.temporal.computePct) == (497, 128500, 15, 99.6)
    assert {t.type: t.sumUs for t in hta.kernelTypes} == {"COMP": 128487, "MEM": 15, "COMP+MEM": 13}
    assert hta.overlapPct is None and hta.collectives == []
    # By default the DeepEP kernels leave compute: what none of the GEMMs hides becomes non-compute
    # time, beside HTA's 15 µs of copies.
    assert s.temporal.computeUs < hta.temporal.computeUs and {t.type for t in s.kernelTypes} >= {"COMP+COMM", "COMM"}
    assert s.temporal.nonComputeUs == step.commNotOverlappedUs + hta.temporal.nonComputeUs


def test_a_sessions_own_patterns_reach_the_summaries_and_the_report(tmp_path: Path):
    """spec.analysis.commKernelPatterns, as the sidecar (summaries) and the analysis Job (raw
    traces) pass them through the facade: the job's own kernel counts as communication."""
    from stepscope import analysis
    from stepscope.contracts.session import SessionSpec

    spec = SessionSpec.from_dict({"storage": {"uri": tmp_path.as_uri()}, "analysis": {"commKernelPatterns": ["halo_swap"]}})
    trace = _ep_trace(tmp_path / "rank-0.json", exchange="void halo_swap<4>(float*)")
    mine = analysis.summarize(trace, comm_kernel_patterns=spec.analysis.commKernelPatterns)
    plain = analysis.summarize(trace)
    assert (mine.steps[0].communicationUs, plain.steps[0].communicationUs) == (140, 40)
    analysis.report(str(trace), output=str(tmp_path / "out"), progress=False, comm_kernel_patterns=spec.analysis.commKernelPatterns)
    with open(tmp_path / "out" / "communication.csv", newline="") as f:
        assert {(r["Collective"], r["Algorithm"]) for r in csv.DictReader(f)} == {("Other", "user"), ("Combine", "DeepEP")}
