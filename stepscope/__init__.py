"""stepscope: on-demand profiling and diagnosis of distributed PyTorch training.

Training code needs nothing from this package; `step()` exists for loops without an optimizer,
where the agent cannot count steps by itself.
"""

from __future__ import annotations

import sys

from stepscope.contracts.wire import AGENT_MODULE

__version__ = "0.1.0"


def step() -> None:
    """Mark the end of one training step; a no-op when no agent runs in this process."""
    agent = sys.modules.get(AGENT_MODULE)
    if agent is not None:
        agent.step()
