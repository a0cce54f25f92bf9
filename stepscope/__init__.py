"""stepscope: on-demand profiling and diagnosis of distributed PyTorch training.

Training code needs nothing from this package; `step()` exists for loops without an optimizer,
where the agent cannot count steps by itself.
"""
from __future__ import annotations

import os
import sys

__version__ = "0.1.0"

# operator/ has no __init__.py (operator/README.md says why). A wheel puts it below this package,
# but an editable install's finder cannot find such a folder below a regular package, so in a
# source checkout the import system also looks beside this package.
_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_checkout, "pyproject.toml")) and _checkout not in __path__:
    __path__.append(_checkout)

from stepscope.wire import AGENT_MODULE  # noqa: E402 - the name the bootstrap loads the agent under


def step() -> None:
    """Mark the end of one training step; a no-op when no agent runs in this process."""
    agent = sys.modules.get(AGENT_MODULE)
    if agent is not None:
        agent.step()
