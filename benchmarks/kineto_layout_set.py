"""An 8-rank set in Kineto's own layout from the scaled set (make_scaled_trace.py), for
analysis_vs_hta.py: files named as torch.profiler's tensorboard_trace_handler(use_gzip=True) names
them (<host>_<pid>.<ns>.pt.trace.json.gz, the rank only in distributedInfo), gzip, and `ts`
relative to a per-rank baseTimeNanoseconds as Kineto >= 2.0 writes them (rank r's base is r ms +
17 us earlier than a common origin, so the absolute times stay those of the scaled set and the
merged trace has to move every rank's timestamps).

  .venv/bin/python benchmarks/kineto_layout_set.py /tmp/scaled_8rank /tmp/kineto_gz_8rank
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from isal import igzip

from stepscope.analysis.reporting.merged_trace import shift_ts

ORIGIN_US = 1669783600000000  # the scaled set's ts all start with these digits
LEADING = b'"ts": 16697836'


def convert(source: Path, target: Path, rank: int) -> None:
    offset = 1000 * rank + 17
    with source.open("rb") as f, igzip.open(target, "wb", compresslevel=3) as out:
        rest = b""
        while True:
            block = f.read(16 << 20)
            data = rest + block
            if not block:
                end = data.rstrip().rfind(b"}")
                data = data[:end] + b', "baseTimeNanoseconds": %d}\n' % ((ORIGIN_US - offset) * 1000)
                out.write(shift_ts(data.replace(LEADING, b'"ts":'), offset))
                return
            cut = data.rfind(b"},")  # an event boundary: no "ts" value is split
            out.write(shift_ts(data[:cut].replace(LEADING, b'"ts":'), offset))
            rest = data[cut:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="folder of rank<r>.pt.trace.json (make_scaled_trace.py --out)")
    ap.add_argument("target", type=Path)
    a = ap.parse_args()
    a.target.mkdir(parents=True, exist_ok=True)
    ranks = sorted(int(p.name[4:].split(".")[0]) for p in a.source.glob("rank*.pt.trace.json"))
    for rank in ranks:
        target = a.target / f"node{rank // 4}_{4000 + rank}.{1764000000000000000 + rank * 1000}.pt.trace.json.gz"
        convert(a.source / f"rank{rank}.pt.trace.json", target, rank)
        print(target, os.path.getsize(target), flush=True)


if __name__ == "__main__":
    main()
