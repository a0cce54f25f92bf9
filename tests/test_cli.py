"""The `stepscope` command's rough edges: --version, a reader that goes away,
option errors that name the option and what to type instead."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from stepscope import __version__

REPO = Path(__file__).resolve().parents[1]


def _stepscope(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")} | env
    return subprocess.run([sys.executable, "-m", "stepscope.cli", *args], env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_version(tmp_path: Path) -> None:
    result = _stepscope("--version", tmp_path=tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, f"stepscope {__version__}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A stand-in subcommand (what `analyze` does at its end: print a long report to stdout)."""


def run(args: argparse.Namespace) -> int:
    for n in range(20000):
        print(f"finding {n}: rank {n % 8} is slow")
    return 0


def test_a_reader_that_goes_away_is_no_traceback() -> None:
    """`stepscope analyze ... | head`: the reader closes the pipe while the command prints."""
    code = "import sys, stepscope.cli as c; c.COMMANDS['analyze'] = c.Command('tests.test_cli', ''); sys.exit(c.main(['analyze']))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"finding 0")
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_sidecar_without_a_scheme_suggests_http(tmp_path: Path) -> None:
    result = _stepscope("capture", "--sidecar", "localhost:7470", tmp_path=tmp_path, STEPSCOPE_HMAC_KEY="k")
    assert result.returncode == 2
    assert "argument --sidecar: 'localhost:7470' is not an http:// URL: use --sidecar http://localhost:7470" in result.stderr


def test_bad_steps_name_the_option_not_the_cluster_field(tmp_path: Path) -> None:
    result = _stepscope("capture", "--steps", "0", "--output-dir", str(tmp_path / "out"), tmp_path=tmp_path, STEPSCOPE_HMAC_KEY="k")
    assert result.returncode != 0
    assert result.stderr.strip() == "stepscope capture: --steps must be within 1..50, got 0"


def test_operator_without_a_key_is_one_line(tmp_path: Path) -> None:
    result = _stepscope("operator", "--metrics-port", "0", "--key-file", str(tmp_path / "absent"), tmp_path=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"stepscope operator: no HMAC key: set STEPSCOPE_HMAC_KEY or mount the key file at {tmp_path / 'absent'} (--key-file)"


def test_capture_says_when_the_analysis_finds_nothing(tmp_path: Path, capsys) -> None:
    """`stepscope capture` ends with the analysis: a session folder it cannot analyse is a one-line
    error that keeps the capture, not a traceback."""
    from stepscope.contracts.session import SessionSpec
    from stepscope.local.capture import _analyze

    _analyze(tmp_path, SessionSpec.from_dict({"storage": {"uri": tmp_path.as_uri()}}))
    err = capsys.readouterr().err
    assert err.startswith("stepscope capture: the analysis failed: nothing to analyse at") and "the capture is intact" in err


def test_every_command_names_its_adder_and_runner() -> None:
    """The table of commands says where each one's code is: no handler found by a name made up at
    run time."""
    import importlib

    from stepscope.cli import COMMANDS

    for name, command in COMMANDS.items():
        module = importlib.import_module(command.module)
        assert callable(getattr(module, command.add_arguments)) and callable(getattr(module, command.run)), name
    assert (COMMANDS["get"].run, COMMANDS["report"].run, COMMANDS["analyze"].run) == ("run_get", "run_report", "run_analyze")
