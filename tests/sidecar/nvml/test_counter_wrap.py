"""The PCIe byte counters are 32-bit and wrap, as an H100 showed (driver 580: a gloo job wrapped them
every few hundred ms, and each wrap read as -4,300 GB/s in the merged trace's PCIe track)."""

from __future__ import annotations

import pandas as pd

from stepscope.analysis.reporting.gpu_counters import counter_events
from stepscope.analysis.statistics.gpu_steps import counter
from stepscope.gpu_sample_file import PCIE_COUNTER_WRAP, round_fields
from stepscope.testing.nvml.simulated import PCIE_BYTES_PER_US, SimulatedBackend


def pcie_rows(seconds: float) -> pd.DataFrame:
    """A simulated GPU's PCIe counters read every ms for `seconds` of its training loop."""
    now = [0]
    gpu = SimulatedBackend(1, nvlinks=0, origin_us=0, clock_ns=lambda: now[0])
    fields = tuple((field, scope) for _, field, scope in round_fields(0))
    rows = []
    for ms in range(int(seconds * 1000)):
        now[0] = ms * 1_000_000
        tx, rx, _, _ = gpu.field_values(0, fields)
        rows.append({"ts_us": ms * 1000.0, "gpu": 0.0, "pcie_tx_bytes": tx, "pcie_rx_bytes": rx})
    return pd.DataFrame(rows)


def test_the_simulated_counters_wrap_as_a_real_gpus_do() -> None:
    rows = pcie_rows(2.0)  # 0.6 s of communication at 8 GB/s: past 2^32 bytes
    assert rows["pcie_tx_bytes"].max() < PCIE_COUNTER_WRAP and rows["pcie_tx_bytes"].diff().min() < 0


def test_wrapped_counters_read_as_the_bytes_that_went_through() -> None:
    rows = pcie_rows(2.0)
    ts, total = counter(rows, "pcie")
    assert (pd.Series(total).diff().dropna() >= 0).all()
    # tx and rx, 0.599 s of communication by the last read (0.6 s of it by the end of the 2 s)
    assert total[-1] - total[0] == 2 * round(0.599e6 * PCIE_BYTES_PER_US)
    track = [e["args"] for e in counter_events(rows, "pod") if e["name"] == "GPU 0 PCIe (GB/s)"]
    values = [next(iter(args.values())) for args in track]
    assert min(values) >= 0 and max(values) <= 2 * PCIE_BYTES_PER_US / 1e3 + 0.1
