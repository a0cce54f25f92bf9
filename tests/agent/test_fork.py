"""Ranks started with multiprocessing's fork start method: each forked rank re-arms an agent of
its own (its pid in the registry, its own watchdog, its own rank) and captures; the parent's agent
goes on as before."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stepscope.local.launch import free_port
from stepscope.sidecar.bootstrap import install_bootstrap, training_env
from tests.agent.protocol import load_trace, profiler_steps, read_state, write_request

FORKS_RANKS = """
import json, os, sys, time
import torch
import torch.distributed as dist
import stepscope_agent

STEPS = 40


def train(rank, world, port):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    for _ in range(STEPS):
        model(x).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        time.sleep(0.02)
    dist.destroy_process_group()


def registered():
    seen = {}
    for rank in (0, 1):
        try:
            seen[rank] = json.load(open(os.path.join(os.environ["STEPSCOPE_DIR"], "agents", f"rank-{rank}.json")))["pid"]
        except (OSError, ValueError):
            pass
    return seen


if __name__ == "__main__":
    torch.set_num_threads(1)
    parent = stepscope_agent.current()
    ctx = torch.multiprocessing.get_context("fork")
    ranks = [ctx.Process(target=train, args=(rank, 2, int(sys.argv[1]))) for rank in range(2)]
    for p in ranks:
        p.start()
    heartbeats = {0: set(), 1: set()}
    while any(p.is_alive() for p in ranks):
        for rank, pid in registered().items():
            heartbeats[rank].add(pid)
        time.sleep(0.05)
    left_behind = registered()
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    for _ in range(3):
        opt.step()
    print(json.dumps({"parent": os.getpid(), "ranks": [p.pid for p in ranks], "codes": [p.exitcode for p in ranks],
                      "heartbeats": {rank: sorted(pids) for rank, pids in heartbeats.items()}, "left_behind": left_behind,
                      "parent_agent_kept": stepscope_agent.current() is parent and parent.pid == os.getpid(),
                      "parent_steps": parent.step_count}))
"""


def test_forked_ranks_register_and_capture_on_their_own(stepscope_dir: Path, tmp_path: Path) -> None:
    install_bootstrap(stepscope_dir)
    write_request(stepscope_dir, "s-fork", waitSteps=2, steps=3)
    script = tmp_path / "forks.py"
    script.write_text(FORKS_RANKS)
    env = {**training_env(stepscope_dir, {}), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(script), str(free_port())], env=env, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout)
    assert run["codes"] == [0, 0], result.stderr
    assert run["parent_agent_kept"] and run["parent_steps"] == 3, "the parent's agent is untouched by the forks"
    for rank, pid in enumerate(run["ranks"]):
        assert run["heartbeats"][str(rank)] == [pid], run
        state = read_state(stepscope_dir, "s-fork", rank)
        assert state is not None, f"rank {rank} (pid {pid}) never answered\n{result.stderr}"
        assert state["state"] == "done" and state["pid"] == pid and state["rank"] == rank and state["worldSize"] == 2, state
        assert state["startStep"] == state["triggerStep"] + 2 and state["capturedSteps"] == 3
        events = load_trace(stepscope_dir / "s-fork" / state["trace"])
        assert profiler_steps(events) == list(range(state["startStep"], state["endStep"]))
        assert {"aten::addmm", "gloo:all_reduce"} <= {e.get("name") for e in events}
    assert run["left_behind"] == {}, "a forked rank removes its registry file when it exits (os._exit skips atexit)"
    assert read_state(stepscope_dir, "s-fork", 2) is None
