"""`stepscope capture`: capture steps of every training process on this machine through its
sidecar, into a local folder (file:// store), and optionally diagnose them right away."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from stepscope import analysis
from stepscope.contracts import layout
from stepscope.contracts.session import (
    DEFAULT_CAPTURE_STEPS,
    SAVE_RAW_TRACE,
    CaptureLimits,
    CaptureSpec,
    HardwareMetricsSpec,
    SessionSpec,
    SpecError,
)
from stepscope.contracts.sidecar_api import SessionRequest
from stepscope.contracts.states import SIDECAR_FINAL, SidecarPhase
from stepscope.local import settings
from stepscope.sidecar_client import SidecarClient, SidecarError
from stepscope.signing import DEFAULT_KEY_FILE, KeyLoadError, load_key
from stepscope.storage import StoreError, open_store

# Exit codes a script can tell apart.
EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_UNAUTHORIZED, EXIT_BUSY, EXIT_TIMEOUT, EXIT_INTERRUPTED = (
    1,
    2,
    3,
    4,
    5,
    6,
    130,
)
CANCEL_GRACE_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        type=int,
        default=CaptureSpec.default_of("waitSteps"),
        metavar="N",
        help="steps to let pass before capturing (default %(default)s)",
    )
    window = parser.add_mutually_exclusive_group()
    window.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help=f"steps to capture, 1..50 (default {DEFAULT_CAPTURE_STEPS})",
    )
    window.add_argument(
        "--duration", type=float, default=None, metavar="S", help="capture S seconds instead (loops without steps)"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the artifacts go (default ./stepscope-<time>)",
    )
    parser.add_argument(
        "--save-raw-trace",
        choices=SAVE_RAW_TRACE,
        default=SessionSpec.default_of("saveRawTrace"),
        help="raw traces to keep (summaries always)",
    )
    parser.add_argument(
        "--analyze", action="store_true", help="diagnose the capture and write the report into DIR/report"
    )
    parser.add_argument(
        "--comm-kernel",
        action="append",
        default=[],
        metavar="REGEX",
        help="a communication kernel of this job's own (spec.analysis.commKernelPatterns; repeatable)",
    )
    parser.add_argument(
        "--sidecar",
        type=_sidecar_url,
        default=settings.sidecar_url(),
        metavar="URL",
        help="the sidecar's control endpoint (env STEPSCOPE_SIDECAR, default %(default)s)",
    )
    parser.add_argument(
        "--key-file", default=None, help=f"HMAC key file (default $STEPSCOPE_HMAC_KEY, else {DEFAULT_KEY_FILE})"
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=SessionSpec.default_of("timeoutSeconds"),
        metavar="S",
        help="give up after S seconds (default %(default)s)",
    )
    parser.add_argument(
        "--hang-timeout",
        type=int,
        default=SessionSpec.default_of("hangTimeoutSeconds"),
        metavar="S",
        help="no step for S seconds counts as a hang (default %(default)s)",
    )
    parser.add_argument("--no-hardware-metrics", action="store_true", help="do not sample NVML during the capture")
    parser.add_argument(
        "--no-stack", action="store_true", help="record no Python function events (capture.withStack=false)"
    )
    parser.add_argument(
        "--max-stack-events",
        type=int,
        default=CaptureLimits.default_of("maxStackEvents"),
        metavar="N",
        help="capture budget: drop Python stacks when the capture would record more (default %(default)s)",
    )
    parser.add_argument(
        "--max-memory-mb",
        type=int,
        default=CaptureLimits.default_of("maxMemoryMB"),
        metavar="MB",
        help="capture budget: cut the capture short once a process grew this much (default %(default)s)",
    )
    parser.add_argument(
        "--metrics-interval-us",
        type=_metrics_interval,
        default=HardwareMetricsSpec.default_of("intervalMicroseconds"),
        metavar="US",
        help="NVML sampling interval in microseconds, >= 100 (default %(default)s; below 1000 the sampler "
        "spins between rounds and takes most of a core)",
    )


# The spec fields this command sets, by the option that sets them: SessionSpec's errors name the
# field (one home for the bounds), the user typed the option.
OPTION_OF_FIELD = {
    "spec.capture.steps": "--steps",
    "spec.capture.durationSeconds": "--duration",
    "spec.capture.waitSteps": "--wait",
    "spec.capture": "--steps/--duration",
    "spec.hardwareMetrics.intervalMicroseconds": "--metrics-interval-us",
    "spec.saveRawTrace": "--save-raw-trace",
    "spec.analysis.commKernelPatterns": "--comm-kernel",
    "spec.timeoutSeconds": "--timeout",
    "spec.hangTimeoutSeconds": "--hang-timeout",
}


def _in_options(message: str) -> str:
    """A SpecError message with the spec fields it names replaced by this command's options."""
    for field in sorted(OPTION_OF_FIELD, key=len, reverse=True):
        message = re.sub(rf"{re.escape(field)}\b(?![.\w])", OPTION_OF_FIELD[field], message)
    return message


