"""On a machine with a GPU: CUDA activities end up in the trace (kernels on the GPU's streams)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.sidecar.bootstrap import install_bootstrap, training_env
from tests.agent.protocol import load_trace, wait_for_state, write_request

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
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True)
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
    events = load_trace(stepscope_dir / "s-gpu" / state["trace"])
    assert any(e.get("cat") == "kernel" for e in events)
