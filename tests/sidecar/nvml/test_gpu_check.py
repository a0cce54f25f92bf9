"""benchmarks/gpu_check.py, the one-command real-GPU check, kept working where no GPU is lent:
its --simulate path runs the same capture, analysis and read-out on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_gpu_check_reads_out_rate_metrics_tracks_and_findings(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_check.py"),
            "--simulate",
            "--interval-us",
            "1000",
            "--steps",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check = json.loads((tmp_path / "gpu-check.json").read_text())
    assert check["device"] == "simulated" and check["ranks"] == 2 and len(check["captures"]) == 1
    check = check["captures"][0]
    assert check["intervalUs"] == 1000
    assert check["rates"]["0"]["rows"] > 100 and 0 < check["rates"]["0"]["ratio"] <= 1.01
    assert {"sm_clock_mhz", "power_w", "pcie_tx_bytes", "nvlink0_tx_kib"} <= set(check["metricsWithValues"])
    assert check["counterTracks"]["GPU 0 PCIe (GB/s)"]["count"] > 100
    assert "GPU 0 SM clock (MHz)" in check["counterTracks"]
    assert check["diagnosis"]
    assert any(line.startswith("GPU metrics: ") for line in check["sampler"])
