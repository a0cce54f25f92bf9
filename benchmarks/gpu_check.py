"""The real-GPU check of the hardware metrics, in one command on a machine with an NVIDIA GPU:

    python benchmarks/gpu_check.py [--interval-us 100] [--steps 5] [--out DIR] [--native]
    python benchmarks/gpu_check.py --simulate      # the same path on the CPU and a simulated GPU

A CUDA training loop that knows nothing of stepscope runs with the agent (through the bootstrap),
beside a sidecar that samples the GPU through real NVML; `stepscope capture --analyze` captures
`--steps` steps with hardware metrics every `--interval-us`. Then the script prints what the
hardware-metrics issue asks to record: the sampler's achieved rate at that interval, the metrics
NVML returned values for, the counter tracks of the merged Perfetto trace, and the hardware
findings, and writes them to DIR/gpu-check.json (the captured session stays in DIR/session).
Without CUDA or NVML it says so and exits 2; --simulate runs the same path with a CPU loop and
the simulated backend, to check the script where no GPU is lent. --native samples real NVML
through the native fast tier (STEPSCOPE_NATIVE_SAMPLER=1; it is off for real NVML until such a
run has checked it): run it once with and once without, and compare.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import secrets
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
from stepscope.sidecar.bootstrap import install_bootstrap, training_env
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar.nvml import NvmlBackend, default_backend
from stepscope.testing.nvml.simulated import SimulatedBackend

POD = "gpu-check"
LOOP = """
import sys, torch
device = sys.argv[1]
width, batch = (512, 64) if device == "cpu" else (4096, 8192)
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(batch, width, device=device)
while True:
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if device != "cpu":
        torch.cuda.synchronize()
"""


class _Said(logging.Handler):
    """Keeps the sampler's log lines (its statistics, what the GPU does not support)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _cuda_ready() -> str | None:
    """Why this machine cannot run the check, or None."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True)
    if probe.stdout.strip() != "True":
        return f"torch sees no CUDA device here ({(probe.stderr.strip().splitlines() or ['torch.cuda.is_available() is False'])[-1]})"
    return None


def _wait_for_steps(run_dir: Path, loop: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    registry = run_dir / "agents" / "rank-0.json"
    while time.monotonic() < deadline:
        if loop.poll() is not None:
            raise RuntimeError(f"the training loop exited with code {loop.returncode}")
        try:
            if json.loads(registry.read_text()).get("step", 0) > 3:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the training loop did not register with the agent in {timeout_s:.0f} s ({registry})")


def _counter_tracks(session: Path) -> list[str]:
    merged = session / "report" / "merged.trace.json.gz"
    if not merged.is_file():
        return []
    events = json.loads(gzip.decompress(merged.read_bytes())).get("traceEvents", [])
    return sorted({e["name"] for e in events if e.get("ph") == "C"})


def _rates(metrics: Any, interval_us: int) -> dict[str, dict[str, float]]:
    """Per GPU: rounds a second over the span of its clock rows, against the asked rate."""
    out = {}
    for gpu, rows in metrics.dropna(subset=["sm_clock_mhz"]).groupby("gpu"):
        span_s = (rows["ts_us"].max() - rows["ts_us"].min()) / 1e6
        achieved = (len(rows) - 1) / span_s if span_s > 0 else 0.0
        out[str(int(gpu))] = {"rows": len(rows), "seconds": round(span_s, 3), "achievedHz": round(achieved, 1),
                              "askedHz": 1e6 / interval_us, "ratio": round(achieved * interval_us / 1e6, 4)}
    return out


def run(args: argparse.Namespace) -> int:
    if args.native:
        os.environ["STEPSCOPE_NATIVE_SAMPLER"] = "1"
    backend: NvmlBackend | None
    if args.simulate:
        backend, device = SimulatedBackend(1), "cpu"
    else:
        reason = _cuda_ready()
        backend = default_backend() if reason is None else None
        if backend is None:
            print(f"gpu_check: no GPU to check: {reason or 'NVML sees no GPU (see the log line above)'}; "
                  "--simulate runs the same path on the CPU", file=sys.stderr)
            return 2
        device = "cuda"
    out = (args.out or Path(tempfile.mkdtemp(prefix="stepscope-gpu-check-"))).resolve()
    run_dir, session = out / "shared", out / "session"
    run_dir.mkdir(parents=True, exist_ok=True)
    install_bootstrap(run_dir)
    said = _Said()
    logging.getLogger("stepscope.sidecar").addHandler(said)
    logging.getLogger("stepscope.sidecar").setLevel(logging.INFO)
    key = secrets.token_hex(32)
    # This machine's GPUs are the user's: the simulated one is kept though the CPU loop names none.
    sidecar = Sidecar(run_dir, key.encode(), host="127.0.0.1", port=0, pod=POD, nvml_backend=backend, poll_interval_s=0.1,
                      own_every_gpu=True).start()
    env = {**training_env(run_dir), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    loop = subprocess.Popen([sys.executable, "-c", LOOP, device], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_steps(run_dir, loop, 120)
        os.environ["STEPSCOPE_HMAC_KEY"] = key
        parser = argparse.ArgumentParser(prog="stepscope capture")
        capture.add_arguments(parser)
        code = capture.run(parser.parse_args(["--wait", "3", "--steps", str(args.steps), "--output-dir", str(session), "--analyze",
                                              "--sidecar", sidecar.url, "--metrics-interval-us", str(args.interval_us), "--timeout", "300"]))
    except RuntimeError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 1
    finally:
        loop.terminate()
        loop.wait(30)
        sidecar.shutdown(5)
        backend.close()
    if code != 0:
        print(f"gpu_check: the capture ended with code {code}; the session is in {session}", file=sys.stderr)
        return code
    metrics = read_metrics(session / layout.node_metrics(POD))
    diagnosis = json.loads((session / "report" / "diagnosis.json").read_text())
    result = {
        "device": "simulated" if args.simulate else (backend.devices()[0].name if backend.devices() else "?"),
        "intervalUs": args.interval_us,
        "rates": _rates(metrics, args.interval_us),
        "metricsWithValues": sorted(c for c in metrics.columns if c not in ("ts_us", "gpu") and metrics[c].notna().any()),
        "metricsWithoutValues": sorted(c for c in metrics.columns if metrics[c].isna().all()),
        "counterTracks": _counter_tracks(session),
        "hardwareFindings": [f["message"] for f in diagnosis["findings"] if f["category"] == "hardware"],
        "sampler": [line for line in said.lines if "GPU metrics" in line or "not support" in line or "NVML" in line],
    }
    (out / "gpu-check.json").write_text(json.dumps(result, indent=2))
    for name, value in result.items():
        print(f"{name}: {json.dumps(value, indent=2) if isinstance(value, (dict, list)) else value}")
    print(f"written to {out / 'gpu-check.json'}; the captured session is in {session}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval-us", type=int, default=100, help="NVML sampling interval (default %(default)s)")
    parser.add_argument("--steps", type=int, default=5, help="steps to capture (default %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a new temporary one)")
    parser.add_argument("--simulate", action="store_true", help="CPU loop and simulated GPU: check the script without a GPU")
    parser.add_argument("--native", action="store_true", help="real NVML through the native fast tier (STEPSCOPE_NATIVE_SAMPLER=1)")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
