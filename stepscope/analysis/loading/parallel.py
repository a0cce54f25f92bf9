"""The worker processes of one analysis: one per rank at a time, as many as the cores this process
may use (its CPU affinity and, in a container, its cgroup's CPU quota) and its memory limit can
hold, never more than there is work for. One pool serves the summaries and the merged trace."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

# Measured peak RSS of one worker on 286 MB ranks (docs/benchmarks.md, analysis section), with room:
# 296 MiB without the critical path, 389-407 MiB with it (the path's graph, ~95 MiB at 740 k rows).
WORKER_BYTES = 450 << 20
# The main process: summaries, diagnosis, tables and report of up to thousands of ranks, and at
# times one rank of the merged trace (reporting.merged_trace._segments), as a worker does.
MAIN_BYTES = 600 << 20
_CGROUP = Path("/sys/fs/cgroup")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def cpu_quota() -> int | None:
    """Whole cores the cgroup's CPU quota allows (cgroup v2, else v1); None without a quota."""
    v2 = _read(_CGROUP / "cpu.max").split()
    if len(v2) == 2 and v2[0] != "max":
        return max(1, math.ceil(int(v2[0]) / int(v2[1])))
    quota, period = _read(_CGROUP / "cpu" / "cpu.cfs_quota_us"), _read(_CGROUP / "cpu" / "cpu.cfs_period_us")
    if quota.lstrip("-").isdigit() and period.isdigit() and int(quota) > 0:
        return max(1, math.ceil(int(quota) / int(period)))
    return None


def memory_limit() -> int | None:
    """The cgroup's memory limit in bytes (v2, else v1); None without one."""
    v2 = _read(_CGROUP / "memory.max")
    if v2.isdigit():
        return int(v2)
    v1 = _read(_CGROUP / "memory" / "memory.limit_in_bytes")
    return int(v1) if v1.isdigit() and int(v1) < 1 << 60 else None


def usable_cores() -> int:
    """The cores this process may use: its affinity, within its cgroup's CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cores, quota or cores))


def analysis_workers(jobs: int) -> int:
    """Worker processes for `jobs` ranks: cores available, within the memory limit."""
    workers = min(usable_cores(), jobs)
    limit = memory_limit()
    if limit is not None:
        workers = min(workers, max(1, (limit - MAIN_BYTES) // WORKER_BYTES))
    return max(1, workers)


class _Here(Executor):
    """Runs each call at once in this process: the pool of an analysis with one worker."""

    workers = 1

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future, as a pool does
            future.set_exception(exc)
        return future


@contextlib.contextmanager
def _main_not_rerun() -> Iterator[None]:
    """While workers start: a __main__ read from stdin (`python - <<EOF`) or typed in a REPL names
    a file that does not exist ("<stdin>"), which a spawned child would run as a script and die on
    (BrokenProcessPool). The workers run only stepscope's own functions, so such a __main__ is
    hidden from them as `python -c` hides it: no __file__ for the time the workers start."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or getattr(main, "__spec__", None) is not None or path is None or os.path.isfile(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class _Workers(ProcessPoolExecutor):
    """A process pool that says how many workers it has."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, mp_context=multiprocessing.get_context("spawn"))
        self.workers = workers


def pool_workers(pool: Executor) -> int:
    """How many calls `pool` runs at once (1 for an executor that does not say)."""
    return int(getattr(pool, "workers", 1))


@contextlib.contextmanager
def worker_pool(workers: int) -> Iterator[Executor]:
    """A process pool of `workers` (spawned, not forked: the caller may run threads, e.g. an HTTP
    server in tests or a storage client's pool), or this process alone for one. The workers are
    started at once, so that what they inherit of __main__ is settled here."""
    if workers < 2:
        yield _Here()
        return
    with _Workers(workers) as pool:
        with _main_not_rerun():
            # A spawn pool starts a worker per submit while none is idle: one call each starts them all.
            for started in [pool.submit(os.getpid) for _ in range(workers)]:
                started.result()
        yield pool
