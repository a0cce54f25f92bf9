"""Every shared trace set (../shared/data/traces) gives findings without contradictions, with
one-time setup calls told as setup, and warnings only for what costs the step something."""
from __future__ import annotations

import pytest

from stepscope.analysis.diagnosis.consistency import CONTRADICTIONS
from stepscope.analysis.diagnosis.diagnose import diagnose
from stepscope.analysis.gathering.session_files import find_files, open_session, read_ranks
from tests.conftest import TRACES as SHARED

SETS = sorted(p.name for p in SHARED.iterdir()) if SHARED.is_dir() else []
pytestmark = pytest.mark.skipif(not SETS, reason=f"no shared trace sets at {SHARED} (set STEPSCOPE_SHARED to the shared folder)")


def _findings(name: str) -> list[dict]:
    store, only = open_session(str(SHARED / name))
    read = read_ranks(find_files(store, only))
    return diagnose(read.summaries, stacks=read.stacks)[1]


@pytest.mark.parametrize("name", SETS)
def test_no_two_findings_contradict_each_other(name: str):
    found = _findings(name)
    for a, b in CONTRADICTIONS:
        ranks_a = {r for f in found if f.data.get("claim") == a for r in f.ranks}
        ranks_b = {r for f in found if f.data.get("claim") == b for r in f.ranks}
        assert not ranks_a & ranks_b, [f.message for f in found if f.data.get("claim") in (a, b)]
    # The same check on the words, for findings that carry no claim.
    text = " | ".join(f.message for f in found)
    assert not ("launch overhead dominates" in text and "launch overhead is not the limit" in text), text
    assert not ("CPU-only trace" in text and "runtime calls cuda" in text), text


def test_one_time_setup_is_no_bottleneck():
    found = _findings("hta__critical_path_alexnet")
    setup = [f for f in found if "cudaDeviceGetStreamPriorityRange" in f.message]
    assert setup and all(f.severity == "info" and f.message.startswith("one-time setup") for f in setup)


def test_cpu_only_label_and_gpu_runtime_calls_are_reconciled():
    found = _findings("hta__cupti_profiler")
    trace = [f.message for f in found if f.category == "trace"]
    assert any("no GPU kernels were recorded although the CUDA/HIP runtime was called" in m for m in trace), trace
    assert not [f for f in found if "runtime calls" in f.message]


def test_findings_below_a_twentieth_of_the_step_are_information():
    found = _findings("kineto__resnet50_num_workers_0_run1")
    runtime = [f for f in found if f.message.startswith("runtime calls")]
    assert runtime and all(f.severity == "info" for f in runtime if f.score < 0.05)
    assert not any("launch overhead dominates" in f.message for f in found)


def test_kernel_skew_the_collectives_absorb_is_no_slow_worker():
    """2 ranks sampled from a 128-rank job: rank 1's kernels run longer, its step does not (619 ms
    against 615 ms). No "1.21x slower": a kernel finding with the step times beside it."""
    store, only = open_session(str(SHARED / "hta__trace_filter_2rank"))
    read = read_ranks(find_files(store, only))
    diagnosis, found = diagnose(read.summaries)
    assert diagnosis.slowWorkers == []
    skew = [f for f in found if f.category == "kernel" and f.ranks == [1] and "kernels run" in f.message]
    assert skew and "its step takes 619 ms vs 615 ms" in skew[0].message
