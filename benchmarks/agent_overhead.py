"""What the idle agent costs a training step: the same optimizer-step loop timed in fresh
interpreters without the bootstrap (reference) and with it (agent idle: request.json absent, and
present but unchanged), alternating, median of several rounds. Also what the bootstrap adds to
the start of every Python process in the pod (`python -c pass`, which never imports torch).

    .venv/bin/python benchmarks/agent_overhead.py [--steps 2000] [--rounds 60] [--repeats 3] [--device cuda]

With --device cuda the parameter lives on the GPU, so each step launches its update as a CUDA
kernel (the CPU side of a CUDA step, which is what the agent's hook adds to).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stepscope.sidecar.bootstrap import install_bootstrap, training_env

CONFIGS = ("no agent", "agent, no request.json", "agent, request.json unchanged")


def timed(loop: Callable[[], object], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        loop()
    return (time.perf_counter() - start) / steps * 1e6


def child(steps: int, rounds: int, device: str) -> None:
    """Time `steps` optimizer steps of a one-parameter SGD `rounds` times; print medians (us).
    With the agent loaded, each round times its step hook on and off back to back (in random
    order), so both halves of a pair see the same machine load and the median of the pairs'
    differences is the agent's cost; its boundary is also timed alone, without torch around it."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    torch.set_num_threads(1)
    param = torch.zeros(16, requires_grad=True, device=device)
    param.grad = torch.ones(16, device=device)
    optimizer = torch.optim.SGD([param], lr=0.0)
    timed(optimizer.step, 1000)
    module = sys.modules.get("stepscope_agent")
    agent = module.current() if module is not None else None
    if agent is None:
        per_step = [timed(optimizer.step, steps) for _ in range(rounds)]
        print(json.dumps({"step_us": statistics.median(per_step), "min_us": min(per_step)}))
        return
    on: list[float] = []
    off: list[float] = []
    boundary: list[float] = []
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        halves = [True, False]
        shuffle(halves)
        for hook_on in halves:
            if not hook_on:
                agent._hook_handle.remove()
            (on if hook_on else off).append(timed(optimizer.step, steps))
            if not hook_on:
                agent._hook_handle = register_optimizer_step_post_hook(agent._on_optimizer_step)
        boundary.append(timed(agent.boundary, steps))
    median = statistics.median
    print(
        json.dumps(
            {
                "step_us": median(on),
                "min_us": min(on),
                "hook_off_us": median(off),
                "min_off_us": min(off),
                "pair_diff_us": median(a - b for a, b in zip(on, off)),
                "boundary_us": median(boundary),
                "min_boundary_us": min(boundary),
            }
        )
    )


def env_without_agent() -> dict[str, str]:
    """The environment without the agent: PYTHONPATH keeps the caller's entries (stepscope run from
    its source tree, packages installed beside it) but not a bootstrap folder's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STEPSCOPE_DIR")}
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [p for p in paths if not (Path(p) / "sitecustomize.py").is_file()]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def run_child(config: str, directory: Path, steps: int, rounds: int, device: str) -> dict:
    env = {**env_without_agent(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    if config != "no agent":
        env.update(training_env(directory, env))
    request = directory / "request.json"
    request.unlink(missing_ok=True)
    if config == "agent, request.json unchanged":
        # A finished session's request stays in place; the agent stats it every step, never rereads it.
        request.write_text(
            json.dumps({"version": 1, "session": "finished", "action": "capture", "capture": {"steps": 1}})
        )
        (directory / "finished").mkdir(exist_ok=True)
        (directory / "finished" / "rank-0.state.json").write_text(json.dumps({"state": "done"}))
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--steps", str(steps), "--rounds", str(rounds), "--device", device],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
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
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters per configuration, interleaved")
    parser.add_argument("--starts", type=int, default=30, help="interpreter starts per configuration")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the parameter lives")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps, args.rounds, args.device)
        return 0
    results: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp:
        directory = Path(tmp)
        install_bootstrap(directory)
        for _ in range(args.repeats):
            for config in CONFIGS:
                results[config].append(run_child(config, directory, args.steps, args.rounds, args.device))
        plain = env_without_agent()
        interpreter_start(plain, 3)
        start_plain, start_agent = [], []
        for _ in range(3):
            start_plain.append(interpreter_start(plain, args.starts // 3))
            start_agent.append(interpreter_start({**plain, **training_env(directory, plain)}, args.starts // 3))
    median = statistics.median
    reference = median(r["step_us"] for r in results["no agent"])
    print(
        f"optimizer step (one-parameter SGD on {args.device}), {args.steps} steps x {args.rounds} rounds x "
        f"{args.repeats} interpreters (median, min in brackets):"
    )
    print(
        f"  {'no agent (fresh interpreter)':30s} {reference:6.2f} us/step "
        f"[{min(r['min_us'] for r in results['no agent']):.2f}]"
    )
    for config in CONFIGS[1:]:
        rows = results[config]
        on = median(r["step_us"] for r in rows)
        print(
            f"  {config:30s} {on:6.2f} us/step [{min(r['min_us'] for r in rows):.2f}], ratio to no agent "
            f"{on / reference:.3f}; same interpreter with the hook off {median(r['hook_off_us'] for r in rows):.2f} "
            f"[{min(r['min_off_us'] for r in rows):.2f}]: agent +{median(r['pair_diff_us'] for r in rows):.2f} us a "
            f"step (paired rounds); agent boundary alone {median(r['boundary_us'] for r in rows):.2f} "
            f"[{min(r['min_boundary_us'] for r in rows):.2f}] us"
        )
    plain_ms, agent_ms = statistics.median(start_plain), statistics.median(start_agent)
    print(
        f"interpreter start (python -c pass), median of {args.starts}: {plain_ms:.1f} ms without the bootstrap, "
        f"{agent_ms:.1f} ms with it (+{agent_ms - plain_ms:.1f} ms, ratio {agent_ms / plain_ms:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
