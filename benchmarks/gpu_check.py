"""The real-GPU check of the hardware metrics and the diagnosis, in one command on a machine with an
NVIDIA GPU:

    python benchmarks/gpu_check.py [--interval-us 100 --interval-us 1000] [--ranks 2] [--steps 8]
                                   [--slow-rank 1 --slow-ms 10] [--out DIR] [--native]
    python benchmarks/gpu_check.py --simulate      # the same path on the CPU and a simulated GPU

`--ranks` processes of benchmarks/gpu_workload.py (a DDP job over gloo that knows nothing of
stepscope, every rank on the same GPU) run with the agent (through the bootstrap), beside a
sidecar that samples the GPU through real NVML; for each `--interval-us`, `stepscope capture
--analyze` captures `--steps` steps of the same ranks with hardware metrics at that interval.
With `--slow-rank`, that rank's spin kernel runs `--slow-ms` longer each step. Per capture the
script prints the sampler's achieved rate, the metrics NVML returned values for and those it
refused, the merged Perfetto trace's counter tracks (events, least and greatest value), the
hardware findings, the diagnosis and the kernels' efficiency against the device's peak, and writes
them to DIR/gpu-check.json (the captured sessions stay in DIR/session-<interval>us).
Without CUDA or NVML it says so and exits 2; --simulate runs the same path with CPU ranks and
the simulated backend, to check the script where no GPU is lent. Without --native the sampler
runs in Python (STEPSCOPE_NATIVE_SAMPLER=0), with it through the native fast tier (the default
where it is built): run it once with and once without, and compare.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the simulated node lives in tests/

from stepscope.analysis.loading.gpu_samples import read_metrics
from stepscope.contracts import layout
from stepscope.local import capture
from stepscope.local.launch import LocalJob, launch_ranks
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar.nvml import NvmlBackend, default_backend
from stepscope.testing.nvml.simulated import SimulatedBackend

POD = "gpu-check"
WORKLOAD = Path(__file__).with_name("gpu_workload.py")


class _Said(logging.Handler):
    """Keeps the sampler's log lines (its statistics, what the GPU does not support)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _cuda_ready() -> str | None:
    """Why this machine cannot run the check, or None."""
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "True":
        return (
            "torch sees no CUDA device here "
            f"({(probe.stderr.strip().splitlines() or ['torch.cuda.is_available() is False'])[-1]})"
        )
    return None


