"""The process's one agent: started by the bootstrap, re-armed in a forked child, and the
stepscope.step() of loops without an optimizer."""
from __future__ import annotations

import os
import sys

from . import environment
from .agent import Agent
from .log import log
from .torch_hooks import TorchImportWatcher

_AGENT: Agent | None = None


def current() -> Agent | None:
    """This process's agent; None before start() or where a forked child could not re-arm one."""
    return _AGENT


def start(directory: str | None = None) -> Agent:
    """Start the agent in this process (idempotent); attaches to torch when the program imports it."""
    global _AGENT
    if _AGENT is not None:
        return _AGENT
    _AGENT = agent = Agent(directory or environment.shared_directory())
    os.register_at_fork(after_in_child=_rearm_in_forked_child)
    if "torch" in sys.modules and hasattr(sys.modules["torch"], "optim"):
        agent.attach_torch()
    else:
        sys.meta_path.insert(0, TorchImportWatcher(_attach_torch))
    return agent


def _attach_torch() -> None:
    if _AGENT is not None:
        _AGENT.attach_torch()


def _rearm_in_forked_child() -> None:
    """A forked child keeps its parent's agent but none of its threads, and perhaps a lock a parent
    thread held: it gets an agent of its own (its pid, steps and rank). A forked rank steps; a forked
    data loader worker never does, so it never registers nor answers. Runs inside os.fork()."""
    global _AGENT
    parent = _AGENT
    if parent is None:
        return
    try:
        if parent._hook_handle is not None:
            parent._hook_handle.remove()
            parent._hook_handle = None
        child = Agent(parent.directory, forked=True)
        child._manual = parent._manual
        _AGENT = child
        if parent._torch_ready:
            child.attach_torch()
    except Exception:
        _AGENT = None
        log.exception("stepscope agent: cannot re-arm in a forked child; it is not profiled")


def step() -> None:
    """Mark the end of one training step (for loops without an optimizer); never raises."""
    agent = _AGENT
    if agent is not None:
        try:
            agent.manual_step()
        except Exception:  # noqa: BLE001 - stepscope.step() never raises into the training loop
            agent._log_failure("step()")
