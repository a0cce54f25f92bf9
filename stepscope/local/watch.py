"""`stepscope watch`: on one machine, watch the training through its sidecar's step telemetry
(GET /v1/telemetry) and capture by itself when a condition holds: learn the job's step time, then
poll; stepscope.detection judges the conditions, `admit` adds the cooldown and the cap, and each
capture runs exactly as `stepscope capture --analyze` would, into a folder of its own."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from stepscope import detection
from stepscope.local import capture, settings
from stepscope.sidecar_client import SidecarClient, SidecarError
from stepscope.signing import DEFAULT_KEY_FILE, KeyLoadError, load_key

_BASE = detection.Conditions()
# Conditions' fields by the option that sets them: its errors name the field, the user typed the option.
OPTION_OF_FIELD = {"slowdown_factor": "--factor", "sustained_s": "--sustained", "baseline_window_s": "--baseline-minutes",
                   "divergence_factor": "--divergence-factor", "hang_after_s": "--hang-after"}
REPORT_EVERY_S = 60.0  # a watching line at least this often, so a log shows the watch is alive
HANG_CAPTURE_TIMEOUT_S = 10  # a hung job makes no step: the capture dumps every rank's stacks after this


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=5.0, metavar="S", help="seconds between two polls of the sidecar (default %(default)s)")
    parser.add_argument("--factor", type=float, default=_BASE.slowdown_factor, metavar="X",
                        help="step time: capture when the job's step time stays above X times its learned baseline (default %(default)s)")
    parser.add_argument("--baseline-minutes", type=float, default=_BASE.baseline_window_s / 60, metavar="M",
                        help="step time: the baseline is the median step time of the last M minutes (default %(default)s)")
    parser.add_argument("--sustained", type=float, default=_BASE.sustained_s, metavar="S",
                        help="step time and divergence: how long a condition must hold before a capture (default %(default)s)")
    parser.add_argument("--divergence-factor", type=float, default=_BASE.divergence_factor, metavar="X",
                        help="divergence: capture when one rank's step time stays above X times its peers' median (default %(default)s)")
    parser.add_argument("--hang-after", type=float, default=_BASE.hang_after_s, metavar="S",
                        help="hang: capture when no rank made a step for S seconds (default %(default)s)")
    parser.add_argument("--cooldown", type=float, default=900.0, metavar="S", help="seconds between two captures (default %(default)s)")
    parser.add_argument("--max-captures", type=int, default=4, metavar="N", help="stop after N captures (default %(default)s)")
    parser.add_argument("--steps", type=int, default=None, metavar="N", help="steps each capture records (default: capture's)")
    parser.add_argument("--output-dir", type=Path, default=Path("stepscope-watch"), metavar="DIR",
                        help="each capture goes into DIR/<time>-<condition> (default %(default)s)")
    parser.add_argument("--sidecar", type=capture._sidecar_url, default=settings.sidecar_url(), metavar="URL",
                        help="the sidecar's control endpoint (env STEPSCOPE_SIDECAR, default %(default)s)")
    parser.add_argument("--key-file", default=None, help=f"HMAC key file (default $STEPSCOPE_HMAC_KEY, else {DEFAULT_KEY_FILE})")


@dataclass(frozen=True)
class Policy:
    cooldown_s: float
    max_captures: int


@dataclass(frozen=True)
class Budget:
    """The captures taken so far and when the latest began."""
    captures: int = 0
    last_at: float | None = None


def admit(budget: Budget, fires: list[detection.Fire], now: float, policy: Policy) -> tuple[Budget, detection.Fire | None, str | None]:
    """The capture to start now among this poll's fires (a hang first: it leaves no steps to
    compare later), or None and why none: the cooldown or the cap holds it back."""
    if not fires:
        return budget, None, None
    fire = min(fires, key=lambda f: f.condition != detection.HANG)
    if budget.captures >= policy.max_captures:
        return budget, None, f"{fire.condition}: not captured, the cap of {policy.max_captures} capture(s) is reached"
    if budget.last_at is not None and now - budget.last_at < policy.cooldown_s:
        wait = policy.cooldown_s - (now - budget.last_at)
        return budget, None, f"{fire.condition}: not captured, cooling down for {wait:.0f} s more (--cooldown)"
    return Budget(budget.captures + 1, now), fire, None


def status_line(state: detection.State, conditions: detection.Conditions) -> str:
    """Where the watch stands: still learning the baseline, or each condition's latest reading."""
    if state.baseline is None:
        return f"learning the baseline: {len(state.history)}/{conditions.min_baseline_polls} polls with steps"
    current = state.current
    parts = [f"watching: baseline step time {state.baseline:.3g} s, now {_ratio(current.get(detection.SLOWDOWN))}",
             f"worst rank {_ratio(current.get(detection.DIVERGENCE))} its peers"]
    since = current.get(detection.HANG)
    parts.append("no step yet" if since is None else f"last step {since:.1f} s ago")
    return ", ".join(parts)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _fail(message: str, code: int) -> int:
    print(f"stepscope watch: {message}", file=sys.stderr)
    return code


