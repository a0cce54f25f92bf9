"""This process's step telemetry (docs/wire.md, "Step telemetry"): each step's end and duration in
a ring the sidecar reads, two struct writes a step."""
from __future__ import annotations

import os
import struct
import time

from .files import atomic_write, unlink
from .vocabulary import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class StepRing:
    """This process's step telemetry (docs/wire.md, "Step telemetry"): a buffer in memory until
    the watchdog knows the rank and maps the ring file, then that file's memory, so that a step
    costs two struct writes and no system call."""

    def __init__(self) -> None:
        slot = struct.Struct(wire.TELEMETRY_SLOT)
        self._pack_slot = slot.pack_into
        self._pack_count = struct.Struct(wire.TELEMETRY_COUNT).pack_into
        self._slot_size = slot.size
        self._mask = wire.TELEMETRY_CAPACITY - 1
        # Looked up once here: record() runs in the step hook.
        self._slots_at, self._count_at = wire.TELEMETRY_SLOTS_AT, wire.TELEMETRY_COUNT_AT
        self.buffer: Any = bytearray(wire.TELEMETRY_SLOTS_AT + wire.TELEMETRY_CAPACITY * slot.size)
        self.path: str | None = None
        self.run_id = int.from_bytes(os.urandom(8), "little") >> 1 or 1

    def record(self, step: int, end: float, duration: float) -> None:
        buffer = self.buffer
        self._pack_slot(buffer, self._slots_at + (step & self._mask) * self._slot_size, step, end, duration)
        self._pack_count(buffer, self._count_at, step)

    def publish(self, path: str, rank: int, local_rank: int, world: int) -> None:
        """Write the steps so far to `path` under this identity and record into the file from now on."""
        import mmap

        data = bytearray(self.buffer)
        struct.pack_into(wire.TELEMETRY_HEADER, data, 0, wire.TELEMETRY_MAGIC.encode(), wire.TELEMETRY_CAPACITY, rank, local_rank,
                         world, os.getpid(), time.time() - time.monotonic(), self.run_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, bytes(data))
        with open(path, "r+b") as f:
            mapped = mmap.mmap(f.fileno(), len(data))
        # The steps recorded between the copy and the switch are lost; the reader skips their slots.
        self.buffer, old = mapped, self.path
        self.path = path
        if old is not None and old != path:
            unlink(old)

    def remove(self) -> None:
        if self.path is not None:
            unlink(self.path)


