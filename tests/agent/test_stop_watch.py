"""The agent's stop watch (agent/stop_watch.c through schedstat.StopWatch) in this process: it
counts a stop of the whole process, not the machine's load, its thread ends when it is stopped, and
a library that cannot be loaded leaves the counters without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.agent import schedstat
from stepscope.agent.schedstat import SchedClock, StopWatch
from stepscope.contracts.wire import STOPPED_KEY
from tests.agent.protocol import needs_stop_watch


def _threads() -> list[str]:
    return [p.read_text().strip() for p in Path(f"/proc/{os.getpid()}/task").glob("*/comm")]


@pytest.fixture
def watch():
    started = StopWatch.start()
    assert started is not None
    yield started
    started.stop()


def _stopped_ns(watch: StopWatch) -> int:
    read = watch.read()
    assert read is not None
    return read[0] - read[1]


@needs_stop_watch
def test_a_stop_of_the_process_is_counted_and_a_busy_machine_is_not(watch: StopWatch) -> None:
    assert "stepscope-stops" in _threads()
    # Busy processes, more than the CPUs and (as root) favoured by the scheduler: the watch waits in
    # the run queue, 80-90 ms of the 0.5 s here, which it takes out.
    spin = (
        "import os, time\nif os.geteuid() == 0: os.nice(-15)\n"
        "end = time.monotonic() + 0.5\nwhile time.monotonic() < end: pass\n"
    )
    before = _stopped_ns(watch)
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1))]
    for process in busy:
        process.wait(10)
    loaded = _stopped_ns(watch) - before
    # Another process stops this one 3 times for 100 ms.
    stopper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, signal, sys, time\n"
            "for _ in range(3):\n"
            "    os.kill(int(sys.argv[1]), signal.SIGSTOP); time.sleep(0.1)\n"
            "    os.kill(int(sys.argv[1]), signal.SIGCONT); time.sleep(0.1)\n",
            str(os.getpid()),
        ]
    )
    before = _stopped_ns(watch)
    stopper.wait(10)
    stopped = _stopped_ns(watch) - before
    assert loaded < 50e6 and stopped > 250e6, (loaded, stopped)
    watch.stop()
    assert "stepscope-stops" not in _threads()


def test_a_library_that_cannot_be_loaded_leaves_the_counters_without_it(tmp_path: Path, monkeypatch) -> None:
    broken = tmp_path / "_stop_watch.so"
    broken.write_bytes(b"not a shared object")
    monkeypatch.setattr(schedstat, "STOP_WATCH_LIBRARY", broken)
    assert StopWatch.start() is None
    clock = SchedClock.of_this_thread()
    if clock is None:
        pytest.skip("no schedstat here")
    clock.mark(1)
    clock.mark(2)
    clock.close()
    assert STOPPED_KEY not in clock.metadata()


@needs_stop_watch
def test_a_child_forked_while_the_watch_runs_starts_its_own(watch: StopWatch) -> None:
    # The child has no thread of its parent's but its flag that one runs (a rank forked from a
    # process that was capturing).
    pid = os.fork()
    if pid == 0:
        child = StopWatch.start()
        os._exit(0 if child is not None and "stepscope-stops" in _threads() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
