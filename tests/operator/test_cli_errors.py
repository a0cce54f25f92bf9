"""`stepscope get` and `stepscope report` without a usable cluster: one line that says what to fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.local.launch import free_port


def _stepscope(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run(
        [sys.executable, "-m", "stepscope.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=kubeconfig.parent,
    )


@pytest.mark.parametrize("command", [("get",), ("report", "my-session", "-n", "training")])
def test_missing_kubeconfig_is_one_clear_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    result = _stepscope(*command, kubeconfig=tmp_path / "absent.yaml")
    assert result.returncode == 1
    assert f"stepscope {command[0]}: no Kubernetes configuration" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_api_server_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig.yaml"
    config.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{free_port()}"}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
users: [{{name: u, user: {{token: not-a-secret}}}}]
""")
    result = _stepscope("get", kubeconfig=config)
    assert result.returncode == 1
    assert "stepscope get: the API server is unreachable" in result.stderr
    assert "Traceback" not in result.stderr
