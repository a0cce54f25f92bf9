"""The agent's logger."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class _LazyLogger:
    """The "stepscope.agent" logger, imported on first use: every Python process in the pod loads
    this module at start, and most never log."""

    def __getattr__(self, name: str) -> Any:
        import logging

        return getattr(logging.getLogger("stepscope.agent"), name)


log = _LazyLogger()
