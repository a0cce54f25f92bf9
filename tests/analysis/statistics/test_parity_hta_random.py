"""stepscope against HTA 0.5.0 itself on random traces (ties, zero and sub-µs kernels, shared
correlations, launches missing, steps or none), beyond the fixed reference sets.

Needs HTA's own virtual environment (benchmarks/analysis_vs_hta.py creates it under
~/.cache/stepscope/hta-venv) and ../shared/tools/run_hta.py; skipped without them.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.loading.trace import load_trace
from stepscope.analysis.statistics.gpu_scope import HTA_COMM_KERNELS, gpu_scope
from stepscope.analysis.statistics.kernels import kernel_stats
from stepscope.analysis.statistics.summary import summarize
from tests.analysis.statistics import test_parity_hta as parity
from tests.conftest import SHARED

HTA_PYTHON = Path.home() / ".cache" / "stepscope" / "hta-venv" / "bin" / "python"
RUN_HTA = SHARED / "tools" / "run_hta.py"
NAMES = ["volta_sgemm_128x64_nn", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "Memset (Device)",
         "Memcpy HtoD (Pageable -> Device)", "void at::native::elementwise_kernel<4>", "ncclDevKernel_SendRecv(x)",
         "Event Sync"]
CATS = {"Memset": "gpu_memset", "Memcpy": "gpu_memcpy", "Event S": "cuda_sync"}
CALLS = {"gpu_memset": "cudaMemsetAsync", "gpu_memcpy": "cudaMemcpyAsync", "cuda_sync": "cudaStreamWaitEvent"}


def random_trace(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    fractional = seed % 2 == 1
    t, corr = 1_000_000.0, 1
    first = {"ph": "X", "cat": "cpu_op", "name": "aten::first", "pid": 1, "tid": 1, "ts": t - 50, "dur": 10}
    events = []
    for step in range(1, int(rng.integers(2, 6))):
        step_us = float(rng.integers(2000, 5000))
        if seed % 4:
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                           "ts": t, "dur": step_us})
            if rng.random() < 0.5:
                events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{step}", "pid": 0,
                               "tid": 7, "ts": t + 100, "dur": step_us, "args": {"External id": step}})
        free = {7: t + float(rng.integers(0, 300)), 13: t, 20: t}
        for _ in range(int(rng.integers(5, 80))):
            launch = t + float(rng.integers(0, int(step_us))) + (float(rng.random()) if fractional else 0.0)
            name = str(rng.choice(NAMES))
            stream = 13 if name.startswith("nccl") else int(rng.choice([7, 7, 13, 20]))
            cat = next((c for prefix, c in CATS.items() if name.startswith(prefix)), "kernel")
            if rng.random() < 0.9:  # some kernels lose their launch
                call = CALLS.get(cat) or str(rng.choice(["cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel"]))
                events.append({"ph": "X", "cat": "cuda_driver" if call == "cuLaunchKernel" else "cuda_runtime",
                               "name": call, "pid": 1, "tid": 1, "ts": launch,
                               "dur": float(rng.choice([1, 3, 60, 120])), "args": {"correlation": corr}})
            start = max(free[stream] + float(rng.choice([0, 1, 2, 10, 40, 200])), launch + float(rng.integers(0, 50)))
            dur = float(rng.choice([0.3, 1, 2, 50, 300])) + float(rng.random()) if fractional else \
                float(rng.choice([0, 1, 2, 5, 50, 300]))
            args = {"stream": -1 if cat == "cuda_sync" and rng.random() < 0.5 else stream, "correlation": corr}
            events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
                           "args": args})
            free[stream] = start + dur
            corr += int(rng.random() > 0.05)  # now and then two launches share a correlation
        t += step_us
    rng.shuffle(events)
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"},
            "traceEvents": [first] + events}


# Seeds 4, 13 and 16 tie kernels at the same µs on a stream (HTA's sort order decides the gaps);
# 51 has sub-µs kernels rounded to end before they start, which HTA merges as they are; in 139
# all communication is such kernels.
@pytest.mark.parametrize("seed", [*range(8), 13, 16, 51, 139])
def test_random_trace_against_hta(tmp_path: Path, seed: int):
    if not HTA_PYTHON.exists() or not RUN_HTA.exists():
        pytest.skip(f"HTA's virtual environment ({HTA_PYTHON}) or {RUN_HTA} is missing")
    traces, ref = tmp_path / "traces", tmp_path / "hta"
    traces.mkdir()
    (traces / "rank0.json").write_text(json.dumps(random_trace(seed)))
    subprocess.run([str(HTA_PYTHON), str(RUN_HTA), str(traces), "--mode", "full", "--save", str(ref)],
                   check=True, capture_output=True, timeout=240)
    run = json.loads((ref / "_run.json").read_text())
    assert run["errors"] == {}
    trace = load_trace(traces / "rank0.json")
    summary = summarize(trace, rank=0, comm=HTA_COMM_KERNELS)
    case = (ref, run, {0: summary}, {0: kernel_stats(trace, gpu_scope(trace, HTA_COMM_KERNELS), summary.capturedUs, top=10**6)})
    for check in (parity.test_temporal_breakdown, parity.test_idle_time_breakdown, parity.test_kernel_type_breakdown,
                  parity.test_top_kernels, parity.test_comm_comp_overlap, parity.test_launch_statistics):
        check(case)
