"""The zero-code-change bootstrap in real interpreters: chain-loading, no torch import for
processes that never use torch, a broken agent never breaking the interpreter."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from stepscope import AGENT_MODULE
from stepscope.agent import vocabulary
from stepscope.contracts import wire
from stepscope.contracts.wire import CONTRACTS_MODULE
from stepscope.sidecar.bootstrap import install_bootstrap, training_env
from stepscope.sidecar.sessions import RankProgress


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=60
    )


def test_install_writes_the_agent_and_sitecustomize(tmp_path: Path) -> None:
    folder = install_bootstrap(tmp_path)
    assert folder == tmp_path / "bootstrap"
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == sorted(
        [AGENT_MODULE, "sitecustomize.py", CONTRACTS_MODULE]
    )
    # The agent's package whole, module for module.
    package = Path(__file__).parents[2] / "stepscope" / "agent"
    modules = sorted(p.name for p in package.glob("*.py"))
    assert "__init__.py" in modules and len(modules) > 5
    assert sorted(p.name for p in (folder / AGENT_MODULE).glob("*.py")) == modules
    for name in modules:
        assert (folder / AGENT_MODULE / name).read_bytes() == (package / name).read_bytes()
    # Its stop watch with it, where `make` built it (a plain C library, loaded with ctypes).
    native = sorted(p.name for p in package.glob("*.so"))
    assert sorted(p.name for p in (folder / AGENT_MODULE).glob("*.so")) == native
    # Byte-compiled by the installer, so that images with PYTHONDONTWRITEBYTECODE do not
    # recompile the agent in every process.
    contracts = Path(wire.__file__).parent
    assert sorted(p.name for p in (folder / CONTRACTS_MODULE).glob("*.py")) == sorted(
        p.name for p in contracts.glob("*.py")
    )
    for path in ("sitecustomize.py", f"{CONTRACTS_MODULE}/wire.py", *(f"{AGENT_MODULE}/{name}" for name in modules)):
        assert Path(importlib.util.cache_from_source(str(folder / path))).is_file()
    env = training_env(tmp_path, {"PYTHONPATH": "/opt/a:/opt/b"})
    assert env == {"PYTHONPATH": f"{folder.resolve()}:/opt/a:/opt/b", "STEPSCOPE_DIR": str(tmp_path.resolve())}
    assert training_env(tmp_path, env)["PYTHONPATH"] == env["PYTHONPATH"]


def test_the_bootstrap_agent_and_the_sidecar_speak_one_vocabulary(tmp_path: Path) -> None:
    """The agent a training process loads from the bootstrap folder uses the copy of the contracts
    written beside it, and nothing of the stepscope package (a training image has none); its
    states, sets, names and defaults are the sidecar's, and the sidecar's idea of a finished rank
    is built from the same sets."""
    install_bootstrap(tmp_path)
    names = [n for n in dir(wire) if n.isupper()]
    probe = (
        f"import json, sys, {AGENT_MODULE} as a, {CONTRACTS_MODULE}.wire as w; "
        f"print(json.dumps({{'same': a.vocabulary.wire is w, 'file': w.__file__, 'agent': a.__file__, "
        f"'stepscope': sorted(m for m in sys.modules if m.split('.')[0] == 'stepscope'), 'values': {{n: sorted(v) "
        f"if isinstance(v, frozenset) else v for n, v in vars(w).items() if n.isupper()}}}}))"
    )
    result = run_python(probe, training_env(tmp_path, {}))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["same"] and Path(seen["file"]).parent == tmp_path / "bootstrap" / CONTRACTS_MODULE
    assert Path(seen["agent"]).parent == tmp_path / "bootstrap" / AGENT_MODULE and seen["stepscope"] == []
    ours = {
        n: sorted(v) if isinstance(v, frozenset) else list(v) if isinstance(v, tuple) else v
        for n, v in vars(wire).items()
        if n.isupper()
    }  # as JSON has them
    assert seen["values"] == ours and set(ours) == set(names)
    assert vocabulary.wire is wire
    assert wire.HUNG not in wire.FINAL_STATES and wire.HUNG in wire.ACTIVE_STATES, "a hung rank may resume"
    assert wire.ACTIVE_STATES.isdisjoint(wire.FINAL_STATES) and wire.FAILED_STATES <= wire.STATES
    for state in wire.STATES:
        assert RankProgress(0, state=state).terminal == (state in wire.FINAL_STATES)


def test_chain_loads_the_images_sitecustomize_and_never_imports_torch(tmp_path: Path) -> None:
    install_bootstrap(tmp_path / "ss")
    image = tmp_path / "image-site"
    image.mkdir()
    (image / "sitecustomize.py").write_text("import os\nIMAGE_MARKER = os.getpid()\n")
    env = training_env(tmp_path / "ss", {"PYTHONPATH": str(image)})
    result = run_python(
        "import json, os, sys\n"
        "import sitecustomize\n"
        "print(json.dumps({'chained': getattr(sitecustomize.chained_sitecustomize, 'IMAGE_MARKER', None) == "
        "os.getpid(),"
        f" 'agent': {AGENT_MODULE!r} in sys.modules, 'torch': 'torch' in sys.modules}}))",
        env,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"chained": True, "agent": True, "torch": False}
    assert not (tmp_path / "ss" / "agents").exists(), "a process without torch registers no agent"


def test_without_an_image_sitecustomize_the_agent_still_starts(tmp_path: Path) -> None:
    install_bootstrap(tmp_path)
    result = run_python(
        f"import sys, sitecustomize; print(sitecustomize.chained_sitecustomize, {AGENT_MODULE!r} in sys.modules)",
        training_env(tmp_path, {}),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "True"]


def test_a_broken_agent_or_image_sitecustomize_never_breaks_the_interpreter(tmp_path: Path) -> None:
    folder = install_bootstrap(tmp_path / "ss")
    (folder / AGENT_MODULE / "__init__.py").write_text("raise RuntimeError('agent exploded')\n")
    image = tmp_path / "image-site"
    image.mkdir()
    (image / "sitecustomize.py").write_text("raise ValueError('image exploded')\n")
    result = run_python("print('training runs')", training_env(tmp_path / "ss", {"PYTHONPATH": str(image)}))
    assert result.returncode == 0 and result.stdout == "training runs\n"
    assert "ValueError: image exploded" in result.stderr
    assert "stepscope agent not started: RuntimeError: agent exploded" in result.stderr


def test_steps_are_counted_once_per_training_step(tmp_path: Path) -> None:
    """Two optimizers count one step (one leads); the first stepscope.step() switches the hook off."""
    install_bootstrap(tmp_path)
    code = (
        "import torch, stepscope, stepscope_agent\n"
        "m = torch.nn.Linear(2, 2)\n"
        "a, b = torch.optim.SGD([m.weight], lr=0.1), torch.optim.SGD([m.bias], lr=0.1)\n"
        "for _ in range(3):\n"
        "    m(torch.ones(1, 2)).sum().backward(); a.step(); b.step()\n"
        "print(stepscope_agent.current().step_count)\n"
        "stepscope.step()\n"
        "a.step(); b.step()\n"
        "stepscope.step()\n"
        "print(stepscope_agent.current().step_count)\n"
    )
    result = run_python(code, {**training_env(tmp_path, {}), "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "5"]


SPAWNS_A_WORKER = """
import json, multiprocessing, os, sys, time, torch

