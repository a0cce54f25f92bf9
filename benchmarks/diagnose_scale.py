"""How long the cross-rank diagnosis takes for a large job.

Builds N synthetic rank summaries of a synchronous job (stepscope/testing/synthetic_ranks.py: by
default 300 kernels and 205 Python functions per rank, 80 collectives with per-call durations;
rank 5's kernels 1.3x longer),
then times `diagnose` against two references measured in the same run: the 5 s goal for 1,024
ranks, and decoding the same summaries from JSON (work the analysis Job has to do anyway).

    .venv/bin/python benchmarks/diagnose_scale.py [--ranks 1024] [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the synthetic ranks live in tests/


from stepscope.analysis.diagnosis.diagnose import diagnose
from stepscope.analysis.model import decode_summary, encode
from stepscope.testing.synthetic_ranks import make_summaries

GOAL_S = 5.0


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kernels", type=int, default=300, help="distinct kernels per rank")
    parser.add_argument("--functions", type=int, default=200, help="distinct Python functions per rank")
    args = parser.parse_args()
    start = time.perf_counter()
    summaries = make_summaries(args.ranks, slow_rank=5, kernel_factor=1.3, seed=7, kernels=args.kernels, functions=args.functions)
    built = time.perf_counter() - start
    blobs = [encode(s) for s in summaries]
    decode_s = _best(lambda: [decode_summary(b) for b in blobs], args.repeat)
    result: list = []
    diagnose_s = _best(lambda: result.append(diagnose(summaries)), args.repeat)
    diagnosis, full = result[-1]
    items = sum(len(s.kernels) + len(s.functions) + len(s.steps) + sum(len(c.durationsUs) for c in s.collectives) for s in summaries)
    print(f"ranks: {args.ranks}  (built in {built:.1f} s; {items:,} kernel/function/step/collective rows; "
          f"{statistics.mean(len(b) for b in blobs) / 1024:.1f} KiB per summary)")
    print(f"diagnose:            {diagnose_s:8.3f} s   (best of {args.repeat})")
    print(f"decode summaries:    {decode_s:8.3f} s   -> diagnose / decode = {diagnose_s / decode_s:.2f}x")
    print(f"goal for 1,024 ranks: {GOAL_S:7.3f} s   -> diagnose / goal   = {diagnose_s / GOAL_S:.2f}x")
    print(f"compact diagnosis: {len(encode(diagnosis)):,} bytes, {len(diagnosis.findings)} findings of {len(full)}; slow workers: "
          f"{[w.rank for w in diagnosis.slowWorkers]}")
    print(f"summary: {diagnosis.summary}")
    return 0 if [w.rank for w in diagnosis.slowWorkers] == [5] else 1


if __name__ == "__main__":
    sys.exit(main())
