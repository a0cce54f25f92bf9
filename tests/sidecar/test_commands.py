"""`stepscope sidecar` and `stepscope capture` as a user runs them: separate processes talking
over HTTP, with signals and exit codes."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.analysis.model import decode_summary
from stepscope.contracts import layout
from stepscope.local import capture
from stepscope.sidecar.daemon import Sidecar
from stepscope.sidecar_client import SidecarClient, SidecarError
from tests.sidecar.conftest import KEY, SimulatedRanks, eventually, wait_for

REPO = Path(__file__).resolve().parents[2]


def stepscope(*args: str, key: bytes = KEY, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "STEPSCOPE_HMAC_KEY": key.decode(), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "stepscope.cli", *args],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


@pytest.fixture()
def sidecar_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    shared = tmp_path / "shared"
    process = stepscope(
        "sidecar",
        "--dir",
        str(shared),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--pod",
        "pod-p",
        "--poll-interval",
        "0.1",
    )
    line = process.stdout.readline()
    if "listening on" not in line:
        process.kill()
        pytest.fail(f"sidecar did not start: {line}{process.communicate(timeout=10)[1]}")
    url = line.split("listening on ", 1)[1].split()[0]
    yield process, url, shared
    if process.poll() is None:
        process.kill()
        process.wait()


def test_sidecar_installs_the_bootstrap_serves_and_stops_on_sigterm(sidecar_process) -> None:
    process, url, shared = sidecar_process
    assert (shared / "bootstrap" / "sitecustomize.py").is_file() and (
        shared / "bootstrap" / "stepscope_agent" / "__init__.py"
    ).is_file()
    client = SidecarClient(url, KEY)
    assert client.healthz()
    with pytest.raises(SidecarError) as raised:
        client.get_session("none")
    assert raised.value.status == 404
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert KEY.decode() not in process.stderr.read()


def test_sidecar_without_a_key_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_HMAC_KEY"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepscope.cli",
            "sidecar",
            "--dir",
            str(tmp_path),
            "--key-file",
            str(tmp_path / "nokey"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "no HMAC key" in result.stderr


def test_capture_reports_an_unreachable_sidecar_and_a_wrong_key(sidecar: Sidecar, tmp_path: Path) -> None:
    unreachable = stepscope("capture", "--sidecar", "http://127.0.0.1:9", "--output-dir", str(tmp_path / "a"))
    out, err = unreachable.communicate(timeout=60)
    assert unreachable.returncode == 3 and "unreachable" in err and "stepscope sidecar" in err
    wrong = stepscope("capture", "--sidecar", sidecar.url, "--output-dir", str(tmp_path / "b"), key=b"not-the-key")
    out, err = wrong.communicate(timeout=60)
    assert wrong.returncode == 4 and "signature" in err


def test_capture_refuses_a_metrics_interval_below_100_us(tmp_path: Path) -> None:
    refused = stepscope("capture", "--metrics-interval-us", "50", "--output-dir", str(tmp_path / "a"))
    out, err = refused.communicate(timeout=60)
    assert refused.returncode == 2 and "--metrics-interval-us: 50 is below 100" in err and not (tmp_path / "a").exists()


def test_capture_follows_the_session_and_writes_session_json(
    sidecar: Sidecar, ranks: SimulatedRanks, tmp_path: Path, shared_traces: Path
) -> None:
    out_dir = tmp_path / "capture"
    process = stepscope(
        "capture",
        "--sidecar",
        sidecar.url,
        "--output-dir",
        str(out_dir),
        "--wait",
        "1",
        "--steps",
        "2",
        "--save-raw-trace",
        "none",
        "--no-hardware-metrics",
        "--metrics-interval-us",
        "250",
    )
    client = SidecarClient(sidecar.url, KEY)
    session = eventually(sidecar.manager.active, timeout=30, what="a session").id
    for rank in (0, 1):
        ranks.state(session, rank, "capturing")
    wait_for(client, session, lambda s: s["phase"] == "Capturing")
    traces = shared_traces / "hta__trace_filter_2rank"
    for rank in (0, 1):
        ranks.state(session, rank, "done", trace_from=traces / f"sampled_rank-{rank}.json.gz")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "ranks 2: capturing" in out and "Succeeded" in out
    assert f"artifacts in {out_dir}: 2 rank summaries" in out
    record = json.loads((out_dir / layout.session_json()).read_text())
    assert record["session"] == session and record["phase"] == "Succeeded"
    assert record["spec"]["capture"]["steps"] == 2 and record["spec"]["saveRawTrace"] == "none"
    assert record["spec"]["hardwareMetrics"] == {"enabled": False, "intervalMicroseconds": 250}
    assert [t["phase"] for t in record["timeline"]] == ["Pending", "Capturing", "Uploading", "Succeeded"]
    assert sorted(record["artifacts"]) == [layout.rank_summary(0), layout.rank_summary(1)]
    uploaded = (out_dir / layout.rank_summary(1)).read_bytes()
    assert uploaded.startswith(b"\xff\xff\xff\xff") and decode_summary(uploaded).rank == 1  # an Arrow IPC stream
    assert not (out_dir / layout.rank_trace(0)).exists()


@pytest.mark.parametrize("parent_ignores_sigint", [False, True], ids=["plain", "started-ignoring-sigint"])
def test_ctrl_c_cancels_the_session(
    sidecar: Sidecar, ranks: SimulatedRanks, tmp_path: Path, parent_ignores_sigint: bool
) -> None:
    """Also when started the way a non-interactive shell starts a background job, with SIGINT ignored."""
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if parent_ignores_sigint else None
    process = stepscope("capture", "--sidecar", sidecar.url, "--output-dir", str(tmp_path / "c"), preexec_fn=ignore)
    session = eventually(sidecar.manager.active, timeout=30, what="a session").id
    assert process.stdout.readline().startswith(
        f"session {session}: capturing"
    )  # what the user sees before pressing Ctrl-C
    process.send_signal(signal.SIGINT)
    try:
        eventually(
            lambda: json.loads((sidecar.dir / "request.json").read_text())["action"] == "cancel", 20, "a cancel request"
        )
    except AssertionError:
        process.kill()
        out, err = process.communicate(timeout=10)
        raise AssertionError(f"no cancel request; the command printed {out!r}, {err!r}") from None
    for rank in (0, 1):
        ranks.state(session, rank, "cancelled")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "cancelling" in out and "Cancelled" in out
    assert json.loads((tmp_path / "c" / layout.session_json()).read_text())["phase"] == "Cancelled"


class _PollCutByCtrlC:
    """A sidecar client whose second poll is cut short by Ctrl-C, as a SIGINT that lands during the
    HTTP request does (the test above cannot choose where its signal lands)."""

    def __init__(self) -> None:
        self.polls, self.deleted = 0, False

    def get_session(self, session_id: str) -> dict[str, object]:
        self.polls += 1
        if self.polls == 2:
            raise KeyboardInterrupt
        return {"phase": "Cancelled" if self.deleted else "Capturing", "workers": {}}

    def delete_session(self, session_id: str) -> dict[str, object]:
        self.deleted = True
        return {}


def test_ctrl_c_during_a_poll_still_cancels_and_waits_for_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    client = _PollCutByCtrlC()
    status, code = capture._follow(client, "s-1", time.monotonic() + 30, capture._Progress(), "session s-1: capturing")  # type: ignore[arg-type]
    assert client.deleted and status["phase"] == "Cancelled" and code == capture.EXIT_INTERRUPTED
    assert "cancelling: the ranks stop at their next step" in capsys.readouterr().out


def test_ctrl_c_delivered_while_the_session_is_announced_cancels_and_waits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a busy machine the SIGINT of a user who pressed Ctrl-C on reading "capturing" can surface
    as the announcement's print returns; before, that left without waiting (the flaky end-to-end test above)."""
    client = _PollCutByCtrlC()
    client.polls = 2  # no poll of its own is cut: only the announcement
    client.put_session = lambda session_id, body: {}  # type: ignore[attr-defined]
    monkeypatch.setattr(capture, "SidecarClient", lambda url, key: client)
    real_print = print

    def print_cut_by_ctrl_c(*args: object, **kwargs: object) -> None:
        real_print(*args, **kwargs)  # type: ignore[call-overload]
        if str(args[0]).startswith("session "):
            raise KeyboardInterrupt

    monkeypatch.setattr(capture, "print", print_cut_by_ctrl_c, raising=False)
    monkeypatch.setenv("STEPSCOPE_HMAC_KEY", "00" * 32)
    args = capture.add_arguments(parser := argparse.ArgumentParser()) or parser.parse_args(
        ["--output-dir", str(tmp_path / "c")]
    )
    assert capture.run(args) == capture.EXIT_INTERRUPTED
    out = capsys.readouterr().out
    assert client.deleted and "cancelling" in out and "Cancelled" in out