def _wait_for_steps(run_dir: Path, job: LocalJob, ranks: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    registries = [run_dir / "agents" / f"rank-{rank}.json" for rank in range(ranks)]
    while time.monotonic() < deadline:
        codes = [p.poll() for p in job.processes]
        if any(code is not None for code in codes):
            raise RuntimeError(f"a training rank exited (codes {codes}); its log is in {job.logs}")
        try:
            if all(json.loads(r.read_text()).get("step", 0) > 3 for r in registries):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the training ranks did not register with the agent in {timeout_s:.0f} s ({registries})")


def counter_tracks(session: Path) -> dict[str, dict[str, float]]:
    """Per counter track of the merged trace: its events and the least and greatest value."""
    merged = session / "report" / "merged.trace.json.gz"
    if not merged.is_file():
        return {}
    tracks: dict[str, dict[str, float]] = {}
    for event in json.loads(gzip.decompress(merged.read_bytes())).get("traceEvents", []):
        if event.get("ph") != "C":
            continue
        values = [v for v in (event.get("args") or {}).values() if isinstance(v, (int, float))]
        track = tracks.setdefault(event["name"], {"count": 0, "min": float("inf"), "max": float("-inf")})
        track["count"] += 1
        if values:
            track["min"], track["max"] = min(track["min"], *values), max(track["max"], *values)
    return {name: tracks[name] for name in sorted(tracks)}


def _rates(metrics: Any, interval_us: int) -> dict[str, dict[str, float]]:
    """Per GPU: rounds a second over the span of its clock rows, against the asked rate."""
    out = {}
    for gpu, rows in metrics.dropna(subset=["sm_clock_mhz"]).groupby("gpu"):
        span_s = (rows["ts_us"].max() - rows["ts_us"].min()) / 1e6
        achieved = (len(rows) - 1) / span_s if span_s > 0 else 0.0
        out[str(int(gpu))] = {
            "rows": len(rows),
            "seconds": round(span_s, 3),
            "achievedHz": round(achieved, 1),
            "askedHz": 1e6 / interval_us,
            "ratio": round(achieved * interval_us / 1e6, 4),
        }
    return out


def _kernel_efficiency(session: Path, top: int = 3) -> list[dict[str, Any]]:
    """The kernels of most GPU time with FLOPs from their ops' shapes, against the device's peak."""
    table = session / "report" / "kernel_efficiency.csv"
    if not table.is_file():
        return []
    import pandas as pd

    frame = pd.read_csv(table)
    kernels = frame[(frame["Kind"] == "kernel") & (frame["FLOPs"] > 0)].sort_values("GPU Time(us)", ascending=False)
    columns = ["Rank", "Short Name", "Dtype", "Input Dims", "TFLOP/s", "Peak TFLOP/s", "% of Roofline", "Device"]
    return json.loads(kernels.head(top)[columns].to_json(orient="records"))


def _capture(sidecar_url: str, key: str, session: Path, interval_us: int, steps: int) -> int:
    os.environ["STEPSCOPE_HMAC_KEY"] = key
    parser = argparse.ArgumentParser(prog="stepscope capture")
    capture.add_arguments(parser)
    arguments = ["--wait", "3", "--steps", str(steps), "--output-dir", str(session), "--analyze"]
    arguments += ["--sidecar", sidecar_url, "--metrics-interval-us", str(interval_us), "--timeout", "300"]
    return capture.run(parser.parse_args(arguments))


def _read_out(session: Path, interval_us: int, sampler: list[str]) -> dict[str, Any]:
    metrics = read_metrics(session / layout.node_metrics(POD))
    diagnosis = json.loads((session / "report" / "diagnosis.json").read_text())
    return {
        "intervalUs": interval_us,
        "rates": _rates(metrics, interval_us),
        "metricsWithValues": sorted(
            c for c in metrics.columns if c not in ("ts_us", "gpu") and metrics[c].notna().any()
        ),
        "metricsWithoutValues": sorted(c for c in metrics.columns if metrics[c].isna().all()),
        "counterTracks": counter_tracks(session),
        "hardwareFindings": [f["message"] for f in diagnosis["findings"] if f["category"] == "hardware"],
        "diagnosis": [f"[{f['severity']}/{f['category']}] {f['message']}" for f in diagnosis["findings"][:8]],
        "kernelEfficiency": _kernel_efficiency(session),
        "sampler": [line for line in sampler if "GPU metrics" in line or "not support" in line or "NVML" in line],
    }


def run(args: argparse.Namespace) -> int:
    os.environ["STEPSCOPE_NATIVE_SAMPLER"] = "1" if args.native else "0"
    backend: NvmlBackend | None
    if args.simulate:
        backend, device = SimulatedBackend(1), "cpu"
    else:
        reason = _cuda_ready()
        backend = default_backend() if reason is None else None
        if backend is None:
            print(
                f"gpu_check: no GPU to check: {reason or 'NVML sees no GPU (see the log line above)'}; "
                "--simulate runs the same path on the CPU",
                file=sys.stderr,
            )
            return 2
        device = "cuda"
    out = (args.out or Path(tempfile.mkdtemp(prefix="stepscope-gpu-check-"))).resolve()
    run_dir = out / "shared"
    run_dir.mkdir(parents=True, exist_ok=True)
    said = _Said()
    logging.getLogger("stepscope.sidecar").addHandler(said)
    logging.getLogger("stepscope.sidecar").setLevel(logging.INFO)
    key = secrets.token_hex(32)
    # This machine's GPUs are the user's: the simulated one is kept though the CPU ranks name none.
    sidecar = Sidecar(
        run_dir,
        key.encode(),
        host="127.0.0.1",
        port=0,
        pod=POD,
        nvml_backend=backend,
        poll_interval_s=0.1,
        own_every_gpu=True,
    ).start()
    workload = ["--device", device, "--spin-ms", str(args.spin_ms)]
    if args.slow_rank is not None:
        workload += ["--slow-rank", str(args.slow_rank), "--slow-ms", str(args.slow_ms)]
    job = launch_ranks(args.ranks, run_dir, workload, log_dir=out / "logs", workload=WORKLOAD)
    captures, code = [], 0
    try:
        _wait_for_steps(run_dir, job, args.ranks, 120)
        for interval_us in args.interval_us or [100]:
            session, first_line = out / f"session-{interval_us}us", len(said.lines)
            code = _capture(sidecar.url, key, session, interval_us, args.steps)
            if code != 0:
                print(f"gpu_check: the capture ended with code {code}; the session is in {session}", file=sys.stderr)
                break
            captures.append(_read_out(session, interval_us, said.lines[first_line:]))
    except RuntimeError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        code = 1
    finally:
        job.terminate()
        sidecar.shutdown(5)
        devices = backend.devices()
        backend.close()
    result = {
        "device": "simulated" if args.simulate else (devices[0].name if devices else "?"),
        "ranks": args.ranks,
        "slowRank": args.slow_rank,
        "slowMs": args.slow_ms if args.slow_rank is not None else 0.0,
        "native": args.native,
        "captures": captures,
    }
    (out / "gpu-check.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"written to {out / 'gpu-check.json'}; the captured sessions are in {out}")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--interval-us",
        type=int,
        action="append",
        help="NVML sampling interval, one capture each (repeatable; default 100)",
    )
    parser.add_argument("--steps", type=int, default=8, help="steps to capture (default %(default)s)")
    parser.add_argument("--ranks", type=int, default=2, help="training processes (default %(default)s)")
    parser.add_argument("--spin-ms", type=float, default=1.0, help="every rank's spin kernel a step")
    parser.add_argument("--slow-rank", type=int, default=None, help="the rank whose spin kernel runs longer")
    parser.add_argument("--slow-ms", type=float, default=10.0, help="how much longer (default %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a new temporary one)")
    parser.add_argument(
        "--simulate", action="store_true", help="CPU ranks and simulated GPU: check the script without a GPU"
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="sample through the native fast tier (else in Python, STEPSCOPE_NATIVE_SAMPLER=0)",
    )
    # A time limit's SIGTERM ends the script through its cleanup, so that no rank keeps the GPU.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
