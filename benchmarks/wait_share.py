"""The wait-share signal on the fault-injection scenarios: each scenario's gloo job runs
with a real sidecar, and every 2 s its GET /v1/telemetry gives each rank's wait share (the share of
its step in DDP's gradient all-reduce). Prints, per scenario, the gap between the least-waiting
rank and its peers' median (detection's reading WaitShareGap), its largest and median over the
run, and which rank is least waiting; a healthy job's largest gap bounds the threshold from below,
a fault's median gap from above.

    .venv/bin/python benchmarks/wait_share.py [--seconds 20] [--ranks 4] [SCENARIO ...]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stepscope.detection import Conditions, observe
from stepscope.local.demo import LocalRun
from stepscope.local.scenarios import SCENARIOS
from stepscope.sidecar_client import SidecarClient


def gaps(seconds: float, ranks: int, name: str) -> list[tuple[float, int]]:
    scenario = SCENARIOS[name]
    found = []
    with tempfile.TemporaryDirectory() as out, LocalRun(Path(out), ranks, scenario.workload_args(ranks)) as local:
        local.start(stepping=20)
        client = SidecarClient(local.url, local.key.encode())
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(2.0)
            shares = {r: s.wait_share for r, s in observe(time.time(), [client.get_telemetry()]).ranks.items() if s.wait_share is not None}
            if len(shares) >= 2:
                by_rank = {r: statistics.median(o for q, o in shares.items() if q != r) - share for r, share in shares.items()}
                least = max(by_rank, key=lambda r: by_rank[r])
                found.append((by_rank[least], least))
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("scenarios", nargs="*", default=["healthy", "blocking-io", "slow-function", "slow-compute", "modest"])
    args = p.parse_args()
    print(f"threshold (Conditions.wait_share_gap): {Conditions().wait_share_gap:.2f}")
    for name in args.scenarios:
        found = gaps(args.seconds, args.ranks, name)
        if not found:
            print(f"{name:<14} no wait share read")
            continue
        values = [g for g, _ in found]
        culprit = statistics.mode(r for _, r in found)
        print(f"{name:<14} polls {len(found):3d}  gap max {max(values):.2f}  median {statistics.median(values):.2f}  "
              f"least-waiting rank {culprit} (slow rank {SCENARIOS[name].slow_rank(args.ranks)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
