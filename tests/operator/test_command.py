"""`stepscope operator` as the Deployment runs it: a process with its liveness endpoint and the
Prometheus /metrics endpoint, handling a session against the test API server."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

from stepscope.local.launch import free_port
from stepscope.testing.kube.fixtures import Kube
from stepscope.testing.kube.helpers import wait_for
from tests.operator.harness import OPERATOR_KEY, OperatorHarness, session_spec


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()
    except OSError:
        return ""


def test_operator_process_serves_liveness_and_metrics(cluster: Kube, s3_endpoint: str) -> None:
    live, prom = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "STEPSCOPE_HMAC_KEY": OPERATOR_KEY.decode(), "STEPSCOPE_SELECTION_GRACE_S": "1"}
    process = subprocess.Popen([sys.executable, "-m", "stepscope.cli", "operator", "-n", "default", f"--liveness=http://127.0.0.1:{live}/healthz",
                                "--metrics-address=127.0.0.1", f"--metrics-port={prom}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _get(f"http://127.0.0.1:{live}/healthz"), 30, "the liveness endpoint")
        OperatorHarness(cluster).create_session("via-cli", session_spec({"job": "none"}, s3_endpoint))
        text = wait_for(lambda: 'stepscope_sessions{phase="Failed"} 1' in (t := _get(f"http://127.0.0.1:{prom}/metrics")) and t, 30, "the failed session in /metrics")
        assert "# TYPE stepscope_status_writes_total counter" in text
        writes = next(line for line in text.splitlines() if line.startswith("stepscope_status_writes_total "))
        assert float(writes.split()[1]) >= 2  # Pending, then Failed
        assert _get(f"http://127.0.0.1:{prom}/other") == ""
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0].decode()
    assert process.returncode == 0, output
    assert "-> Failed (NoPodsSelected)" in output
