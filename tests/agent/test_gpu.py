"""On a machine with a GPU: CUDA activities end up in the trace (kernels on the GPU's streams)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.contracts.wire import GPU_KEY
from stepscope.sidecar.bootstrap import install_bootstrap, training_env
from tests.agent.protocol import load_trace_document, wait_for_state, write_request

CUDA_LOOP = """
import torch
x = torch.randn(512, 512, device="cuda", requires_grad=True)
opt = torch.optim.SGD([x], lr=0.0)
for _ in range(200):
    (x @ x).sum().backward()
    opt.step()
    torch.cuda.synchronize()
"""


def cuda_available() -> bool:
    if not Path("/dev/nvidiactl").exists():
        return False
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    )
    return probe.stdout.strip() == "True"


@pytest.mark.gpu
def test_cuda_kernels_are_captured(stepscope_dir: Path, tmp_path: Path) -> None:
    if not cuda_available():
        pytest.skip("no CUDA device in this torch build or machine")
    install_bootstrap(stepscope_dir)
    write_request(stepscope_dir, "s-gpu", waitSteps=2, steps=3)
    script = tmp_path / "cuda_loop.py"
    script.write_text(CUDA_LOOP)
    env = {**training_env(stepscope_dir), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120)
    state = wait_for_state(stepscope_dir, "s-gpu", 0, ("done",), timeout=10)
    assert "CUDA was asked for" not in state["message"]
    document = load_trace_document(stepscope_dir / "s-gpu" / state["trace"])
    events = document["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
    # What the sidecar matches against NVML's UUIDs, 'GPU-' prefix aside.
    assert state["gpu"] == 0 and state["gpuUuid"], state
    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    try:
        nvml_uuids = [
            pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()
    bare = {str(u.decode() if isinstance(u, bytes) else u).lower().removeprefix("gpu-") for u in nvml_uuids}
    assert state["gpuUuid"].lower().removeprefix("gpu-") in bare, (state["gpuUuid"], nvml_uuids)
    # The same GPU in the trace, where the diagnosis tells ranks that share one.
    assert document[GPU_KEY] == {"index": 0, "uuid": state["gpuUuid"]}, document.get(GPU_KEY)


class _Properties:
    uuid = "8c1e0b0a-5d6f-4a2b-9c3d-112233445566"


class _Cuda:
    """Stands in for torch.cuda: counts the calls that would create a CUDA context."""

    def __init__(self, initialized: bool) -> None:
        self.initialized, self.calls = initialized, 0

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        self.calls += 1
        return 3

    def get_device_properties(self, index: int) -> _Properties:
        self.calls += 1
        return _Properties()


def test_the_agent_names_the_gpu_only_once_the_program_initialised_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.agent.torch_hooks import cuda_device

    monkeypatch.delitem(sys.modules, "torch.cuda", raising=False)
    assert cuda_device() == (-1, "")  # torch not imported: nothing to ask
    cuda = _Cuda(initialized=False)
    monkeypatch.setitem(sys.modules, "torch.cuda", cuda)
    assert cuda_device() == (-1, "") and cuda.calls == 0
    cuda.initialized = True
    assert cuda_device() == (3, "8c1e0b0a-5d6f-4a2b-9c3d-112233445566")
    monkeypatch.setattr(_Cuda, "current_device", lambda self: 1 / 0)
    assert cuda_device() == (-1, "")  # never raises into training
