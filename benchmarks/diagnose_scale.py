"""How long the cross-rank diagnosis takes for a large job, reading included.

Builds N synthetic rank summaries of a synchronous job (stepscope/testing/synthetic_ranks.py: by
default 300 kernels and 205 Python functions per rank, 80 collectives with per-call durations;
rank 5's kernels 1.3x longer) and writes each as the sidecar uploads it (Arrow IPC,
ranks/rank-<r>.summary.arrow) into a session folder. A fresh process then reads them into one
table (gathering.session_files.read_ranks, as the analysis Job does) and diagnoses it; its peak
memory (VmHWM: ru_maxrss of a process started by a larger one counts the parent's memory, kept
across exec) is that of reading and diagnosing alone. References measured in the same run: the goals (5 s and
1.5 GB at 10,240 ranks, 0.5 s at 1,024) and decoding the same summaries from JSON, as older sidecars uploaded them.

    .venv/bin/python benchmarks/diagnose_scale.py [--ranks 1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the synthetic ranks live in tests/

GOAL_S = {1024: 0.5, 10240: 5.0}
GOAL_PEAK_MB = 1500


def _own_peak_mb() -> float:
    """This process' peak resident memory (VmHWM, of its own address space since exec)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def _child(folder: Path, repeat: int) -> int:
    """Read and diagnose the session in `folder`: prints the times and the peak memory."""
    from stepscope.analysis.diagnosis.diagnose import diagnose
    from stepscope.analysis.gathering.session_files import find_files, read_ranks
    from stepscope.analysis.loading.allocation import reuse_freed_memory
    from stepscope.analysis.loading.parallel import worker_pool
    from stepscope.storage import open_store

    reuse_freed_memory()  # as the analysis does (analyze_uri)
    best = (float("inf"), float("inf"), float("inf"))
    diagnosis = None
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        with worker_pool(1) as here:
            table = read_ranks(find_files(open_store(str(folder))), pool=here).table
        read = time.perf_counter() - start
        diagnosis, _ = diagnose(table)
        total = time.perf_counter() - start
        del table
        best = min(best, (total, read, time.process_time() - cpu))
    assert diagnosis is not None
    peak_mb = _own_peak_mb()
    print(
        f"{best[0]:.3f} {best[1]:.3f} {peak_mb:.0f} {','.join(str(w.rank) for w in diagnosis.slowWorkers)} "
        f"{best[2]:.3f}"
    )
    print(diagnosis.summary)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kernels", type=int, default=300, help="distinct kernels per rank")
    parser.add_argument("--functions", type=int, default=200, help="distinct Python functions per rank")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.child, args.repeat)

    from stepscope.analysis.model import decode_summary, encode, encode_summary
    from stepscope.contracts import layout
    from stepscope.testing.synthetic_ranks import make_summaries

    start = time.perf_counter()
    summaries = make_summaries(
        args.ranks, slow_rank=5, kernel_factor=1.3, seed=7, kernels=args.kernels, functions=args.functions
    )
    built = time.perf_counter() - start
    rows = sum(
        len(s.kernels) + len(s.functions) + len(s.steps) + sum(len(c.durationsUs) for c in s.collectives)
        for s in summaries
    )
    start = time.perf_counter()
    arrow = [encode_summary(s) for s in summaries]
    encoded = time.perf_counter() - start
    json_blobs = [encode(s) for s in summaries]
    del summaries
    start = time.perf_counter()
    for b in json_blobs:
        decode_summary(b)
    json_decode = time.perf_counter() - start
    json_kib = statistics.mean(len(b) for b in json_blobs) / 1024
    del json_blobs
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp:
        (Path(tmp) / "ranks").mkdir()
        for rank, b in enumerate(arrow):
            (Path(tmp) / layout.rank_summary(rank)).write_bytes(b)
        arrow_kib = statistics.mean(len(b) for b in arrow) / 1024
        del arrow
        out = subprocess.run(
            [sys.executable, __file__, "--child", tmp, "--repeat", str(args.repeat)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    total, read, peak, slow, cpu = out[0].split()
    total_s, read_s = float(total), float(read)
    print(
        f"ranks: {args.ranks:,}  ({rows:,} kernel/function/step/collective rows; built in {built:.1f} s, encoded as "
        f"Arrow in {encoded:.1f} s "
        f"at the edge; {arrow_kib:.1f} KiB per Arrow summary, {json_kib:.1f} KiB as JSON)"
    )
    print(
        f"read + diagnose:      {total_s:8.3f} s   (best of {args.repeat}; {float(cpu):.3f} s of CPU; reading the "
        "Arrow summaries into one table "
        f"{read_s:.3f} s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )
    print(f"peak memory:          {float(peak):8.0f} MB  (VmHWM of the reading and diagnosing process)")
    print(
        f"reference, JSON decode alone: {json_decode:8.3f} s   -> read + diagnose / JSON decode = "
        f"{total_s / json_decode:.2f}x"
    )
    goal = GOAL_S.get(args.ranks, GOAL_S[10240] * args.ranks / 10240)
    print(
        f"goal: {goal:.3f} s, {GOAL_PEAK_MB} MB   -> time / goal = {total_s / goal:.2f}x, peak / goal = "
        f"{float(peak) / GOAL_PEAK_MB:.2f}x"
    )
    print(f"slow workers: [{slow}]; summary: {out[1]}")
    return 0 if slow == "5" else 1


if __name__ == "__main__":
    sys.exit(main())
