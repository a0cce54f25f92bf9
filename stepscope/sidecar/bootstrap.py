"""Puts the zero-code-change bootstrap into a shared directory.

`install_bootstrap` copies the agent's package (stepscope/agent, standard library only) and the
contracts it reads (stepscope/contracts) next to a `sitecustomize.py`;
a training process whose PYTHONPATH starts with that folder (`training_env`) then runs the image's
own `sitecustomize` first, if it has one, and starts the agent. The training image needs torch and
nothing of stepscope.
"""

from __future__ import annotations

import os
import py_compile
from collections.abc import Mapping
from operator import methodcaller
from pathlib import Path

from stepscope import agent
from stepscope.contracts import wire
from stepscope.contracts.wire import AGENT_MODULE, BOOTSTRAP_FOLDER, CONTRACTS_MODULE
from stepscope.files import write_atomically

AGENT_SOURCE = Path(agent.__file__).parent
CONTRACTS_SOURCE = Path(wire.__file__).parent

# site.py imports this in every interpreter; it must never stop one from starting.
SITECUSTOMIZE = f'''"""stepscope bootstrap (written by the stepscope sidecar): chain-load the image's own
sitecustomize, then start the stepscope agent. Neither may stop the interpreter from starting."""


def _stepscope_chain_load():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.stderr.write(
            f"Error in sitecustomize {{spec.origin}} (chain-loaded by stepscope): {{type(e).__name__}}: {{e}}\\n"
        )
    return module


def _stepscope_start():
    import sys

    try:
        import {AGENT_MODULE}
        {AGENT_MODULE}.start()
    except Exception as e:
        sys.stderr.write(f"stepscope agent not started: {{type(e).__name__}}: {{e}}\\n")


chained_sitecustomize = _stepscope_chain_load()
_stepscope_start()
'''


def install_bootstrap(stepscope_dir: Path) -> Path:
    """Write `<dir>/bootstrap/{sitecustomize.py, stepscope_agent/, stepscope_contracts/}`; returns the
    bootstrap folder."""
    folder = Path(stepscope_dir) / BOOTSTRAP_FOLDER
    # The contracts first, the agent's __init__ last: a process that starts during a first
    # install finds no agent to start until every module it imports is there.
    files = []
    for package, name in ((CONTRACTS_SOURCE, CONTRACTS_MODULE), (AGENT_SOURCE, AGENT_MODULE)):
        (folder / name).mkdir(parents=True, exist_ok=True)
        # The agent's native library too, where it is built (without it, no stop watch).
        modules = sorted([*package.glob("*.py"), *package.glob("*.so")], key=lambda p: p.name == "__init__.py")
        files += [(folder / name / module.name, module.read_bytes()) for module in modules]
    files.append((folder / "sitecustomize.py", SITECUSTOMIZE.encode()))
    for path, source in files:
        write_atomically(path, methodcaller("write", source))
        # Every Python process in the pod loads these at start. Images often set
        # PYTHONDONTWRITEBYTECODE, which would recompile the agent each time (~9 ms); a training
        # interpreter of the sidecar's Python version reads this cache even then, others ignore it.
        if path.suffix == ".py":
            py_compile.compile(str(path), doraise=True)
    return folder


def training_env(stepscope_dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a training process needs for the bootstrap (PYTHONPATH first, STEPSCOPE_DIR)."""
    base = dict(os.environ) if base is None else base
    folder = str(Path(stepscope_dir).resolve() / BOOTSTRAP_FOLDER)
    existing = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p != folder]
    return {"PYTHONPATH": os.pathsep.join([folder, *existing]), wire.DIR_ENV: str(Path(stepscope_dir).resolve())}