def _sidecar_url(text: str) -> str:
    if not re.match(r"^https?://", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// URL: use --sidecar http://{text.split('://')[-1]}"
        )
    return text


def _metrics_interval(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of microseconds: {text!r}") from None
    if value < 100:
        raise argparse.ArgumentTypeError(f"{value} is below 100: NVML cannot be sampled faster than every 100 us")
    return value


def _spec(args: argparse.Namespace, destination: str) -> SessionSpec:
    capture: dict[str, Any] = {
        "waitSteps": args.wait,
        "withStack": not args.no_stack,
        "limits": {"maxStackEvents": args.max_stack_events, "maxMemoryMB": args.max_memory_mb},
    }
    if args.duration is not None:
        capture["durationSeconds"] = args.duration
    elif args.steps is not None:
        capture["steps"] = args.steps
    return SessionSpec.from_dict(
        {
            "capture": capture,
            "hardwareMetrics": {
                "enabled": not args.no_hardware_metrics,
                "intervalMicroseconds": args.metrics_interval_us,
            },
            "saveRawTrace": args.save_raw_trace,
            "storage": {"uri": destination},
            "hangTimeoutSeconds": args.hang_timeout,
            "timeoutSeconds": args.timeout,
            "analysis": {"commKernelPatterns": args.comm_kernel},
        }
    )


def _progress_line(status: dict[str, Any]) -> str:
    w = status.get("workers") or {}
    total = w.get("total", 0)
    line = (
        f"{status.get('phase', '?'):<10} ranks {total}: capturing {w.get('capturing', 0)}, captured "
        f"{w.get('captured', 0)}/{total}, "
        f"uploaded {w.get('uploaded', 0)}/{total}"
    )
    line += f", failed {w['failed']}" if w.get("failed") else ""
    # Before any rank captures, the sidecar's message says what it waits for (no training process yet?).
    return line + (
        f" - {status['message']}" if status.get("phase") == SidecarPhase.PENDING and status.get("message") else ""
    )


class _Progress:
    """One line redrawn in place on a terminal; a new line per change elsewhere (logs, CI)."""

    def __init__(self) -> None:
        self._tty = sys.stdout.isatty()
        self._last = ""

    def show(self, line: str) -> None:
        if line == self._last:
            return
        self._last = line
        if self._tty:
            print(f"\r\033[K{line}", end="", flush=True)
        else:
            print(line, flush=True)

    def done(self) -> None:
        if self._tty and self._last:
            print()


def _fail(message: str, code: int) -> int:
    print(f"stepscope capture: {message}", file=sys.stderr)
    return code


def _sidecar_error(exc: SidecarError, url: str) -> int:
    if exc.status == 0:
        return _fail(f"{exc.message}; is `stepscope sidecar` running there (--sidecar)?", EXIT_UNREACHABLE)
    if exc.status == 401:
        return _fail(
            f"the sidecar refused the request ({exc.message}); use the sidecar's key (STEPSCOPE_HMAC_KEY or "
            "--key-file)",
            EXIT_UNAUTHORIZED,
        )
    if exc.status == 409:
        return _fail(f"the sidecar at {url} is busy: {exc.message}", EXIT_BUSY)
    return _fail(f"the sidecar at {url} answered {exc.status}: {exc.message}", EXIT_FAILED)


def _follow(
    client: SidecarClient, session_id: str, deadline: float, progress: _Progress, announce: str
) -> tuple[dict[str, Any], int | None]:
    """Print `announce`, then poll until the session finishes; Ctrl-C cancels it and waits for what
    was captured to land. The first Ctrl-C does so wherever it lands, in the pause, in a poll or
    during the announcement (a user presses it as soon as they read it, and a busy machine can
    deliver it before print returns); a second one leaves."""
    interrupted = False
    status: dict[str, Any] | None = None
    while status is None or status["phase"] not in SIDECAR_FINAL:
        try:
            if announce:
                print(announce, flush=True)
                announce = ""
            if status is not None:
                progress.show(_progress_line(status))
                if time.monotonic() > deadline:
                    client.delete_session(session_id)
                    return status, EXIT_TIMEOUT
                time.sleep(0.5)
            status = client.get_session(session_id)
        except KeyboardInterrupt:
            if interrupted:
                raise
            interrupted, announce = True, ""
            progress.done()
            print(
                "cancelling: the ranks stop at their next step, what was captured is kept (Ctrl-C again to leave now)",
                flush=True,
            )
            client.delete_session(session_id)
            deadline = min(deadline, time.monotonic() + CANCEL_GRACE_S)
    progress.show(_progress_line(status))
    progress.done()
    return status, EXIT_INTERRUPTED if interrupted else None


def _write_session_json(
    out_dir: Path, session_id: str, url: str, spec: SessionSpec, status: dict[str, Any], started: float
) -> None:
    record = {
        "session": session_id,
        "sidecar": url,
        "spec": spec.to_dict(),
        "startTime": started,
        "completionTime": time.time(),
        **{k: status.get(k) for k in ("phase", "message", "workers", "ranks", "artifacts", "timeline")},
    }
    open_store(out_dir.as_uri()).put_bytes(layout.session_json(), json.dumps(record, indent=1).encode())


def _analyze(out_dir: Path, spec: SessionSpec) -> None:
    try:
        diagnosis = analysis.report(
            str(out_dir), progress=sys.stderr.isatty(), comm_kernel_patterns=spec.analysis.commKernelPatterns
        )
    except (ValueError, OSError, StoreError) as exc:
        print(
            f"stepscope capture: the analysis failed: {exc}; the capture is intact, retry with `stepscope analyze "
            f"{out_dir}`",
            file=sys.stderr,
        )
        return
    print(f"diagnosis: {diagnosis.summary}")
    for finding in diagnosis.findings[:10]:
        ranks = ",".join(map(str, finding.ranks[:8])) + ("…" if len(finding.ranks) > 8 else "")
        print(f"  [{finding.severity}] {finding.category} (ranks {ranks or '-'}): {finding.message}")
    print(f"report: {out_dir / layout.REPORT_HTML}")


def run(args: argparse.Namespace) -> int:
    # Ctrl-C is how a user cancels the capture: a process started in the background by a
    # non-interactive shell, or by a parent that blocks or ignores SIGINT, would otherwise inherit
    # that and never cancel.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        key = load_key(args.key_file)
    except KeyLoadError as exc:
        return _fail(str(exc), EXIT_USAGE)
    out_dir: Path = (args.output_dir or Path(f"stepscope-{time.strftime('%Y%m%d-%H%M%S')}")).expanduser().resolve()
    try:
        spec = _spec(args, out_dir.as_uri())
        out_dir.mkdir(parents=True, exist_ok=True)
    except SpecError as exc:
        return _fail(_in_options(str(exc)), EXIT_USAGE)
    except OSError as exc:
        return _fail(f"cannot create {out_dir}: {exc.strerror}", EXIT_USAGE)

    session_id = str(uuid.uuid4())
    client = SidecarClient(args.sidecar, key)
    request = SessionRequest(session=session_id, name="capture", destination=out_dir.as_uri(), spec=spec)
    started = time.time()
    progress = _Progress()
    try:
        client.put_session(session_id, request)
        # The sidecar enforces spec.timeoutSeconds; the CLI waits a little longer for its verdict.
        status, code = _follow(
            client,
            session_id,
            time.monotonic() + args.timeout + 30,
            progress,
            f"session {session_id}: capturing {_window(spec)} on every rank behind {args.sidecar}",
        )
    except SidecarError as exc:
        progress.done()
        return _sidecar_error(exc, args.sidecar)
    except KeyboardInterrupt:
        progress.done()
        with contextlib.suppress(SidecarError):
            client.delete_session(session_id)
        return _fail(
            f"left without waiting; session {session_id} was cancelled, its files stay in the sidecar's directory "
            "until uploaded",
            EXIT_INTERRUPTED,
        )
    try:
        _write_session_json(out_dir, session_id, args.sidecar, spec, status, started)
    except StoreError as exc:
        print(f"stepscope capture: session.json not written: {exc}", file=sys.stderr)
    if code == EXIT_TIMEOUT:
        return _fail(
            f"no result after {args.timeout} s (last: {status['phase']}, {status.get('message')}); the session was "
            "cancelled",
            EXIT_TIMEOUT,
        )
    print(f"{status['phase']}: {status.get('message', '')}")
    print(f"artifacts in {out_dir}: {_artifact_counts(status.get('artifacts') or [])}")
    if args.analyze and any(a.endswith(SUMMARY_SUFFIXES) for a in status.get("artifacts") or []):
        _analyze(out_dir, spec)
    if code is not None:
        return code
    return 0 if status["phase"] == SidecarPhase.SUCCEEDED else EXIT_FAILED


# A rank's summary as this sidecar uploads it (Arrow) or as an older one did (JSON).
SUMMARY_SUFFIXES = (".summary.arrow", ".summary.json")


def _artifact_counts(keys: list[str]) -> str:
    """'2 rank summaries, 1 raw trace' rather than a list as long as the job is wide."""
    kinds = (
        ("rank summaries", SUMMARY_SUFFIXES),
        ("raw traces", ".trace.json.gz"),
        ("stack dumps", ".stacks.json"),
        ("GPU metrics files", ".csv.gz"),
    )
    counts = [
        f"{sum(k.endswith(suffix) for k in keys)} {name}"
        for name, suffix in kinds
        if any(k.endswith(suffix) for k in keys)
    ]
    return ", ".join(counts) or "none"


def _window(spec: SessionSpec) -> str:
    c = spec.capture
    return (
        f"{c.steps} step(s)" if c.steps is not None else f"{c.durationSeconds:g} s"
    ) + f" after {c.waitSteps} step(s)"
