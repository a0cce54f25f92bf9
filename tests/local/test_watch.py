"""`stepscope watch`: the cooldown and the cap as a pure function, its one-line errors, and the whole
loop against a real sidecar and real gloo ranks of workload.py (the agent from the bootstrap) that
slow one rank mid-run."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.request import urlopen

import pytest

from stepscope import cli
from stepscope.detection import DIVERGENCE, HANG, SLOWDOWN, Conditions, Fire, observe
from stepscope.local import capture
from stepscope.local.demo import LocalRun
from stepscope.local.scenarios import BASE_ARGS
from stepscope.local.watch import Budget, Policy, admit
from stepscope.sidecar_client import SidecarClient
from stepscope.testing.polling import wait_for

SLOW = Fire(SLOWDOWN, "slow", (0, 1))
HUNG = Fire(HANG, "hung", (0, 1))


def test_admit_takes_the_first_fire_then_holds_back_for_the_cooldown_and_stops_at_the_cap() -> None:
    policy = Policy(cooldown_s=100.0, max_captures=2)
    budget, fire, why = admit(Budget(), [SLOW], 0.0, policy)
    assert (fire, why, budget) == (SLOW, None, Budget(1, 0.0))
    budget, fire, why = admit(budget, [SLOW], 99.0, policy)
    assert fire is None and why is not None and "cooling down for 1 s more" in why and budget == Budget(1, 0.0)
    budget, fire, why = admit(budget, [SLOW], 100.0, policy)
    assert fire == SLOW and budget == Budget(2, 100.0)
    budget, fire, why = admit(budget, [SLOW], 10_000.0, policy)
    assert fire is None and why is not None and "cap of 2" in why
    assert admit(budget, [], 10_000.0, policy) == (budget, None, None)


def test_a_hang_is_captured_before_a_slowdown_of_the_same_poll() -> None:
    _, fire, _ = admit(Budget(), [SLOW, Fire(DIVERGENCE, "rank 1", (1,)), HUNG], 0.0, Policy(0.0, 1))
    assert fire == HUNG


@pytest.mark.parametrize(("argv", "says"), [
    (["--factor", "1"], "--factor must be above 1, got 1"),
    (["--baseline-minutes", "0"], "--baseline-minutes must be a positive number of minutes, got 0"),
    (["--interval", "0"], "--interval must be a positive number of seconds"),
    (["--max-captures", "0"], "--max-captures at least 1"),
    (["--sidecar", "http://127.0.0.1:9"], "unreachable"),
])
def test_bad_options_and_an_absent_sidecar_are_one_line_errors(argv: list[str], says: str, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPSCOPE_HMAC_KEY", "k" * 32)
    code = cli.main(["watch", *argv])
    err = capsys.readouterr().err
    assert code in (capture.EXIT_USAGE, capture.EXIT_UNREACHABLE)
    assert err.startswith("stepscope watch: ") and says in err and err.count("\n") == 1


def test_a_sidecar_without_step_telemetry_is_a_one_line_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A real HTTP server that answers every GET 404, as a sidecar older than /v1/telemetry does.
    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("STEPSCOPE_HMAC_KEY", "k" * 32)
    try:
        code = cli.main(["watch", "--sidecar", f"http://127.0.0.1:{server.server_address[1]}"])
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert code == capture.EXIT_FAILED and "serves no step telemetry (GET /v1/telemetry)" in err and err.count("\n") == 1


def run_watch(local: LocalRun, captures: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stepscope.cli", "watch", "--sidecar", local.url, "--interval", "0.5", "--max-captures", "1",
                           "--output-dir", str(captures), *options],
                          env={**os.environ, "STEPSCOPE_HMAC_KEY": local.key}, capture_output=True, text=True, timeout=150)


@pytest.mark.slow
def test_watch_learns_the_baseline_then_captures_a_mid_run_slowdown_and_names_the_rank(tmp_path: Path) -> None:
    # 2 ranks at ~40 ms a step; from step 250 (~10 s in) rank 1 computes 60 ms more a step in
    # augment_batch_slowly, which the lockstep all-reduce turns into a slower step on both ranks
    # (Slowdown) and a wait share far below its peer's (RankDivergence), whichever holds first.
    workload = [*BASE_ARGS, "--steps", "0", "--slow-rank", "1", "--fault", "cpu", "--slow-ms", "60", "--slow-from-step", "250"]
    with LocalRun(tmp_path / "run", 2, workload) as local:
        local.start()
        watch = run_watch(local, tmp_path / "captures", "--sustained", "2", "--steps", "3")
        # The slow rank's peer waits for it in DDP's all-reduce, it hardly waits: the sidecar's
        # reading once two of the three iterations DDP timed last were slow (300 and 400).
        client = SidecarClient(local.url, local.key.encode())
        shares = wait_for(lambda: _shares_apart(client), 90, "rank 1's wait share below its peer's")
        with urlopen(local.url + "/metrics", timeout=5) as response:
            exposition = response.read().decode()
        steps = [json.loads(p.read_text())["step"] for p in (local.run_dir / "agents").glob("rank-*.json")]
    out = watch.stdout
    assert watch.returncode == 0, out + watch.stderr
    lines = out.splitlines()
    learning = next(i for i, line in enumerate(lines) if line.startswith("learning the baseline"))
    watching = next(i for i, line in enumerate(lines) if line.startswith("watching: "))
    fired = next(i for i, line in enumerate(lines) if line.startswith((f"{SLOWDOWN} on ranks 0,1: ", f"{DIVERGENCE} on ranks 1: ")))
    assert learning < watching < fired, out
    assert min(steps) > 250, steps  # the job went on while watched and captured
    diagnosis = next(line for line in lines if line.startswith("diagnosis: "))
    assert re.search(r"\brank 1\b", diagnosis) and "augment_batch_slowly" in out, out
    assert "cap (--max-captures); stopping" in lines[-1]
    (folder,) = (tmp_path / "captures").iterdir()
    assert folder.name.endswith((f"-{SLOWDOWN}", f"-{DIVERGENCE}")) and (folder / "report").is_dir()
    assert shares[0] - shares[1] >= Conditions().wait_share_gap
    assert re.search(r'^stepscope_collective_wait_share\{local_rank="1",rank="1"\} 0\.\d+', exposition, re.M), exposition


def _shares_apart(client: SidecarClient) -> dict[int, float] | None:
    shares = {rank: sample.wait_share for rank, sample in observe(0.0, [client.get_telemetry()]).ranks.items()}
    share_0, share_1 = shares.get(0), shares.get(1)
    if share_0 is None or share_1 is None or share_0 - share_1 < Conditions().wait_share_gap:
        return None
    return {0: share_0, 1: share_1}


@pytest.mark.slow
def test_watch_captures_a_hang_with_the_stacks_that_name_the_hung_rank(tmp_path: Path) -> None:
    # Rank 1 blocks in block_forever after step 60; rank 0 then waits in the loss all-reduce.
    with LocalRun(tmp_path / "run", 2, [*BASE_ARGS, "--steps", "0", "--hang-rank", "1", "--hang-at-step", "60"]) as local:
        local.start()
        watch = run_watch(local, tmp_path / "captures", "--hang-after", "3")
    out = watch.stdout
    assert watch.returncode == 0, out + watch.stderr
    assert re.search(rf"^{HANG} on ranks 0,1: no step on any rank for \d+ s", out, re.M), out
    diagnosis = next(line for line in out.splitlines() if line.startswith("diagnosis: "))
    assert diagnosis.startswith("diagnosis: rank 1 stuck at block_forever"), out
    (folder,) = (tmp_path / "captures").iterdir()
    assert sorted(p.name for p in folder.rglob("*.stacks.json")) == ["rank-0.stacks.json", "rank-1.stacks.json"]