def test_capture_refuses_a_bad_window_before_contacting_anyone(tmp_path: Path) -> None:
    result = stepscope(
        "capture", "--sidecar", "http://127.0.0.1:9", "--steps", "99", "--output-dir", str(tmp_path / "o")
    )
    out, err = result.communicate(timeout=60)
    assert result.returncode == 2 and "1..50" in err
    assert not (tmp_path / "o").exists()


def test_capture_without_training_processes_times_out_with_a_reason(sidecar: Sidecar, tmp_path: Path) -> None:
    process = stepscope(
        "capture", "--sidecar", sidecar.url, "--output-dir", str(tmp_path / "t"), "--duration", "1", "--timeout", "1"
    )
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert "ranks 0: capturing 0" in out and "waiting for training processes to register" in out
    assert "timed out after 1 s" in out and "no training process registered" in out
    record = json.loads((tmp_path / "t" / layout.session_json()).read_text())
    assert (
        record["phase"] == "Failed"
        and record["spec"]["capture"]["durationSeconds"] == 1
        and "steps" not in record["spec"]["capture"]
    )


def test_capture_takes_the_jobs_own_comm_kernels_into_the_spec(sidecar: Sidecar, tmp_path: Path) -> None:
    """--comm-kernel is spec.analysis.commKernelPatterns: it travels with the session (and its
    summaries), and a pattern that is no regular expression is a one-line error naming the option."""
    process = stepscope(
        "capture",
        "--sidecar",
        sidecar.url,
        "--output-dir",
        str(tmp_path / "t"),
        "--duration",
        "1",
        "--timeout",
        "1",
        "--comm-kernel",
        "halo_swap",
        "--comm-kernel",
        "^my_exchange",
    )
    process.communicate(timeout=60)
    record = json.loads((tmp_path / "t" / layout.session_json()).read_text())
    assert record["spec"]["analysis"]["commKernelPatterns"] == ["halo_swap", "^my_exchange"]
    process = stepscope("capture", "--sidecar", sidecar.url, "--output-dir", str(tmp_path / "u"), "--comm-kernel", "(")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 2 and err.strip().startswith(
        "stepscope capture: --comm-kernel[0] is not a regular expression"
    ), err