def _conditions(args: argparse.Namespace) -> detection.Conditions:
    """The Conditions of the options; a ValueError names the option to change."""
    try:
        return detection.Conditions(slowdown_factor=args.factor, sustained_s=args.sustained, baseline_window_s=args.baseline_minutes * 60,
                                    divergence_factor=args.divergence_factor, hang_after_s=args.hang_after)
    except ValueError as exc:
        message = str(exc)
        for name, option in OPTION_OF_FIELD.items():
            if message.startswith(name + " "):
                message = option + message[len(name):]
        if args.baseline_minutes <= 0:
            message = f"--baseline-minutes must be a positive number of minutes, got {args.baseline_minutes:g}"
        raise ValueError(message) from None


def _capture(args: argparse.Namespace, fire: detection.Fire, folder: Path) -> int:
    """One capture as `stepscope capture --analyze` takes it (its parser, so its defaults hold)."""
    parser = argparse.ArgumentParser(prog="stepscope capture")
    capture.add_arguments(parser)
    argv = ["--output-dir", str(folder), "--sidecar", args.sidecar, "--analyze"]
    argv += ["--key-file", args.key_file] if args.key_file else []
    if fire.condition == detection.HANG:
        argv += ["--wait", "0", "--hang-timeout", str(HANG_CAPTURE_TIMEOUT_S)]
    elif args.steps is not None:
        argv += ["--steps", str(args.steps)]
    return capture.run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        return _fail(f"--interval must be a positive number of seconds, got {args.interval:g}", capture.EXIT_USAGE)
    if args.cooldown < 0 or args.max_captures < 1:
        return _fail("--cooldown must be 0 or more seconds and --max-captures at least 1", capture.EXIT_USAGE)
    try:
        conditions = _conditions(args)
        key = load_key(args.key_file)
    except (ValueError, KeyLoadError) as exc:
        return _fail(str(exc), capture.EXIT_USAGE)
    client = SidecarClient(args.sidecar, key)
    policy = Policy(args.cooldown, args.max_captures)
    state, budget = detection.State(), Budget()
    reached, last_line, last_report = False, "", float("-inf")
    print(f"watching the training behind {args.sidecar} every {args.interval:g} s; captures go into {args.output_dir}", flush=True)
    try:
        while True:
            try:
                answer = client.get_telemetry()
            except SidecarError as exc:
                if exc.status == 401:
                    return _fail(f"the sidecar refused the request ({exc.message}); use the sidecar's key (STEPSCOPE_HMAC_KEY or --key-file)",
                                 capture.EXIT_UNAUTHORIZED)
                if exc.status == 404:
                    return _fail(f"the sidecar at {args.sidecar} serves no step telemetry (GET /v1/telemetry): run a stepscope sidecar "
                                 "of this version", capture.EXIT_FAILED)
                if not reached:
                    if exc.status:
                        return _fail(f"the sidecar at {args.sidecar} answered {exc.status}: {exc.message}", capture.EXIT_FAILED)
                    return _fail(f"{exc.message}; is `stepscope sidecar` running there (--sidecar)?", capture.EXIT_UNREACHABLE)
                print(f"poll failed, trying again: {exc.message}", flush=True)  # a restarting sidecar is no reason to stop watching
                time.sleep(args.interval)
                continue
            reached = True
            now = time.time()
            state, fires = detection.detect(state, detection.observe(now, [answer]), conditions)
            line = status_line(state, conditions)
            # A line at each change of phase, and one a minute while watching (readings move every poll).
            if line.split(":")[0] != last_line.split(":")[0] or time.monotonic() - last_report >= REPORT_EVERY_S:
                print(line, flush=True)
                last_report = time.monotonic()
            last_line = line
            budget, fire, skipped = admit(budget, fires, now, policy)
            if skipped:
                print(skipped, flush=True)
            if fire is not None:
                folder = args.output_dir.expanduser().resolve() / f"{time.strftime('%Y%m%d-%H%M%S')}-{fire.condition}"
                ranks = ",".join(map(str, fire.ranks))
                print(f"{fire.condition} on ranks {ranks}: {fire.reason}; capturing {budget.captures}/{policy.max_captures} into {folder}",
                      flush=True)
                code = _capture(args, fire, folder)
                if code == capture.EXIT_INTERRUPTED:
                    return code
                if code:  # a hang's capture ends Failed by design (its ranks make no step): its stacks are the result
                    print(f"the capture ended with exit code {code}", flush=True)
                if budget.captures >= policy.max_captures:
                    print(f"{budget.captures} capture(s) taken, the cap (--max-captures); stopping", flush=True)
                    return 0
                last_report = float("-inf")
            time.sleep(args.interval)
    except KeyboardInterrupt:
        print(f"stopped; {budget.captures} capture(s) taken", flush=True)
        return capture.EXIT_INTERRUPTED
