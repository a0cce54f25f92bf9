"""What the idle agent costs a training step: the same optimizer-step loop timed in fresh
interpreters without the bootstrap (reference) and with it (agent idle: request.json absent, and
present but unchanged), alternating, median of several rounds. Also what the bootstrap adds to
the start of every Python process in the pod (`python -c pass`, which never imports torch).

    .venv/bin/python benchmarks/agent_overhead.py [--steps 20000] [--rounds 5] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stepscope.sidecar.bootstrap import install_bootstrap, training_env

CONFIGS = ("no agent", "agent, no request.json", "agent, request.json unchanged")


def child(steps: int, rounds: int) -> None:
    """Time `steps` optimizer steps of a one-parameter SGD `rounds` times; print the medians (us)."""
    import torch

    torch.set_num_threads(1)
    param = torch.zeros(16, requires_grad=True)
    param.grad = torch.ones(16)
    optimizer = torch.optim.SGD([param], lr=0.0)
    for _ in range(1000):
        optimizer.step()
    per_step = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.step()
        per_step.append((time.perf_counter() - start) / steps * 1e6)
    agent = sys.modules.get("stepscope_agent")
    boundary = None
    if agent is not None and agent._AGENT is not None:
        # The agent's own work per step, without torch's hook dispatch around it.
        hook_path = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(steps):
                agent._AGENT.boundary()
            hook_path.append((time.perf_counter() - start) / steps * 1e6)
        boundary = statistics.median(hook_path)
    print(json.dumps({"step_us": statistics.median(per_step), "boundary_us": boundary}))


def env_without_agent() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STEPSCOPE_DIR")}


def run_child(config: str, directory: Path, steps: int, rounds: int) -> dict:
    env = {**env_without_agent(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    if config != "no agent":
        env.update(training_env(directory, env))
    request = directory / "request.json"
    request.unlink(missing_ok=True)
    if config == "agent, request.json unchanged":
        # A finished session's request stays in place; the agent stats it every step, never rereads it.
        request.write_text(json.dumps({"version": 1, "session": "finished", "action": "capture", "capture": {"steps": 1}}))
        (directory / "finished").mkdir(exist_ok=True)
        (directory / "finished" / "rank-0.state.json").write_text(json.dumps({"state": "done"}))
    out = subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps), "--rounds", str(rounds)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def interpreter_start(env: dict[str, str], runs: int) -> float:
    """Median wall time of `python -c pass` in milliseconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters per configuration, interleaved")
    parser.add_argument("--starts", type=int, default=30, help="interpreter starts per configuration")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps, args.rounds)
        return 0
    results: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp:
        directory = Path(tmp)
        install_bootstrap(directory)
        for _ in range(args.repeats):
            for config in CONFIGS:
                results[config].append(run_child(config, directory, args.steps, args.rounds))
        plain = env_without_agent()
        interpreter_start(plain, 3)
        start_plain, start_agent = [], []
        for _ in range(3):
            start_plain.append(interpreter_start(plain, args.starts // 3))
            start_agent.append(interpreter_start({**plain, **training_env(directory, plain)}, args.starts // 3))
    reference = statistics.median(r["step_us"] for r in results["no agent"])
    print(f"optimizer step loop, {args.steps} steps x {args.rounds} rounds x {args.repeats} interpreters, median per step:")
    for config in CONFIGS:
        step_us = statistics.median(r["step_us"] for r in results[config])
        line = f"  {config:32s} {step_us:7.2f} us/step   +{step_us - reference:5.2f} us   ratio {step_us / reference:.3f}"
        boundaries = [r["boundary_us"] for r in results[config] if r["boundary_us"] is not None]
        if boundaries:
            line += f"   (agent boundary alone {statistics.median(boundaries):.2f} us)"
        print(line)
    plain_ms, agent_ms = statistics.median(start_plain), statistics.median(start_agent)
    print(f"interpreter start (python -c pass), median of {args.starts}: {plain_ms:.1f} ms without the bootstrap, "
          f"{agent_ms:.1f} ms with it (+{agent_ms - plain_ms:.1f} ms, ratio {agent_ms / plain_ms:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
