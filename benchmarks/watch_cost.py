"""What the always-on step telemetry costs a training step (issue 15, goal <= 5 us a step): in a
fresh interpreter started the zero-code way, once the agent has mapped its ring file, rounds of
the same optimizer-step loop with the telemetry on and off (its ring's record replaced by a no-op
method, so the difference is the two struct writes into the mapped file), back to back in random
order so both halves of a pair see the same machine load; the agent's boundary alone the same
way; the record call alone; and the loop without the agent's hook as the reference. Medians over
rounds and interpreters, with the least-disturbed round (the minimum) in brackets.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.agent_overhead

from benchmarks.agent_overhead import env_without_agent, timed
from stepscope.sidecar.bootstrap import install_bootstrap, training_env


class _Off:
    """The telemetry switched off: the same call, no write."""

    def record(self, step: int, end: float, duration: float) -> None:
        pass


def _record_call(ring: Any, agent: Any, now: float) -> Callable[[], None]:
    """What the agent's step hook calls when the telemetry is on."""
    return lambda: ring.record(agent.step_count, now, 0.01)


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
        results["record"].append(timed(_record_call(ring, agent, now), steps))
    median = statistics.median
    out: dict[str, Any] = {k: {"median": median(v), "min": min(v)} for k, v in results.items()}
    out["step_diff"] = median(a - b for a, b in zip(results["step_on"], results["step_off"]))
    out["boundary_diff"] = median(a - b for a, b in zip(results["boundary_on"], results["boundary_off"]))
    out["steps_in_ring"] = agent.step_count
    print(json.dumps(out))


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
        env = {**env_without_agent(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
