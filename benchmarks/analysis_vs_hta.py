"""The whole `stepscope analyze` (and its per-rank summaries alone) against Holistic Trace Analysis
on one trace set, plus the merged trace's write speed against decompression of the same input.

Every side runs as a child process on the same files in the same run (page cache warmed first);
peak memory is the largest sum of RSS over the child's process tree, sampled from /proc every
20 ms; CPU is user + system of the tree. With --repeat N the sides run N times, interleaved.

  HTA:       $STEPSCOPE_SHARED/tools/run_hta.py DIR --mode full: TraceAnalysis(trace_dir=DIR) plus its
             temporal, idle-time, kernel, overlap and launch analyses (HTA 0.5.0 with pandas 2.3.3
             in its own virtual environment, created once under ~/.cache/stepscope/hta-venv: HTA
             pulls Jupyter and breaks on pandas 3).
  analyze:   `stepscope analyze DIR --output TMP` (summaries, diagnosis, CSVs, HTML, merged trace).
  summaries: summarize_file on every rank (a pool of --workers processes), then diagnose().
  merge:     write_merged_trace of the ranks the report held, beside reading (gunzipping) the same
             files, in one process: MB/s of uncompressed JSON per CPU second each.

Make the sets once, outside the repository ($STEPSCOPE_SHARED: the shared folder, ../shared by default):
  python3 $STEPSCOPE_SHARED/tools/make_scaled_trace.py --out /tmp/scaled_8rank
  .venv/bin/python benchmarks/analysis_vs_hta.py /tmp/scaled_8rank --repeat 2
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

RUN_HTA = Path(os.environ.get("STEPSCOPE_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "tools/run_hta.py"
HTA_VENV = Path.home() / ".cache" / "stepscope" / "hta-venv"
HTA_PINS = ["holistictraceanalysis==0.5.0", "pandas==2.3.3"]


def tree_rss(root: int) -> dict[int, int]:
    """RSS in bytes of every process in the tree under `root`."""
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
    rss, todo = {}, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss[pid] = int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return rss


PEAKS: dict[int, int] = {}  # per process of the last command measured: pid -> peak RSS
ROOT = [0]  # its own pid


def measure(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS of the process tree, stdout) of a command.

    CPU seconds (user + system of the whole tree) matter on a shared machine, where wall time
    also counts the waits for a core."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0
    done = threading.Event()
    PEAKS.clear()
    ROOT[0] = proc.pid

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            rss = tree_rss(proc.pid)
            peak = max(peak, sum(rss.values()))
            for pid, value in rss.items():
                PEAKS[pid] = max(PEAKS.get(pid, 0), value)
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
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *HTA_PINS], check=True)
    return python


def _summarize(path: str) -> tuple[str, float, float, bytes]:
    from stepscope.analysis.model import encode
    from stepscope.analysis.statistics.summary import summarize_file
    wall, cpu = time.perf_counter(), time.process_time()
    summary = summarize_file(path)
    return path, time.perf_counter() - wall, time.process_time() - cpu, encode(summary)


def trace_files(trace_dir: Path) -> list[Path]:
    return sorted(p for p in trace_dir.iterdir() if p.name.endswith((".json", ".json.gz")))


def summaries_child(trace_dir: Path, workers: int) -> None:
    """The measured child: summarise every rank, then diagnose across ranks; print one JSON line."""
    from multiprocessing import get_context

    from stepscope.analysis.diagnosis.diagnose import diagnose
    from stepscope.analysis.model import decode_summary
    start = time.perf_counter()
    with get_context("fork").Pool(workers) as pool:
        results = pool.map(_summarize, [str(p) for p in trace_files(trace_dir)], chunksize=1)
    summaries = [decode_summary(r[3]) for r in results]
    summarised = time.perf_counter() - start
    print(json.dumps({
        "summarise_s": summarised, "diagnosis": diagnose(summaries)[0].summary,
        "errors": [s.error for s in summaries if s.error],
        "per_rank": [{"file": Path(r[0]).name, "wall_s": r[1], "cpu_s": r[2]} for r in results]}))


def merge_child(report: Path, trace_dir: Path) -> None:
    """The measured child: read (gunzip) the merged ranks' files, then write the merged trace of the
    same ranks as the report did (same order and limit); print one JSON line."""
    from stepscope.analysis.loading.parallel import worker_pool
    from stepscope.analysis.loading.trace import open_trace
    from stepscope.analysis.reporting.merged_trace import MergePlan, MergeRank, expected_size, write_merged_trace
    merged = json.loads((report / "diagnosis.json").read_text())["mergedTrace"]
    ranks = [MergeRank(h["rank"], trace_dir / h["source"], h["why"], h["shiftUs"], checked=True, size_hint=expected_size(trace_dir / h["source"]))
             for h in merged["held"]]
    start, raw = time.process_time(), 0
    for job in ranks:
        with open_trace(job.path) as f:
            while chunk := f.read(16 << 20):
                raw += len(chunk)
    read_s = time.process_time() - start
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp, worker_pool(1) as here:
        start = time.process_time()
        with open(Path(tmp) / "merged.trace.json.gz", "wb") as out:
            result = write_merged_trace(out, MergePlan(ranks, [], merged["limitBytes"]), pool=here)
        write_s = time.process_time() - start
    print(json.dumps({"input_bytes": raw, "read_s": read_s, "output_bytes": result.bytes, "write_s": write_s, "ranks": result.ranks}))


def _row(name: str, wall: float, cpu: float, peak: int) -> str:
    return f"{name}: {wall:.1f} s wall, {cpu:.1f} s CPU, peak {peak / 2**20:,.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir", type=Path, nargs="?", default=Path("/tmp/scaled_8rank"))
    ap.add_argument("--workers", type=int, default=2, help="processes summarising ranks in the summaries-alone side")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every side, interleaved")
    ap.add_argument("--skip-hta", action="store_true", help="measure stepscope only")
    ap.add_argument("--child", choices=["summaries", "merge"], help=argparse.SUPPRESS)
    ap.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "summaries":
        summaries_child(a.trace_dir, a.workers)
        return 0
    if a.child == "merge":
        merge_child(a.report, a.trace_dir)
        return 0
    if not a.trace_dir.is_dir():
        raise SystemExit(f"{a.trace_dir} not found; make it with python3 $STEPSCOPE_SHARED/tools/make_scaled_trace.py "
                         f"--out {a.trace_dir}")
    files = trace_files(a.trace_dir)
    size = sum(p.stat().st_size for p in files)
    print(f"set: {a.trace_dir} ({len(files)} ranks, {size / 1e6:,.0f} MB on disk); {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} (the machine is shared: compare within a run)", flush=True)
    for p in files:  # every side reads from the page cache
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass
    hta = None if a.skip_hta else ensure_hta_venv()
    stepscope = str(Path(sys.executable).parent / "stepscope")
    for run in range(1, a.repeat + 1):
        print(f"run {run} (load average {os.getloadavg()[0]:.2f})", flush=True)
        out_dir = Path(tempfile.mkdtemp(prefix="stepscope-analyze-"))
        try:
            an = measure([stepscope, "analyze", str(a.trace_dir), "--output", str(out_dir), "--no-progress"])
            document = json.loads((out_dir / "diagnosis.json").read_text())
            merged = document["mergedTrace"]
            main_peak = PEAKS.get(ROOT[0], 0)
            workers = sorted((v for pid, v in PEAKS.items() if pid != ROOT[0]), reverse=True)
            print("  " + _row("stepscope analyze (all outputs)", *an[:3]) + f" (main process {main_peak / 2**20:,.0f} MiB, "
                  f"largest worker {(workers[0] if workers else 0) / 2**20:,.0f} MiB of {len(workers)})")
            print(f"    diagnosis: {an[3].splitlines()[0]}")
            why = "; ".join(f"{h['rank']}: {h['why']}" for h in merged["held"])
            print(f"    merged trace: ranks {merged['ranks']} ({why}), {merged['bytes'] / 1e6:,.0f} MB of JSON "
                  f"(limit {merged['limitBytes'] / 1e6:,.0f} MB), {(out_dir / 'merged.trace.json.gz').stat().st_size / 1e6:,.1f} MB gzipped")
            mg = json.loads(measure([sys.executable, __file__, str(a.trace_dir), "--child", "merge", "--report", str(out_dir)])[3].strip().splitlines()[-1])
            print(f"    merged trace alone, one process, CPU time: {mg['output_bytes'] / 1e6:,.0f} MB of JSON in {mg['write_s']:.1f} s = "
                  f"{mg['output_bytes'] / 1e6 / mg['write_s']:,.0f} MB/s; reading (gunzipping) the same {len(mg['ranks'])} files: "
                  f"{mg['input_bytes'] / 1e6:,.0f} MB in {mg['read_s']:.1f} s = {mg['input_bytes'] / 1e6 / mg['read_s']:,.0f} MB/s")
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        sm = measure([sys.executable, __file__, str(a.trace_dir), "--workers", str(a.workers), "--child", "summaries"])
        result = json.loads(sm[3].strip().splitlines()[-1])
        print("  " + _row(f"stepscope summaries alone ({a.workers} workers) + diagnose", *sm[:3]) +
              f"; per rank {min(r['cpu_s'] for r in result['per_rank']):.1f}-{max(r['cpu_s'] for r in result['per_rank']):.1f} s CPU"
              f"; errors: {result['errors'] or 'none'}")
        if hta is None:
            continue
        ht = measure([str(hta), str(RUN_HTA), str(a.trace_dir), "--mode", "full"])
        summary: dict[str, Any] = next((json.loads(line.split(" ", 1)[1]) for line in ht[3].splitlines() if line.startswith("HTA_RUN_SUMMARY ")), {})
        print("  " + _row("HTA 0.5.0 (construction + five analyses)", *ht[:3]) + f"; errors: {summary.get('errors') or 'none'}")
        print(f"  ratio: analyze is {ht[0] / an[0]:.1f}x faster in wall time, {ht[1] / an[1]:.1f}x in CPU, {an[2] / ht[2]:.2f} of "
              f"HTA's peak memory; summaries alone {ht[0] / sm[0]:.1f}x wall, {sm[2] / ht[2]:.2f} of the memory", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