def worker():
    import torch  # like a data loader worker: inherits RANK, imports torch, never steps
    time.sleep(2.5)

def writers():
    # Who wrote rank 0's heartbeat and state: watched while the children live.
    seen = set()
    shared = os.environ["STEPSCOPE_DIR"]
    for name in ("agents/rank-0.json", "s-mp/rank-0.state.json"):
        try:
            seen.add(json.load(open(os.path.join(shared, name)))["pid"])
        except (OSError, ValueError):
            pass
    return seen

if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=worker)
    child.start()
    forked = os.fork()
    if forked == 0:
        import torch.optim
        time.sleep(2.5)
        sys.exit(0)  # runs atexit handlers, unlike os._exit
    seen = set()
    while child.is_alive():
        seen |= writers()
        time.sleep(0.05)
    os.waitpid(forked, 0)
    seen |= writers()
    print(json.dumps({"main": os.getpid(), "child": child.pid, "forked": forked, "writers": sorted(seen)}))
"""


def test_multiprocessing_children_neither_register_nor_answer(tmp_path: Path) -> None:
    """Spawned and forked children inherit RANK; only the training process registers as rank 0."""
    install_bootstrap(tmp_path / "ss")
    (tmp_path / "ss" / "request.json").write_text(
        json.dumps(
            {
                "version": 1,
                "session": "s-mp",
                "action": "capture",
                "capture": {"waitSteps": 100, "steps": 1},
                "hangTimeoutSeconds": 300,
            }
        )
    )
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS_A_WORKER)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **training_env(tmp_path / "ss", {}), "RANK": "0", "WORLD_SIZE": "1"},
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["writers"] == [seen["main"]], seen
    state = json.loads((tmp_path / "ss" / "s-mp" / "rank-0.state.json").read_text())
    assert state["pid"] == seen["main"] and state["state"] == "failed" and "exited at step 0" in state["error"]


def test_without_the_shared_directory_nothing_is_created(tmp_path: Path) -> None:
    """PYTHONPATH set but the shared directory not mounted: training runs, the agent stays quiet."""
    install_bootstrap(tmp_path / "ss")
    env = {
        **training_env(tmp_path / "ss", {}),
        "STEPSCOPE_DIR": str(tmp_path / "absent"),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    result = run_python(
        "import time, torch\nopt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\n"
        "for _ in range(3):\n    opt.step()\n    time.sleep(0.4)\nprint('trained')",
        env,
    )
    assert result.returncode == 0 and result.stdout == "trained\n", result.stderr
    assert result.stderr == ""
    assert not (tmp_path / "absent").exists()
