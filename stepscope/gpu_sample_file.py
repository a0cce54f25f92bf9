"""The GPU sample file's vocabulary, shared by the sidecar that writes it and the analysis that
reads it: NVML's field ids and clock-event bits (NVML's own numbers, so that neither side has to
import pynvml) and the columns of gpu-metrics.csv.gz.
"""

from __future__ import annotations

# nvmlFieldValue ids (nvml.h, "Field Value Enums"). One nvmlDeviceGetFieldValues call per device
# and sample reads all of them; scopeId selects the NVLink link for the NVLink fields.
FI_ECC_SBE_VOL_TOTAL = 3
FI_ECC_DBE_VOL_TOTAL = 4
FI_NVLINK_THROUGHPUT_DATA_TX = 138  # cumulative KiB per link
FI_NVLINK_THROUGHPUT_DATA_RX = 139
FI_PCIE_COUNT_TX_BYTES = 197  # cumulative bytes
FI_PCIE_COUNT_RX_BYTES = 198
# The PCIe byte counters are 32-bit and wrap (nvml.h: "Value can be wrapped"): an H100 under a
# gloo job wraps them every few hundred ms. The analysis undoes the wraps before taking deltas.
PCIE_COUNTER_WRAP = 1 << 32

# nvmlClocksEventReason* bits (formerly ClocksThrottleReason*). Idle (0x1), application clocks
# (0x2) and sync boost (0x10) lower clocks on purpose and do not count as throttling.
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
POWER_REASONS = REASON_SW_POWER_CAP | REASON_HW_POWER_BRAKE
THERMAL_REASONS = REASON_SW_THERMAL | REASON_HW_THERMAL
# HW slowdown is asserted for both overheating and power-supply faults: counted as throttling
# without a cause of its own.
THROTTLE_REASONS = POWER_REASONS | THERMAL_REASONS | REASON_HW_SLOWDOWN

# Columns of gpu-metrics.csv.gz, in file order; the NVLink columns follow, two per link
# (nvlink<l>_tx_kib, nvlink<l>_rx_kib). Empty cells mean "not measured in this row": slow metrics
# are read every few milliseconds only, and utilization rows carry the driver's own sample times.
BASE_COLUMNS = (
    "ts_us",  # Unix epoch microseconds, the clock of Kineto's ts + baseTimeNanoseconds/1000
    "gpu",  # CUDA device index inside the pod (order of CUDA_VISIBLE_DEVICES)
    "sm_clock_mhz",
    "mem_clock_mhz",
    "clock_reasons",  # nvmlClocksEventReason bit mask
    "power_w",
    "temperature_c",
    "memory_used_mib",
    "gpu_util_pct",
    "mem_util_pct",
    "pcie_tx_bytes",  # cumulative counters; the analysis turns them into throughput
    "pcie_rx_bytes",
    "ecc_sbe",  # volatile single-bit (corrected) ECC error count
    "ecc_dbe",  # volatile double-bit (uncorrected) ECC error count
    "xid",  # XID code of a critical-error event, on the row of the time it was seen
)


def nvlink_columns(links: int) -> tuple[str, ...]:
    return tuple(f"nvlink{link}_{way}_kib" for link in range(links) for way in ("tx", "rx"))


def round_fields(links: int) -> tuple[tuple[str, int, int], ...]:
    """(column, field id, scope id) of the counters that one nvmlDeviceGetFieldValues call reads
    per GPU and round: PCIe, ECC, then the NVLink links in nvlink_columns' order."""
    nvlink = (
        (
            column,
            FI_NVLINK_THROUGHPUT_DATA_TX if column.endswith("_tx_kib") else FI_NVLINK_THROUGHPUT_DATA_RX,
            index // 2,
        )
        for index, column in enumerate(nvlink_columns(links))
    )
    return (
        ("pcie_tx_bytes", FI_PCIE_COUNT_TX_BYTES, 0),
        ("pcie_rx_bytes", FI_PCIE_COUNT_RX_BYTES, 0),
        ("ecc_sbe", FI_ECC_SBE_VOL_TOTAL, 0),
        ("ecc_dbe", FI_ECC_DBE_VOL_TOTAL, 0),
        *nvlink,
    )
