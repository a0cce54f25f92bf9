"""The analysis's caps, read from the environment: the analysis Job's env, or what `stepscope
analyze` sets from its options so that its worker processes inherit them. The one module of the
analysis that reads the environment; it imports nothing of the analysis, so every stage may use it."""

from __future__ import annotations

import os

# Caps per rank, from measurements: the largest real trace of the tests is 54 MB of JSON with 123 k
# rows kept, the benchmark's ranks 286 MB with 740 k (a summarising process peaks at ~210 MiB). A
# process summarising 2 M rows peaked at ~410 MiB before the critical path (~95 MiB more at 740 k
# rows; 2 M rows not re-measured with it), near what the worker pool plans a worker to hold
# (loading.parallel.WORKER_BYTES), so a hostile rank does not take a worker's neighbours' memory;
# 2 GiB of JSON take ~15 s to read.
MAX_TRACE_MB_ENV, MAX_TRACE_EVENTS_ENV = "STEPSCOPE_MAX_TRACE_MB", "STEPSCOPE_MAX_TRACE_EVENTS"
DEFAULT_MAX_TRACE_MB = 2048
DEFAULT_MAX_TRACE_EVENTS = 2_000_000
# A node's samples at the default 1 kHz: 8 GPUs for a minute are ~480 k rows of ~100 bytes (48 MB);
# 128 MiB (and loading.gpu_samples.MAX_CELLS) leave room for that while the analysis stays within
# its memory.
MAX_METRICS_MB_ENV = "STEPSCOPE_MAX_METRICS_MB"
DEFAULT_MAX_METRICS_MB = 128


def _positive(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{name} must be a positive integer, not {text!r}")
    return int(text)


def trace_caps() -> tuple[int, int]:
    """(uncompressed bytes, rows kept) read of one rank's trace. Raises ValueError for a value that
    is not a positive integer."""
    return _positive(MAX_TRACE_MB_ENV, DEFAULT_MAX_TRACE_MB) << 20, _positive(
        MAX_TRACE_EVENTS_ENV, DEFAULT_MAX_TRACE_EVENTS
    )


def metrics_cap_bytes() -> int:
    """Uncompressed bytes read of one node's GPU samples file. Raises ValueError as trace_caps."""
    return _positive(MAX_METRICS_MB_ENV, DEFAULT_MAX_METRICS_MB) << 20
