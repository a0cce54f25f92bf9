"""GPU hardware metrics for a capture window: what the sidecar imports.

    backend = default_backend()            # None where there is no NVML or no GPU (logged once)
    if backend is not None:
        recorder = MetricsRecorder(backend, spec.hardwareMetrics.intervalMicroseconds)
        recorder.start()                   # when the capture is requested
        ...                                # the ranks capture their steps
        recorder.stop(out_dir / METRICS_FILE)   # samples margin_s more, writes gpu-metrics.csv.gz

The file's columns are stepscope.gpu_sample_file.BASE_COLUMNS plus two per NVLink link; `ts_us` is Unix epoch
microseconds, the clock of Kineto's `ts` + `baseTimeNanoseconds` / 1000, so samples line up with
the trace. stepscope.analysis.loading.gpu_samples reads the file.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from stepscope.sidecar.nvml.api import BackendError, DeviceInfo, NvmlBackend
from stepscope.sidecar.nvml.recorder import METRICS_FILE, MIN_INTERVAL_US, MetricsRecorder, RecorderStats

__all__ = [
    "METRICS_FILE",
    "MIN_INTERVAL_US",
    "BackendError",
    "DeviceInfo",
    "MetricsRecorder",
    "NvmlBackend",
    "RecorderStats",
    "default_backend",
]

log = logging.getLogger(__name__)
_said_absent = threading.Event()


def default_backend(env: Mapping[str, str] | None = None) -> NvmlBackend | None:
    """NVML for this pod's GPUs, or None (said once in the log) where pynvml, the NVML library,
    the driver or a visible GPU is missing. `env` replaces os.environ for device visibility."""
    try:
        from stepscope.sidecar.nvml.pynvml_backend import PynvmlBackend

        backend = PynvmlBackend(env)
    except ImportError as error:
        _absent(f"pynvml is not installed ({error})")
        return None
    except BackendError as error:
        _absent(f"NVML is not usable here ({error})")
        return None
    if not backend.devices():
        backend.close()
        _absent("NVML sees no GPU visible to this pod")
        return None
    return backend


def _absent(reason: str) -> None:
    if not _said_absent.is_set():
        _said_absent.set()
        log.info("no GPU hardware metrics: %s", reason)
