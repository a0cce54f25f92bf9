"""What `stepscope capture` and `stepscope watch` read from the environment: the one module of
stepscope/local that reads it."""

from __future__ import annotations

import os

from stepscope.contracts.wire import DEFAULT_PORT


def sidecar_url() -> str:
    """The sidecar's control endpoint: $STEPSCOPE_SIDECAR, else this machine's default port."""
    return os.environ.get("STEPSCOPE_SIDECAR", f"http://127.0.0.1:{DEFAULT_PORT}")
