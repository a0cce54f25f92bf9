"""How many worker processes an analysis runs: cores it may use, its cgroup's CPU quota and memory
limit (v2 and v1 files as the kernel writes them), never more than there are ranks."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.analysis.loading import parallel


@pytest.fixture()
def cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(parallel, "_CGROUP", tmp_path)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    return tmp_path


def test_no_cgroup_limits_take_the_cores_up_to_the_ranks(cgroup: Path):
    assert parallel.analysis_workers(8) == 8 and parallel.analysis_workers(100) == 16 and parallel.analysis_workers(0) == 1


def test_cgroup_v2_quota_and_memory_bound_the_workers(cgroup: Path):
    (cgroup / "cpu.max").write_text("max 100000\n")
    (cgroup / "memory.max").write_text("max\n")
    assert parallel.analysis_workers(32) == 16
    (cgroup / "cpu.max").write_text("250000 100000\n")  # 2.5 cores: 3 processes share them
    assert parallel.analysis_workers(32) == 3
    (cgroup / "memory.max").write_text(f"{2 << 30}\n")  # the chart's 2Gi
    assert parallel.analysis_workers(32) == min(3, ((2 << 30) - parallel.MAIN_BYTES) // parallel.WORKER_BYTES)
    (cgroup / "memory.max").write_text(f"{parallel.MAIN_BYTES}\n")
    assert parallel.analysis_workers(32) == 1


def test_cgroup_v1_files(cgroup: Path):
    (cgroup / "cpu").mkdir()
    (cgroup / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (cgroup / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (cgroup / "memory").mkdir()
    (cgroup / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    assert parallel.cpu_quota() is None and parallel.memory_limit() is None
    (cgroup / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (cgroup / "memory" / "memory.limit_in_bytes").write_text(f"{4 << 30}\n")
    assert parallel.cpu_quota() == 4 and parallel.memory_limit() == 4 << 30 and parallel.analysis_workers(8) == 4


def test_one_worker_runs_in_this_process():
    with parallel.worker_pool(1) as pool:
        assert pool.submit(os.getpid).result() == os.getpid()
        with pytest.raises(ZeroDivisionError):
            pool.submit(divmod, 1, 0).result()


def test_a_pool_started_from_a_script_on_stdin_runs_its_workers(tmp_path: Path):
    """`python - <<EOF` names its __main__ "<stdin>": spawned workers must not try to run that file."""
    script = ("from stepscope.analysis.loading.parallel import worker_pool\n"
              "import os\n"
              "with worker_pool(2) as pool:\n"
              "    pids = {pool.submit(os.getpid).result() for _ in range(4)}\n"
              "print(len(pids - {os.getpid()}) >= 1, __file__)\n")
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "<stdin>"]
