"""What the always-on step telemetry costs a training step (goal <= 5 us a step): in a
fresh interpreter started the zero-code way, once the agent has mapped its ring file, rounds of
the same optimizer-step loop with the telemetry on and off (its ring's record replaced by a no-op
method, so the difference is the two struct writes into the mapped file), back to back in random
order so both halves of a pair see the same machine load; the agent's boundary alone the same
way; the record call alone; and the loop without the agent's hook as the reference. Medians over
rounds and interpreters, with the least-disturbed round (the minimum) in brackets. Then the wait
share's part: one read of DDP's timing of its all-reduce (a DistributedDataParallel model over a
one-rank gloo group), which a step boundary makes every 2 s, and the test every boundary makes.

The operator's part (--part operator): a ProfileTrigger's poll of 1,000 simulated pods (8 ranks
each; one aiohttp server in a child process answers the signed GET /v1/telemetry for every pod
address 127.0.x.y, verifying each signature), the way its daemon polls (stepscope.operator.sessions.fanout
limit of 64, detection.observe, triggers.step): this process's CPU seconds a poll (all threads), the
CPU share at the default 10 s interval, requests per second, and the detection delay of a
slowdown (every rank's steps 2x slower) with the benchmark's short windows. The reference in the
same run: a capturing session's status poll of the same pods (fanout.poll, GET /v1/sessions/{id}),
which the operator makes every second while a session captures.

    .venv/bin/python benchmarks/watch_cost.py [--steps 2000] [--rounds 40] [--repeats 3] [--part agent|operator|both]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.agent_overhead

from benchmarks.agent_overhead import env_without_agent, timed
from benchmarks.fanout import KEY, pod_ip
from stepscope.local.launch import free_port
from stepscope.sidecar.bootstrap import install_bootstrap, training_env

STEP_S = 0.1  # the simulated ranks' healthy step time; 2x after the slowdown


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
    agent = sys.modules["stepscope_agent"].current()
    deadline = time.monotonic() + 30
    while agent.ring.path is None:  # the watchdog maps the ring file at its first beat after a step
        optimizer.step()
        time.sleep(0.01)
        if time.monotonic() > deadline:
            raise SystemExit("the agent never mapped its ring file")
    ring, off = agent.ring, _Off()
    timed(optimizer.step, 1000)
    results: dict[str, list[float]] = {
        k: [] for k in ("step_on", "step_off", "boundary_on", "boundary_off", "no_hook", "record")
    }
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
    out.update(wait_share_cost(agent))
    print(json.dumps(out))


def simulated_telemetry(port: int, ranks_per_pod: int, slow_since: Any, ready: Any) -> None:
    """One server for every pod: each rank stepped every STEP_S since the start, every 2 x STEP_S
    once `slow_since` (shared, Unix seconds; 0 while healthy) passed."""
    from aiohttp import web

    from stepscope.operator.namespace_keys import namespace_key
    from stepscope.signing import SignatureError, Verifier, target

    verifier = Verifier(namespace_key(KEY, "default"))
    start = time.time()

    def steps_at(t: float, slow: float) -> int:
        if not slow or t <= slow:
            return int((t - start) / STEP_S)
        return int((slow - start) / STEP_S) + int((t - slow) / (2 * STEP_S))

    async def telemetry(request: web.Request) -> web.Response:
        try:
            verifier.verify(
                request.method,
                request.path,
                b"",
                request.headers,
                targets={target(request.host.rsplit(":", 1)[0], int(request.host.rsplit(":", 1)[1]))},
            )
        except SignatureError as exc:
            return web.json_response({"error": str(exc)}, status=401)
        now, slow = time.time(), slow_since.value
        n = steps_at(now, slow)
        first_slow = steps_at(slow, slow) if slow else n + 1
        recent = [[k, STEP_S * (2 if k > first_slow else 1)] for k in range(max(2, n - 63), n + 1)]
        pod = (
            int(request.host.rsplit(":", 1)[0].split(".")[2]) * 250
            + int(request.host.rsplit(":", 1)[0].split(".")[3])
            - 1
        )
        ranks = [
            {
                "rank": pod * ranks_per_pod + r,
                "localRank": r,
                "alive": True,
                "steps": n,
                "lastStepSeconds": recent[-1][1] if recent else None,
                "secondsSinceStep": 0.05,
                "recent": recent,
            }
            for r in range(ranks_per_pod)
        ]
        return web.json_response({"pod": f"train-{pod}", "time": now, "ranks": ranks})

    async def session(request: web.Request) -> web.Response:
        try:
            verifier.verify(
                request.method,
                request.path,
                b"",
                request.headers,
                targets={target(request.host.rsplit(":", 1)[0], int(request.host.rsplit(":", 1)[1]))},
            )
        except SignatureError as exc:
            return web.json_response({"error": str(exc)}, status=401)
        workers = {
            "total": ranks_per_pod,
            "triggered": ranks_per_pod,
            "capturing": ranks_per_pod,
            "captured": 0,
            "uploaded": 0,
            "failed": 0,
        }
        return web.json_response(
            {
                "session": request.match_info["id"],
                "phase": "Capturing",
                "workers": workers,
                "ranks": [{"rank": r, "state": "capturing"} for r in range(ranks_per_pod)],
            }
        )

    app = web.Application()
    app.add_routes([web.get("/v1/telemetry", telemetry), web.get("/v1/sessions/{id}", session)])
    ready.set()
    web.run_app(app, host="0.0.0.0", port=port, print=None, access_log=None, handle_signals=True)


def operator_cost(pods: int, ranks_per_pod: int, interval_s: float, polls: int) -> None:
    import multiprocessing

    from stepscope import detection
    from stepscope.local.launch import free_port
    from stepscope.operator.namespace_keys import namespace_key
    from stepscope.operator.sessions import fanout
    from stepscope.operator.sessions.selection import Target
    from stepscope.operator.settings import OperatorSettings
    from stepscope.operator.triggers import policy as triggers

    settings = OperatorSettings()
    limit = fanout.Limit(settings.fanout_concurrency)  # the operator's Context makes it so
    spawn = multiprocessing.get_context("spawn")
    port, ready, slow_since = free_port(), spawn.Event(), spawn.Value("d", 0.0)
    server = spawn.Process(target=simulated_telemetry, args=(port, ranks_per_pod, slow_since, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise SystemExit("the simulated sidecars did not start")
        time.sleep(1.0)
        targets = [Target(pod=f"train-{i}", ip=pod_ip(i), port=port) for i in range(pods)]
        key = namespace_key(KEY, "default")
        policy = triggers.Policy(
            "bench",
            detection.Conditions(sustained_s=3 * interval_s, baseline_window_s=60, min_baseline_polls=5),
            cooldown_s=0,
        )

        def timed_poll(poll: Any) -> tuple[float, float, list[fanout.Outcome]]:
            cpu, wall = time.process_time(), time.perf_counter()
            outcomes = poll()
            return time.process_time() - cpu, time.perf_counter() - wall, outcomes

        reference = [
            timed_poll(
                lambda: asyncio.run(
                    fanout.poll(targets, "bench-session", key, limit=limit, timeout=settings.sidecar_timeout_s)
                )
            )
            for _ in range(polls)
        ]
        state, cpu, wall, failed, slowed, fired = triggers.State(), [], [], 0, 0.0, None
        for _ in range(200):
            began = time.time()
            c, w, outcomes = timed_poll(
                lambda: asyncio.run(fanout.telemetry(targets, key, limit=limit, timeout=settings.sidecar_timeout_s))
            )
            c0 = time.process_time()
            observation = triggers.Observation(began, detection.observe(began, [o.answer for o in outcomes if o.ok]))
            state, actions = triggers.step(state, observation, policy)
            cpu.append(c + time.process_time() - c0)
            wall.append(w)
            failed += sum(not o.ok for o in outcomes)
            if not slowed and state.detection.baseline is not None and len(cpu) >= polls:
                slowed = slow_since.value = time.time()
            if actions and slowed:
                fired = time.time() - slowed
                break
            time.sleep(max(0.0, began + interval_s - time.time()))
    finally:
        server.terminate()
    median = statistics.median
    ref_cpu, ref_wall = median(r[0] for r in reference), median(r[1] for r in reference)
    print(
        f"operator polling {pods} simulated pods x {ranks_per_pod} ranks (at most {settings.fanout_concurrency} "
        f"requests at once), {len(cpu)} telemetry polls every {interval_s:g} s, {failed} failed requests:"
    )
    print(f"  reference: a capturing session's status poll  CPU {ref_cpu:.3f} s a poll, wall {ref_wall:.3f} s")
    print(
        f"  ProfileTrigger poll (fan-out + observe + step) CPU {median(cpu):.3f} s a poll "
        f"({median(cpu) / ref_cpu:.2f}x the reference), "
        f"wall {median(wall):.3f} s"
    )
    print(
        f"  at the default 10 s interval: {median(cpu) / 10:.1%} of one core, {pods / 10:.0f} requests/s "
        f"(a capturing session: {ref_cpu:.1%} of a core at 1 poll/s, {pods} requests/s)"
    )
    print(
        f"  detection delay of a 2x slowdown (sustained {policy.conditions.sustained_s:g} s, polls every "
        f"{interval_s:g} s): " + (f"{fired:.1f} s" if fired is not None else "did not fire")
    )


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
    test = timeit.timeit(
        "now - agent._wait_read_mono >= COLLECTIVE_WAIT_READ_SECONDS",
        globals={"now": time.monotonic(), "agent": agent, "COLLECTIVE_WAIT_READ_SECONDS": 2.0},
        number=100_000,
    )
    dist.destroy_process_group()
    return {"ddp_read": statistics.median(reads), "interval_test": test / 100_000 * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters")
    parser.add_argument("--part", choices=("agent", "operator", "both"), default="both")
    parser.add_argument("--pods", type=int, default=1000, help="operator part: simulated pods")
    parser.add_argument("--ranks-per-pod", type=int, default=8)
    parser.add_argument("--interval", type=float, default=2.0, help="operator part: seconds between polls in this run")
    parser.add_argument(
        "--polls", type=int, default=8, help="operator part: reference polls, and healthy polls before the slowdown"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps, args.rounds)
        return 0
    if args.part in ("operator", "both"):
        operator_cost(args.pods, args.ranks_per_pod, args.interval, args.polls)
    if args.part == "operator":
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="stepscope-watch-") as tmp:
        directory = Path(tmp)
        install_bootstrap(directory)
        env = {
            **env_without_agent(),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
        env.update(training_env(directory, env))
        for _ in range(args.repeats):
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--steps", str(args.steps), "--rounds", str(args.rounds)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    median = statistics.median

    def figure(key: str) -> str:
        return f"{median(r[key]['median'] for r in rows):6.2f} us [{min(r[key]['min'] for r in rows):.2f}]"

    print(
        f"step telemetry, {args.steps} steps x {args.rounds} rounds x {args.repeats} interpreters "
        f"(median, least-disturbed round in brackets):"
    )
    print(f"  optimizer step, agent without its hook (reference) {figure('no_hook')}")
    print(f"  optimizer step, agent, telemetry off               {figure('step_off')}")
    print(
        f"  optimizer step, agent, telemetry on                {figure('step_on')}   "
        f"telemetry +{median(r['step_diff'] for r in rows):.2f} us a step (paired rounds)"
    )
    print(f"  agent boundary alone, telemetry off                {figure('boundary_off')}")
    print(
        f"  agent boundary alone, telemetry on                 {figure('boundary_on')}   "
        f"telemetry +{median(r['boundary_diff'] for r in rows):.2f} us a step (paired rounds)"
    )
    print(f"  ring record alone (two struct writes into the mapped file) {figure('record')}")
    read = median(r["ddp_read"] for r in rows)
    print(
        f"wait share: one read of DDP's all-reduce timing {read:.1f} us, every 2 s ({read / 2:.1f} us a second, "
        f"{read / 2 * 0.001:.3f} us a 1-ms step); the interval test every boundary makes "
        f"{median(r['interval_test'] for r in rows):.3f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
