"""stepscope's per-rank summaries (+ cross-rank diagnosis) against Holistic Trace Analysis on one trace set.

Both run as child processes on the same files in the same run; each side's peak memory is the
largest sum of RSS over its process tree, sampled from /proc every 20 ms.

  HTA:       /work/shared/tools/run_hta.py DIR --mode full: TraceAnalysis(trace_dir=DIR) plus its
             temporal, idle-time, kernel, overlap and launch analyses (HTA 0.5.0 in its own virtual
             environment, created once under ~/.cache/stepscope/hta-venv: HTA pulls Jupyter and
             needs pandas < 3).
  stepscope: summarize_file on every rank (a pool of --workers processes), then diagnose().

Make the set once (8 ranks x ~286 MB, rank 5 slowed), outside the repository:
  python3 /work/shared/tools/make_scaled_trace.py --out /tmp/scaled_8rank
  .venv/bin/python benchmarks/analysis_vs_hta.py /tmp/scaled_8rank
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

RUN_HTA = Path(os.environ.get("STEPSCOPE_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "tools/run_hta.py"
HTA_VENV = Path.home() / ".cache" / "stepscope" / "hta-venv"


def tree_rss_bytes(root: int) -> int:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


def measure(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS of the process tree, stdout) of a command.

    CPU seconds (user + system of the whole tree) matter on a shared machine, where wall time
    also counts the waits for a core."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_bytes(proc.pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = proc.communicate()[0]
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, peak, out


def ensure_hta_venv() -> Path:
    python = HTA_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating HTA's virtual environment in {HTA_VENV} (once; HTA pulls Jupyter)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "holistictraceanalysis", "pandas<3"], check=True)
    return python


def _summarize(path: str) -> tuple[str, float, float, bytes]:
    from stepscope.analysis.model import encode
    from stepscope.analysis.summary import summarize_file
    wall, cpu = time.perf_counter(), time.process_time()
    summary = summarize_file(path)
    return path, time.perf_counter() - wall, time.process_time() - cpu, encode(summary)


def stepscope_side(trace_dir: Path, workers: int) -> None:
    """The measured child: summarise every rank, then diagnose across ranks; print one JSON line."""
    from multiprocessing import get_context

    from stepscope.analysis.model import decode_summary
    files = sorted(str(p) for p in trace_dir.iterdir() if p.name.endswith((".json", ".json.gz")))
    start = time.perf_counter()
    with get_context("fork").Pool(workers) as pool:
        results = pool.map(_summarize, files, chunksize=1)
    summaries = [decode_summary(r[3]) for r in results]
    summarised = time.perf_counter() - start
    diagnosis = ""
    try:
        from stepscope.analysis.diagnose import diagnose
    except ImportError:
        pass
    else:
        diagnosis = diagnose(summaries)[0].summary
    print(json.dumps({
        "summarise_s": summarised, "total_s": time.perf_counter() - start, "diagnosis": diagnosis,
        "errors": [s.error for s in summaries if s.error],
        "per_rank": [{"file": Path(r[0]).name, "wall_s": r[1], "cpu_s": r[2]} for r in results]}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir", type=Path, nargs="?", default=Path("/tmp/scaled_8rank"))
    ap.add_argument("--workers", type=int, default=2, help="stepscope processes summarising ranks in parallel")
    ap.add_argument("--skip-hta", action="store_true", help="measure stepscope only")
    ap.add_argument("--stepscope-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.stepscope_child:
        stepscope_side(a.trace_dir, a.workers)
        return 0
    if not a.trace_dir.is_dir():
        raise SystemExit(f"{a.trace_dir} not found; make it with python3 /work/shared/tools/make_scaled_trace.py "
                         f"--out {a.trace_dir}")
    files = [p for p in a.trace_dir.iterdir() if p.name.endswith((".json", ".json.gz"))]
    size = sum(p.stat().st_size for p in files)
    print(f"set: {a.trace_dir} ({len(files)} ranks, {size / 1e6:.0f} MB); {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} (the machine is shared: figures vary with it)", flush=True)
    for p in files:  # both sides read from the page cache
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass
    ss_wall, ss_cpu, ss_peak, out = measure([sys.executable, __file__, str(a.trace_dir), "--workers", str(a.workers),
                                     "--stepscope-child"])
    result = json.loads(out.strip().splitlines()[-1])
    for r in result["per_rank"]:
        print(f"  stepscope {r['file']}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU")
    print(f"stepscope: {ss_wall:.1f} s wall, {ss_cpu:.1f} s CPU ({result['summarise_s']:.1f} s summarising "
          f"{len(files)} ranks on {a.workers} workers + diagnosis), peak {ss_peak / 2**20:.0f} MiB; "
          f"errors: {result['errors'] or 'none'}")
    print(f"  diagnosis: {result['diagnosis']}")
    if a.skip_hta:
        return 0
    python = ensure_hta_venv()
    hta_wall, hta_cpu, hta_peak, out = measure([str(python), str(RUN_HTA), str(a.trace_dir), "--mode", "full"])
    summary = next((json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                    if line.startswith("HTA_RUN_SUMMARY ")), {})
    construct = summary.get("timings_s", {}).get("construct", float("nan"))
    print(f"HTA 0.5.0: {hta_wall:.1f} s wall, {hta_cpu:.1f} s CPU (construction {construct:.1f} s + five analyses), "
          f"peak {hta_peak / 2**20:.0f} MiB; errors: {summary.get('errors') or 'none'}")
    print(f"ratio: stepscope is {hta_wall / ss_wall:.1f}x faster in wall time, {hta_cpu / ss_cpu:.1f}x in CPU time, "
          f"and uses {ss_peak / hta_peak:.2f} of HTA's peak memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
