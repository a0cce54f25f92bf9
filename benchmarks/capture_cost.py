"""What a capture costs the training it observes: 2 real torch ranks (DDP over gloo) run a
CPU-heavy Python step (a busy loop calling a small helper ~100k times, then forward, backward and
an all-reduce), once without a capture (reference) and once per capture setting, with the agent
loaded the zero-code way and request.json written as the sidecar writes it. Printed per setting
and rank: the longest step during the capture and in the 10 steps right after it (next to the
reference's longest), the process RSS before / peak during / after the capture, the trace size,
events per step and the final state with its message.

    .venv/bin/python benchmarks/capture_cost.py [--calls 100000] [--cases steps=2,steps=20,duration=2,steps=8:noshapes]

A rank writes one line per step ("step <index> <end time> <seconds>") to its log; the parent
samples each rank's VmRSS every 50 ms. Step indices are zero-based, as the agent counts them.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from stepscope import AGENT_MODULE
from stepscope.contracts.session import SessionSpec
from stepscope.local.launch import free_port
from stepscope.sidecar import shared_dir
from stepscope.sidecar.bootstrap import install_bootstrap, training_env

WORLD = 2
AFTER_STEPS = 10  # steps watched once every rank's capture ended
WARMUP_STEPS = 5


def helper(i: int) -> float:
    return time.time() + i


def rank_main(calls: int) -> None:
    """One rank: steps until killed; prints each step's end and duration."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    while True:
        started = time.perf_counter()
        acc = 0.0
        for i in range(calls):
            acc += helper(i)
        batch = torch.randn(32, 64) + acc * 0
        loss = loss_fn(model(batch), torch.randint(0, 10, (32,)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        dist.all_reduce(value)
        print(f"step {step} {time.time():.4f} {time.perf_counter() - started:.4f}", flush=True)
        step += 1


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Run:
    """WORLD ranks of the workload with the agent bootstrap, their logs and RSS samples."""

    def __init__(self, directory: Path, calls: int, agent: Path | None) -> None:
        self.directory = directory
        folder = install_bootstrap(directory)
        if agent is not None:  # another version's agent: its package folder, or an older single-file module
            shutil.rmtree(folder / AGENT_MODULE)
            if agent.is_dir():
                shutil.copytree(agent, folder / AGENT_MODULE)
            else:
                (folder / f"{AGENT_MODULE}.py").write_bytes(agent.read_bytes())
        env = dict(os.environ)
        env.update(training_env(directory, env))
        env.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
                "WORLD_SIZE": str(WORLD),
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.logs = [directory / f"rank-{r}.log" for r in range(WORLD)]
        self.procs = []
        for rank in range(WORLD):
            with open(self.logs[rank], "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "--rank-worker", "--calls", str(calls)],
                        env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        self.rss: list[list[tuple[float, float]]] = [[] for _ in range(WORLD)]
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            now = time.time()
            for rank, p in enumerate(self.procs):
                self.rss[rank].append((now, rss_mb(p.pid)))

    def steps(self, rank: int) -> list[tuple[int, float, float]]:
        """(index, end time, seconds) of every step the rank finished."""
        out = []
        for line in self.logs[rank].read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == "step":
                out.append((int(parts[1]), float(parts[2]), float(parts[3])))
        return out

    def wait_steps(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(len(self.steps(r)) < count for r in range(WORLD)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(
                    f"ranks did not reach {count} steps:\n" + "\n".join(log.read_text()[-2000:] for log in self.logs)
                )
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def count_events(path: Path) -> int:
    """Kineto events in a gzipped trace, counted by their "ph" field without parsing the file."""
    count, tail = 0, b""
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            data = tail + chunk
            count += data.count(b'"ph":')
            tail = data[-4:]
    return count


def states(directory: Path, session: str) -> dict[int, dict[str, Any]]:
    return shared_dir.rank_states(directory, session)


FINAL = ("done", "failed", "cancelled", "refused", "hung")


def measure(case: str, calls: int, timeout: float, agent: Path | None) -> list[dict[str, Any]]:
    """One run: warm up, trigger `case` ("none", "steps=N" or "duration=S", with ":shapes" or
    ":noshapes" to set capture.recordShapes, else its default), wait for every rank's
    final state, watch AFTER_STEPS more steps."""
    with tempfile.TemporaryDirectory(prefix="stepscope-cost-") as tmp:
        directory = Path(tmp)
        run = Run(directory, calls, agent)
        try:
            run.wait_steps(WARMUP_STEPS, 120)
            triggered = time.time()
            session = "cost"
            if case != "none":
                window, _, shapes = case.partition(":")
                kind, value = window.split("=")
                capture: dict[str, Any] = (
                    {"steps": int(value)} if kind == "steps" else {"durationSeconds": float(value)}
                )
                if shapes:
                    capture["recordShapes"] = shapes == "shapes"
                spec = SessionSpec.from_dict(
                    {"capture": {"waitSteps": 1, **capture}, "storage": {"uri": "file:///unused"}}
                )
                shared_dir.write_request(directory, session, "capture", spec)
                deadline = time.monotonic() + timeout
                while not (
                    len(s := states(directory, session)) == WORLD and all(v.get("state") in FINAL for v in s.values())
                ):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            else:
                run.wait_steps(WARMUP_STEPS + 12, 300)
            ended = time.time()
            final = states(directory, session)
            done_steps = max(len(run.steps(r)) for r in range(WORLD))
            try:
                run.wait_steps(done_steps + AFTER_STEPS, 300)
                time.sleep(1.0)
            except RuntimeError:
                pass
            results = []
            for rank in range(WORLD):
                steps = run.steps(rank)
                during = [sec for _, end, sec in steps if end > triggered and end - sec <= ended]
                after = [sec for _, end, sec in steps if end - sec > ended][:AFTER_STEPS]
                rss = run.rss[rank]
                before = [mb for t, mb in rss if t <= triggered][-1:] or [0.0]
                peak = max((mb for t, mb in rss if triggered <= t <= ended + 1), default=0.0)
                last = rss[-1][1] if rss else 0.0
                state = final.get(rank, {})
                trace = directory / session / str(state.get("trace") or "-")
                size = trace.stat().st_size if trace.is_file() else 0
                events = count_events(trace) if size else 0
                captured = max(1, int(state.get("capturedSteps") or 0))
                results.append(
                    {
                        "case": case,
                        "rank": rank,
                        "state": state.get("state", "-" if case == "none" else "no state"),
                        "message": state.get("message", ""),
                        "max_step_during_s": max(during, default=0.0),
                        "max_step_after_s": max(after, default=0.0),
                        "rss_before_mb": before[0],
                        "rss_peak_mb": peak,
                        "rss_after_mb": last,
                        "trace_mb": size / 1e6,
                        "events_per_step": events / captured if events else 0,
                        "capture_s": ended - triggered,
                    }
                )
            return results
        finally:
            run.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=100_000, help="helper calls per step (CPU-heavy Python)")
    p.add_argument("--cases", default="steps=2,steps=20,duration=2", help="comma-separated: steps=N or duration=S")
    p.add_argument("--timeout", type=float, default=400, help="seconds to wait for a capture to end")
    p.add_argument(
        "--agent",
        type=Path,
        help="agent package folder or file to install instead of this checkout's (to compare versions)",
    )
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_worker:
        rank_main(args.calls)
        return
    rows = measure("none", args.calls, args.timeout, args.agent)
    ref_step = max(r["max_step_during_s"] for r in rows)
    print(f"reference (no capture): longest step {ref_step:.3f} s, RSS {max(r['rss_peak_mb'] for r in rows):.0f} MB")
    header = (
        f"{'case':<12}{'rank':>4} {'state':<9}{'max step during':>16}{'after':>8}{'x ref':>7}"
        f"{'RSS before':>11}{'peak':>7}{'after':>7}{'trace MB':>9}{'events/step':>12}"
    )
    print(header)
    for case in args.cases.split(","):
        for r in measure(case, args.calls, args.timeout, args.agent):
            worst = max(r["max_step_during_s"], r["max_step_after_s"])
            print(
                f"{r['case']:<12}{r['rank']:>4} "
                f"{r['state']:<9}{r['max_step_during_s']:>16.3f}{r['max_step_after_s']:>8.3f}"
                f"{worst / ref_step:>7.1f}{r['rss_before_mb']:>11.0f}{r['rss_peak_mb']:>7.0f}{r['rss_after_mb']:>7.0f}"
                f"{r['trace_mb']:>9.2f}{r['events_per_step']:>12.0f}"
            )
            print(f"    capture took {r['capture_s']:.1f} s; message: {r['message']}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
