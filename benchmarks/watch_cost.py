"""What the always-on step telemetry costs a training step (issue 15, goal <= 5 us a step): in a
fresh interpreter started the zero-code way, once the agent has mapped its ring file, rounds of
the same optimizer-step loop with the telemetry on and off (its ring's record replaced by a no-op
method, so the difference is the two struct writes into the mapped file), back to back in random
order so both halves of a pair see the same machine load; the agent's boundary alone the same
way; the record call alone; and the loop without the agent's hook as the reference. Medians over
rounds and interpreters, with the least-disturbed round (the minimum) in brackets. Then the wait
share's part: one read of DDP's timing of its all-reduce (a DistributedDataParallel model over a
one-rank gloo group), which a step boundary makes every 2 s, and the test every boundary makes.

    .venv/bin/python benchmarks/watch_cost.py [--steps 2000] [--rounds 40] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

from agent_overhead import env_without_agent, timed

from stepscope.launch import free_port
from stepscope.sidecar.bootstrap import install_bootstrap, training_env


class _Off:
    """The telemetry switched off: the same call, no write."""

    def record(self, step: int, end: float, duration: float) -> None:
        pass


def child(steps: int, rounds: int) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    torch.set_num_threads(1)
    param = torch.zeros(16, requires_grad=True)
    param.grad = torch.ones(16)
    optimizer = torch.optim.SGD([param], lr=0.0)
    agent = sys.modules["stepscope_agent"]._AGENT
    deadline = time.monotonic() + 30
    while agent.ring.path is None:  # the watchdog maps the ring file at its first beat after a step
        optimizer.step()
        time.sleep(0.01)
        if time.monotonic() > deadline:
            raise SystemExit("the agent never mapped its ring file")
    ring, off = agent.ring, _Off()
    timed(optimizer.step, 1000)
    results: dict[str, list[float]] = {k: [] for k in ("step_on", "step_off", "boundary_on", "boundary_off", "no_hook", "record")}
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        halves = [True, False]
        shuffle(halves)
        for telemetry_on in halves:
            agent.ring = ring if telemetry_on else off
            results["step_on" if telemetry_on else "step_off"].append(timed(optimizer.step, steps))
            results["boundary_on" if telemetry_on else "boundary_off"].append(timed(agent.boundary, steps))
        agent.ring = ring
        agent._hook_handle.remove()
        results["no_hook"].append(timed(optimizer.step, steps))
        agent._hook_handle = register_optimizer_step_post_hook(agent._on_optimizer_step)
        now = time.monotonic()
        results["record"].append(timed(lambda: ring.record(agent.step_count, now, 0.01), steps))
    median = statistics.median
    out = {k: {"median": median(v), "min": min(v)} for k, v in results.items()}
    out["step_diff"] = median(a - b for a, b in zip(results["step_on"], results["step_off"]))
    out["boundary_diff"] = median(a - b for a, b in zip(results["boundary_on"], results["boundary_off"]))
    out["steps_in_ring"] = agent.step_count
    out.update(wait_share_cost(agent))
    print(json.dumps(out))


def wait_share_cost(agent: Any) -> dict[str, float]:
    """Microseconds of one read of DDP's all-reduce timing (median of 200) and of the interval test
    every step boundary makes (what the boundary adds while no read is due)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", rank=0, world_size=1)
    model = DistributedDataParallel(torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(8))))
    for _ in range(3):  # DDP times the first iterations; its figures land in the next forward
        model(torch.randn(4, 64)).sum().backward()
    assert model in agent._ddp_models and agent._read_collective_wait(), "the agent does not see DDP's timing"
    reads = [timed(agent._read_collective_wait, 1) for _ in range(200)]
    test = timeit.timeit("now - agent._wait_read_mono >= COLLECTIVE_WAIT_READ_SECONDS",
                         globals={"now": time.monotonic(), "agent": agent, "COLLECTIVE_WAIT_READ_SECONDS": 2.0}, number=100_000)
    dist.destroy_process_group()
    return {"ddp_read": statistics.median(reads), "interval_test": test / 100_000 * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps, args.rounds)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="stepscope-watch-") as tmp:
        directory = Path(tmp)
        install_bootstrap(directory)
        env = {**env_without_agent(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        env.update(training_env(directory, env))
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, __file__, "--child", "--steps", str(args.steps), "--rounds", str(args.rounds)],
                                 env=env, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    median = statistics.median

    def figure(key: str) -> str:
        return f"{median(r[key]['median'] for r in rows):6.2f} us [{min(r[key]['min'] for r in rows):.2f}]"

    print(f"step telemetry, {args.steps} steps x {args.rounds} rounds x {args.repeats} interpreters "
          f"(median, least-disturbed round in brackets):")
    print(f"  optimizer step, agent without its hook (reference) {figure('no_hook')}")
    print(f"  optimizer step, agent, telemetry off               {figure('step_off')}")
    print(f"  optimizer step, agent, telemetry on                {figure('step_on')}   "
          f"telemetry +{median(r['step_diff'] for r in rows):.2f} us a step (paired rounds)")
    print(f"  agent boundary alone, telemetry off                {figure('boundary_off')}")
    print(f"  agent boundary alone, telemetry on                 {figure('boundary_on')}   "
          f"telemetry +{median(r['boundary_diff'] for r in rows):.2f} us a step (paired rounds)")
    print(f"  ring record alone (two struct writes into the mapped file) {figure('record')}")
    read = median(r["ddp_read"] for r in rows)
    print(f"wait share: one read of DDP's all-reduce timing {read:.1f} us, every 2 s ({read / 2:.1f} us a second, "
          f"{read / 2 * 0.001:.3f} us a 1-ms step); the interval test every boundary makes "
          f"{median(r['interval_test'] for r in rows):.3f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
