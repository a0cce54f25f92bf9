"""A bf16 GEMM of known shape, timed with CUDA events and by the profiler, against the kernel
efficiency the analysis reports for the same trace (statistics/efficiency.py): its FLOPs come from
the recorded shapes, its time from the kernels, its peak from the device table.

    python benchmarks/gpu_gemm.py [--m 8192 --n 8192 --k 8192] [--iters 20] [--out DIR]

Prints, per shape, the TFLOP/s of the CUDA events (2*M*N*K per product over the mean time), the
TFLOP/s and % of peak the analysis gives the op and its kernel, and the device's peak from the
table; writes the profiler's trace to DIR. Exits 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stepscope.analysis import summarize


def run(m: int, n: int, k: int, iters: int, out: Path) -> dict:
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    end.synchronize()
    events_ms = start.elapsed_time(end) / iters
    flops = 2.0 * m * n * k
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as profiler:
        for _ in range(iters):
            a @ b
            profiler.step()
        torch.cuda.synchronize()
    trace = out / f"gemm-{m}x{n}x{k}.pt.trace.json"
    profiler.export_chrome_trace(str(trace))
    summary = summarize(trace)
    ops = [e for e in summary.opEfficiency if e.family == "gemm"]
    kernels = [e for e in summary.kernelEfficiency if e.family == "gemm"]
    return {
        "shape": f"{m}x{n}x{k}",
        "device": torch.cuda.get_device_name(),
        "eventsMs": round(events_ms, 4),
        "eventsTflops": round(flops / events_ms / 1e9, 1),
        "op": [
            {"name": e.name, "count": e.count, "tflops": round(e.tflops, 1), "pctOfPeak": e.pctOfPeak} for e in ops[:2]
        ],
        "kernel": [
            {"name": e.name[:90], "count": e.count, "tflops": round(e.tflops, 1), "pctOfPeak": e.pctOfPeak}
            for e in kernels[:2]
        ],
        "peakTflops": ops[0].peakTflops if ops else None,
        "trace": str(trace),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_gemm: torch sees no CUDA device here", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="stepscope-gemm-"))
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(args.m, args.n, args.k, args.iters, out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
