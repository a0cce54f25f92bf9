"""Achieved sampling rate and CPU cost of the NVML sampler at 100 µs and 1 ms intervals.

    .venv/bin/python benchmarks/nvml_sampler.py                    # simulated 8-GPU node
    .venv/bin/python benchmarks/nvml_sampler.py --backend nvml     # this machine's GPUs

For each interval the sampler runs `--seconds` and the script prints the rounds per second it
achieved against the rate asked (the ratio), the deadlines it dropped, and the CPU it used: the
whole process's CPU time over wall time, next to the same process idling for as long (the idle
reference), and the sampler thread's own CPU time. The "bare" columns are the same sampler on a
node without GPUs, run just before: what the machine's timers and current load allow before any
NVML work; "per GPU" is what each GPU adds to a round on top of that (process CPU - bare CPU,
in µs per GPU and round). Each interval runs twice: with the every-round reads in Python, then in
the native fast tier (sidecar/nvml/fast_sampler.c, where `make` built it and the backend offers its
reads as C functions: the simulation always, real NVML with STEPSCOPE_NATIVE_SAMPLER=1).
Goal: >= 90 % of the asked rate at 1 ms with < 5 % of one core.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the simulated node lives in tests/

from stepscope.analysis.loading.gpu_samples import read_metrics
from stepscope.sidecar.nvml import MetricsRecorder, NvmlBackend, default_backend
from stepscope.testing.nvml.simulated import SimulatedBackend


def process_cpu_share(seconds: float, recorder: MetricsRecorder | None) -> tuple[float, float]:
    """(process CPU s / wall s, wall s) while the recorder samples, or while idling if None."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if recorder is not None:
        recorder.start()
    time.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu / wall, wall


def bare_scheduler(interval_us: int, seconds: float, out: Path) -> tuple[float, float]:
    """(achieved ratio, process CPU share) of the same sampler on a node without GPUs: what this
    machine's timers and load allow before any NVML work."""
    recorder = MetricsRecorder(SimulatedBackend(0), interval_us, margin_s=0.0)
    share, _ = process_cpu_share(seconds, recorder)
    recorder.stop(out / "bare.csv.gz")
    return recorder.stats.achieved_ratio, share


def measure(backend: NvmlBackend, interval_us: int, seconds: float, out: Path, native: bool) -> dict[str, Any]:
    idle_share, _ = process_cpu_share(seconds / 4, None)
    bare_ratio, bare_cpu = bare_scheduler(interval_us, seconds / 2, out)
    recorder = MetricsRecorder(backend, interval_us, margin_s=0.0, native=native)
    share, _ = process_cpu_share(seconds, recorder)
    started = time.perf_counter()
    path = recorder.stop(out / f"gpu-metrics-{interval_us}us.csv.gz")  # margin 0: stops at once, then writes
    write_s = time.perf_counter() - started
    stats = recorder.stats
    frame = read_metrics(path)
    measured = sorted(c for c in frame.columns if c not in ("ts_us", "gpu") and frame[c].notna().any())
    return {
        "tier": "native" if stats.native else "Python", "interval_us": interval_us, "asked_hz": stats.asked_hz, "achieved_hz": stats.achieved_hz, "ratio": stats.achieved_ratio,
        "dropped": stats.dropped, "rounds": stats.rounds, "process_cpu": share, "idle_cpu": idle_share,
        "bare_ratio": bare_ratio, "bare_cpu": bare_cpu,
        "thread_cpu": stats.cpu_s / stats.wall_s if stats.wall_s else 0.0, "errors": sum(stats.errors.values()),
        "rows": stats.rows, "bytes": path.stat().st_size, "write_s": write_s, "columns": len(measured), "measured": measured,
    }


def per_gpu_us(r: dict[str, Any], gpus: int) -> float:
    """CPU µs each GPU adds to a round, over what the bare scheduler costs."""
    return (r["process_cpu"] - r["bare_cpu"]) * r["interval_us"] / gpus if gpus else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sim", "nvml"), default="sim")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (sim backend)")
    parser.add_argument("--seconds", type=float, default=5.0, help="sampling time per interval")
    parser.add_argument("--intervals", type=int, nargs="+", default=[1000, 100], help="intervals in µs")
    args = parser.parse_args(argv)
    backend = SimulatedBackend(args.gpus) if args.backend == "sim" else default_backend()
    if backend is None:
        print("no NVML GPU here (see the log line above); use --backend sim", file=sys.stderr)
        return 2
    devices = backend.devices()
    print(f"backend {args.backend}: {len(devices)} GPU(s) ({devices[0].name if devices else '-'}), {args.seconds:.1f} s per interval")
    print(f"{'interval':>9} {'tier':>6} {'asked/s':>8} {'achieved/s':>10} {'ratio':>6} {'dropped':>7} {'process CPU':>11} {'idle ref':>8} "
          f"{'sampler threads':>15} {'bare ratio':>10} {'bare CPU':>8} {'per GPU':>9} {'errors':>6} {'rows':>8} {'file':>9} {'write s':>7}")
    verdicts, r = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for interval in args.intervals:
            # The Python tier, then the native one (where it is built and the backend offers it): a ratio in one run.
            for native in (False, True):
                r = measure(backend, interval, args.seconds, Path(tmp), native)
                if native and r["tier"] == "Python":
                    break
                print(f"{interval:>7}us {r['tier']:>6} {r['asked_hz']:>8.0f} {r['achieved_hz']:>10.0f} {r['ratio']:>6.1%} {r['dropped']:>7.0f} "
                      f"{r['process_cpu']:>11.1%} {r['idle_cpu']:>8.1%} {r['thread_cpu']:>15.1%} {r['bare_ratio']:>10.1%} {r['bare_cpu']:>8.1%} "
                      # The bare reference is the Python loop's: a per-GPU figure over it means nothing for the C one.
                      f"{f'{per_gpu_us(r, len(devices)):.1f}us' if r['tier'] == 'Python' else '-':>9} "
                      f"{r['errors']:>6.0f} {r['rows']:>8.0f} "
                      f"{r['bytes'] / 1024:>7.0f}KiB {r['write_s']:>7.2f}")
                if interval == 1000:
                    verdicts.append(f"goal at 1 ms (>= 90 % of the rate, < 5 % of a core), {r['tier']} tier: rate "
                                    f"{'met' if r['ratio'] >= 0.9 else 'NOT met'} ({r['ratio']:.1%}), CPU "
                                    f"{'met' if r['process_cpu'] < 0.05 else 'NOT met'} ({r['process_cpu']:.1%}; the bare Python "
                                    f"sampler's wake-ups alone cost {r['bare_cpu']:.1%} on this machine)")
        print(f"metrics with values ({r['columns']}): {', '.join(r['measured'])}")
        print("\n".join(verdicts))
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
