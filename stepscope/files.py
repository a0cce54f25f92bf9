"""Writing files that other processes read while they change (the shared directory, a file://
store): readers see the old file or the new one, never a half-written one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

# What a file being written is called until it is complete; listings skip such names.
PARTIAL_SUFFIX = ".part"


def write_atomically(path: Path, fill: Callable[[BinaryIO], object], *, mode: int = 0o644) -> None:
    """Create `path`'s folder, let `fill` write a temporary file beside it, then rename it over
    `path`. `mode` replaces mkstemp's 0600: a training container or a reader of the store may run
    as another user."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            fill(out)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
