"""The metric building blocks against brute force, and each metric on small traces with known answers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.diagnosis.diagnose import diagnose
from stepscope.analysis.loading.trace import load_trace
from stepscope.analysis.model import decode_summary, encode
from stepscope.analysis.statistics import intervals
from stepscope.analysis.statistics.collectives import parse_nccl_name
from stepscope.analysis.statistics.gpu_scope import COMM, COMP, MEM, OTHER, kernel_type
from stepscope.analysis.statistics.memory_ops import memory_kind
from stepscope.analysis.statistics.summary import summarize


def grid(starts, ends, lo=0, hi=400) -> np.ndarray:
    """Microsecond occupancy of a set of integer intervals."""
    t = np.arange(lo, hi)
    return ((t[:, None] >= starts[None, :]) & (t[:, None] < ends[None, :])).any(axis=1)


@pytest.mark.parametrize("seed", range(20))
def test_unions_intersections_and_coverage_match_brute_force(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    s = rng.integers(0, 300, n).astype(float)
    e = s + rng.integers(0, 60, n)
    ms, me = intervals.merge(s, e)
    assert np.all(me[:-1] < ms[1:]) or len(ms) == 1
    assert intervals.length(ms, me) == grid(s, e).sum()
    s2 = rng.integers(0, 300, n).astype(float)
    e2 = s2 + rng.integers(1, 60, n)
    other = intervals.merge(s2, e2)
    assert intervals.intersection((ms, me), other) == (grid(s, e) & grid(s2, e2)).sum()
    qs = rng.integers(0, 350, 30).astype(float)
    qe = qs + rng.integers(0, 80, 30)
    expected = [grid(s, e)[int(a):int(b)].sum() for a, b in zip(qs, qe)]
    assert intervals.covered((ms, me), qs, qe).tolist() == expected


def test_group_stats_match_numpy():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 7, 500)
    values = rng.exponential(10, 500)
    st = intervals.group_stats(keys, values)
    for i, k in enumerate(st["key"]):
        v = values[keys == k]
        assert st["count"][i] == len(v)
        assert st["sum"][i] == pytest.approx(v.sum())
        assert st["median"][i] == pytest.approx(np.median(v))
        assert st["std"][i] == pytest.approx(v.std(ddof=1))
        assert (st["min"][i], st["max"][i]) == (v.min(), v.max())


@pytest.mark.parametrize("name, expected", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", COMM),
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", COMM),
    ("Memcpy DtoD (Device -> Device)", MEM),
    ("Memset (Device)", MEM),
    ("volta_sgemm_128x64_nn", COMP),
    ("Event Sync", OTHER),
    ("void at::native::vectorized_elementwise_kernel<4, Memcpy>", OTHER),
])
def test_kernel_types_follow_hta(name: str, expected: int):
    assert kernel_type(name) == expected


@pytest.mark.parametrize("name, expected", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", ("AllReduce", "RING", "LL")),
    ("ncclDevKernel_AllGather_RING_LL128(ncclDevComm*)", ("AllGather", "RING", "LL128")),
    ("ncclDevKernel_ReduceScatter_Sum_f32_COLLNET_DIRECT_SIMPLE(x)", ("ReduceScatter", "COLLNET_DIRECT", "SIMPLE")),
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", ("SendRecv", "", "")),
    ("ncclKernel_Broadcast_TREE_SIMPLE_Sum_int8_t", ("Broadcast", "TREE", "SIMPLE")),
])
def test_nccl_kernel_names(name: str, expected: tuple[str, str, str]):
    assert parse_nccl_name(name) == expected


def test_memory_kinds():
    assert memory_kind("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD"
    assert memory_kind("Memset (Device)") == "Memset"
    assert memory_kind("CopyDeviceToHost") == "Memcpy DtoH"


def ev(cat: str, name: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def gpu(name: str, ts: float, dur: float, corr: int, stream: int = 7, **args) -> dict:
    return ev("kernel", name, ts, dur, tid=stream, pid=0, stream=stream, correlation=corr, **args)


@pytest.fixture
def two_step_trace(tmp_path: Path) -> Path:
    """Two steps of 100 µs; step 1 computes 10-50 and communicates 40-70 (10 µs overlapped);
    step 2 computes 110-130, copies 130-140 and communicates 150-160 alone."""
    allreduce = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
    events = [
        ev("user_annotation", "ProfilerStep#1", 0, 100), ev("user_annotation", "ProfilerStep#2", 100, 100),
        ev("cuda_runtime", "cudaLaunchKernel", 5, 2, correlation=1),
        ev("record_param_comms", "record_param_comms", 6, 3, **{"Collective name": "allreduce", "In msg nelems": 1000,
           "Out msg nelems": 1000, "dtype": "Float", "Group size": 4, "External id": 77}),
        ev("cuda_runtime", "cudaLaunchKernel", 6, 2, correlation=2, **{"External id": 77}),
        ev("cuda_runtime", "cudaLaunchKernel", 105, 2, correlation=3),
        ev("cuda_runtime", "cudaMemcpyAsync", 106, 2, correlation=4),
        ev("cuda_runtime", "cudaLaunchKernel", 107, 2, correlation=5),
        ev("cuda_runtime", "cudaStreamSynchronize", 150, 30),
        gpu("volta_sgemm_128x64_nn", 10, 40, 1),
        gpu(allreduce, 40, 30, 2, stream=13, **{"External id": 77}),
        gpu("volta_sgemm_128x64_nn", 110, 20, 3),
        ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 130, 10, pid=0, tid=7, stream=7, correlation=4,
           bytes=1_000_000),
        gpu(allreduce, 150, 10, 5, stream=13),
    ]
    path = tmp_path / "rank-1.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 1, "world_size": 4, "backend": "nccl"},
                                "traceEvents": events}))
    return path


def test_step_tables(two_step_trace: Path):
    s = summarize(load_trace(two_step_trace))
    first, second = s.steps
    assert (first.step, first.startUs, first.durationUs) == (1, 0, 100)
    assert (first.computingUs, first.communicationUs, first.overlappedUs, first.commNotOverlappedUs) == (40, 30, 10, 20)
    assert first.freeUs == 100 - 40 - 20
    assert (first.idleUs, first.computeUs, first.nonComputeUs) == (0, 40, 20)  # span 10-70
    assert (second.computingUs, second.communicationUs, second.overlappedUs) == (20, 10, 0)
    assert second.idleUs == 10 and second.nonComputeUs == 20  # span 110-160: memcpy and allreduce
    assert second.freeUs == 100 - 20 - 10


def test_gpu_metrics_on_a_known_trace(two_step_trace: Path):
    s = summarize(load_trace(two_step_trace))
    assert (s.rank, s.worldSize, s.hasGpu, s.capturedUs) == (1, 4, True, 200)
    assert s.gpuUtilizationPct == pytest.approx(100 * (60 + 30 + 10) / 200)
    # HTA's scope drops the last step: only step 1's kernels (10-70) remain.
    assert s.temporal.spanUs == 60 and s.temporal.computeUs == 40 and s.temporal.idleUs == 0
    assert s.overlapPct == pytest.approx(100 * 10 / 30, abs=0.01)
    allreduce = s.collectives[0]
    assert (allreduce.kind, allreduce.algorithm, allreduce.protocol, allreduce.count) == ("AllReduce", "RING", "LL", 2)
    assert allreduce.durationsUs == [30, 10]
    assert allreduce.bytes == 4000  # only the first carries sizes (1000 floats)
    assert allreduce.busBandwidthGBs == pytest.approx(4000 * 2 * 3 / 4 / 30 / 1e3)
    # Not hidden by compute: 20 µs of the first, all 10 of the second.
    assert allreduce.bottleneckRatio == pytest.approx(30 / 200)
    memcpy = s.memoryOps[0]
    assert (memcpy.kind, memcpy.count, memcpy.bytes) == ("Memcpy HtoD", 1, 1_000_000)
    assert memcpy.bandwidthGBs == pytest.approx(1_000_000 / 10 / 1e3)
    sync = next(r for r in s.runtime if r.name == "cudaStreamSynchronize")
    assert sync.notOverlappedUs == 30 and sync.bottleneckRatio == pytest.approx(30 / 200)
    sgemm = next(k for k in s.kernels if k.name == "volta_sgemm_128x64_nn")
    assert (sgemm.count, sgemm.sumUs, sgemm.medianUs, sgemm.type) == (1, 40, 40, "COMP")


def test_python_functions_by_stack(tmp_path: Path):
    """main > step > augment (60 µs, of which a 10 µs callee), main > step > load (20 µs); GPU busy 30-40."""
    py = "python_function"
    events = [
        ev(py, "train.py(1): main", 0, 100, **{"Python id": 1, "Python parent id": 0}),
        ev(py, "train.py(5): step", 0, 90, **{"Python id": 2, "Python parent id": 1}),
        ev(py, "train.py(9): augment_batch_slowly", 0, 60, **{"Python id": 3, "Python parent id": 2}),
        ev(py, "<built-in method sleep>", 20, 10, **{"Python id": 4, "Python parent id": 3}),
        ev(py, "train.py(12): load", 60, 20, **{"Python id": 5, "Python parent id": 2}),
        ev(py, "train.py(5): step", 100, 10, **{"Python id": 6, "Python parent id": 0}),
        gpu("volta_sgemm_128x64_nn", 30, 10, 1),
    ]
    path = tmp_path / "py.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = summarize(load_trace(path))
    by_stack = {f.stack: f for f in s.functions}
    aug = by_stack["train.py(1): main > train.py(5): step > train.py(9): augment_batch_slowly"]
    assert (aug.name, aug.count, aug.exclusiveUs) == ("train.py(9): augment_batch_slowly", 1, 50)
    assert aug.notOverlappedUs == 40  # 30-40 runs on the GPU meanwhile
    assert aug.bottleneckRatio == pytest.approx(40 / s.capturedUs)
    assert by_stack["train.py(1): main > train.py(5): step"].exclusiveUs == 10
    assert by_stack["train.py(5): step"].exclusiveUs == 10  # same function, other stack: its own row
    assert s.functions[0].name == "train.py(9): augment_batch_slowly"


def test_rccl_generic_kernels_take_their_kind_from_the_recorded_arguments(tmp_path: Path):
    generic = "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)"
    args = {"Collective name": "allreduce", "In msg nelems": 256, "Out msg nelems": 256, "dtype": "BFloat16",
            "Group size": 8}
    events = [gpu(generic, 0, 10, 1, **args), gpu(generic, 20, 10, 2), gpu(generic, 40, 10, 3, **args)]
    path = tmp_path / "rccl.json"
    path.write_text(json.dumps({"traceEvents": events}))
    kinds = {c.kind: c for c in summarize(load_trace(path)).collectives}
    assert kinds["AllReduce"].count == 2 and kinds["AllReduce"].bytes == 2 * 256 * 2
    assert kinds["Generic"].count == 1 and kinds["Generic"].bytes == 0


def test_cpu_collectives_pair_with_recorded_arguments_in_order(tmp_path: Path):
    """gloo runs the collective on its own thread; sizes come from record_param_comms, in issue order."""
    def recorded(ts: float, nelems: int) -> dict:
        return ev("cpu_op", "record_param_comms", ts, 5, **{"Collective name": "allreduce", "In msg nelems": nelems,
                                                             "Out msg nelems": nelems, "dtype": "Float", "Group size": 2})
    events = [recorded(0, 100), ev("user_annotation", "gloo:all_reduce", 10, 50, tid=9),
              recorded(100, 300), ev("user_annotation", "gloo:all_reduce", 110, 30, tid=9)]
    path = tmp_path / "gloo.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 2, "backend": "gloo"}, "traceEvents": events}))
    (allreduce,) = summarize(load_trace(path)).collectives
    assert (allreduce.kind, allreduce.count, allreduce.durationsUs, allreduce.bytes) == ("AllReduce", 2, [50, 30], 1600)
    assert allreduce.busBandwidthGBs == pytest.approx(1600 * 2 * 1 / 2 / 80 / 1e3)


def test_overlapping_gloo_calls_count_once_in_the_share_of_the_step(tmp_path: Path):
    """gloo runs several all-reduce buckets at once on its threads: rank 0 (waiting for rank 1)
    has 390 µs of calls in two 100 µs steps, covering 85 µs of step 1 and 90 µs of step 2."""
    def gloo(ts: float, dur: float, tid: int) -> dict:
        return ev("user_annotation", "gloo:all_reduce", ts, dur, tid=tid)
    steps = [ev("user_annotation", "ProfilerStep#1", 0, 100), ev("user_annotation", "ProfilerStep#2", 100, 100)]
    calls = {0: [gloo(10, 80, 9), gloo(20, 75, 10), gloo(110, 80, 9), gloo(120, 75, 10), gloo(180, 80, 11)],
             1: [gloo(85, 10, 9), gloo(88, 8, 10), gloo(185, 10, 9), gloo(188, 8, 10)]}
    summaries = []
    for rank, events in calls.items():
        path = tmp_path / f"rank-{rank}.json"
        path.write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"},
                                    "traceEvents": steps + events}))
        summaries.append(summarize(load_trace(path)))
    assert [[s.collectiveUs for s in r.steps] for r in summaries] == [[85, 90], [11, 11]]
    assert [r.collectives[0].sumUs for r in summaries] == [390, 36]  # per kind: each call counts

    def share(summaries: list) -> tuple[str, dict]:
        (comm,) = [f for f in diagnose(summaries)[1] if f.category == "communication"]
        return comm.message, comm.data.get("collectiveShare")

    assert share(summaries) == ("ranks spend 49% of each step in gloo collectives (AllReduce) (least: rank 1 11%, most: rank 0 88%): "
                                "most of it is waiting for the slowest rank", {"0": 0.875, "1": 0.11})
    # Summaries written before StepRow.collectiveUs: the per-kind sum, capped at the step time.
    older = []
    for s in summaries:
        raw = json.loads(encode(s))
        for row in raw["steps"]:
            del row["collectiveUs"]
        older.append(decode_summary(json.dumps(raw).encode()))
    assert all(row.collectiveUs is None for s in older for row in s.steps)
    assert share(older)[1] == {"0": 1.0, "1": 0.18}


@pytest.mark.parametrize("seed", range(25))
def test_random_traces_summarise_without_surprises(tmp_path: Path, seed: int):
    """Odd but valid traces (zero and sub-µs durations, unmatched correlations, steps or none,
    kernels without launches, nested Python calls) give a summary whose numbers hold together."""
    rng = np.random.default_rng(seed)
    names = {"kernel": ["volta_sgemm_128x64_nn", "ncclKernel_AllReduce_RING_LL_Sum_float(x)", "Memset (Device)"],
             "gpu_memcpy": ["Memcpy HtoD (Pageable -> Device)"], "cuda_runtime": ["cudaLaunchKernel", "cudaMemcpyAsync"],
             "cpu_op": ["aten::mm", "ProfilerStep#%d"], "python_function": ["a.py(1): f", "a.py(2): g"]}
    events = []
    for i in range(int(rng.integers(1, 200))):
        cat = str(rng.choice(list(names)))
        name = str(rng.choice(names[cat]))
        if "%d" in name:
            name %= int(rng.integers(1, 4))
        ts = float(rng.integers(0, 10_000)) + (float(rng.random()) if seed % 2 else 0.0)
        dur = float(rng.choice([0.0, 0.4, float(rng.integers(1, 500))]))
        args = {"correlation": int(rng.integers(0, 30))}
        if cat in ("kernel", "gpu_memcpy"):
            args["stream"] = int(rng.choice([7, 13]))
        if cat == "python_function":
            args = {"Python id": i, "Python parent id": int(rng.integers(0, i + 1))}
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 1, "ts": ts, "dur": dur, "args": args})
    path = tmp_path / "random.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = summarize(load_trace(path))
    assert s.capturedUs >= 0 and 0 <= s.gpuUtilizationPct <= 100
    if s.temporal:
        t = s.temporal
        assert min(t.idleUs, t.computeUs, t.nonComputeUs) >= 0
        assert t.idleUs + t.computeUs + t.nonComputeUs == pytest.approx(t.spanUs)
    for step in s.steps:
        assert 0 <= step.overlappedUs <= min(step.computingUs, step.communicationUs) + 1e-9
        assert step.freeUs >= 0 and step.idleUs >= 0
    assert all(0 <= f.notOverlappedUs <= f.exclusiveUs + 1e-9 for f in s.functions)
    assert all(k.minUs <= k.medianUs <= k.maxUs for k in s.kernels)
    if s.overlapPct is not None:
        assert 0 <= s.overlapPct <= 100
