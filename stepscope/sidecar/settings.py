"""What the sidecar reads from the environment (the injected container's env, set by the webhook):
the one module of the sidecar that reads it."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from stepscope.contracts.wire import DEFAULT_DIR, DEFAULT_PORT, DIR_ENV

NATIVE_SAMPLER_ENV = "STEPSCOPE_NATIVE_SAMPLER"
# The variables that say which GPUs the pod's training container sees (nvml.pynvml_backend.visible_device_ids).
DEVICE_VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def shared_dir() -> Path:
    return Path(os.environ.get(DIR_ENV, DEFAULT_DIR))


def port() -> int:
    return int(os.environ.get("STEPSCOPE_PORT", DEFAULT_PORT))


def pod_name() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


def node_name() -> str:
    return os.environ.get("NODE_NAME", "")


def pod_ip() -> str:
    return os.environ.get("POD_IP", "")


def native_sampler() -> str | None:
    """STEPSCOPE_NATIVE_SAMPLER: "0" keeps the NVML sampler in Python; otherwise a backend that offers
    C reads (real NVML, the simulation) is read through the native tier where it is built (it ran
    clean on an H100, benchmarks/gpu_check.py --native, docs/benchmarks.md)."""
    return os.environ.get(NATIVE_SAMPLER_ENV)


def device_visibility() -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES, where set."""
    return {name: os.environ[name] for name in DEVICE_VISIBILITY_ENV if name in os.environ}
