"""The agent's own writes to the shared directory: whole files or none (the sidecar reads them at
any moment), standard library only."""
from __future__ import annotations

import json
import os
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def atomic_write(path: str, data: bytes) -> None:
    tmp = f"{os.path.join(os.path.dirname(path), '.' + os.path.basename(path))}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str, obj: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(obj, separators=(",", ":")).encode())


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

