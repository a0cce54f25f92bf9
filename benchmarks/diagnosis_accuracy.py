"""Is the diagnosis right? The fault-injection scenarios (stepscope/local/scenarios.py), scored.

Each scenario is a real gloo job of stepscope/local/workload.py on the CPU, started the zero-code way
beside a real sidecar daemon (stepscope/local/demo.py's LocalRun), captured through the sidecar's signed
API at `stepscope capture`'s default size (the CRD's default `steps`) and analysed by
analysis.pipeline.analyze_uri, the code the analysis Job runs. Per scenario and rank count it
prints the expected rank and cause, the headline and its confidence, and a verdict:

- right: the headline names the expected rank and one of the scenario's cause words (and all of the
  words of its pattern, if it has one), and that rank alone is listed as a slow worker (a hung
  rank: none is; healthy: no slow worker, no rank blamed); with two slow ranks, both and only
  they are slow workers, each with its own cause;
- unsure: the diagnosis says it cannot tell (and what to capture instead) - not wrong, not right; also
  the right rank named with a plain 'cannot tell' what it does (its stacks were not captured);
- wrong: anything else.

Then the totals (held-out scenarios apart: the diagnosis was not developed on them), the healthy
repeats' false positives, and the time each capture and each analysis took. The held-aside
scenarios (Scenario.held_aside: other magnitudes, functions, periods and rank positions of the
fleet kinds) of a set not yet scored (HELD_ASIDE) run only with --held-out SET, and then alone; those
of a set already scored and developed on since run with the others.

    .venv/bin/python benchmarks/diagnosis_accuracy.py [--ranks 2,4,8] [--scenarios slow-function,healthy]
        [--healthy-repeats 5] [--steps N] [--keep DIR] [--held-out [SET]]
    .venv/bin/python benchmarks/diagnosis_accuracy.py --rescore DIR   # analyse a kept run's captures again
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from stepscope.analysis.pipeline import analyze_uri
from stepscope.local.demo import LocalRun
from stepscope.local.scenarios import SCENARIOS, Scenario

# Not looked at while the diagnosis was developed: their results are reported apart.
HELD_OUT = ("slow-comm-hook", "gc-pauses", "slow-data")
HANG_AT_STEP = 4
# The held-aside sets not developed on: run only when asked for, scored apart.
HELD_ASIDE = ("z",)
# The kinds of the stragglers of real fleets (developed on), beside the earlier kinds.
FLEET = ("slow-host", "cpu-limit", "uneven-batches", "gil-thread", "periodic-stall", "two-slow", "python-heavy")


@dataclass
class Result:
    scenario: str
    ranks: int
    expected: str
    headline: str
    confidence: str
    verdict: str
    capture_s: float
    analysis_s: float


def _expected(s: Scenario, ranks: int) -> str:
    slow = s.slow_ranks(ranks)
    if not slow:
        return "no slow rank"
    return "; ".join(f"rank {r}: {' | '.join(c)}" for r, c in slow.items()) + (
        f" ({' + '.join(s.requires)})" if s.requires else ""
    )


def _judge_several(s: Scenario, ranks: int, diagnosis: dict) -> str:
    """Two slow ranks: both, and only they, are slow workers, each with its own cause."""
    expected = s.slow_ranks(ranks)
    workers = {w["rank"]: w.get("cause", "") for w in diagnosis.get("slowWorkers", [])}
    if not workers and "cannot tell" in diagnosis.get("summary", ""):
        return "unsure"
    right = sorted(workers) == sorted(expected) and all(
        any(c in workers[r] for c in causes) for r, causes in expected.items()
    )
    return "right" if right else "wrong"


def judge(s: Scenario, ranks: int, diagnosis: dict) -> str:
    """right / unsure / wrong for one diagnosis.json document's `diagnosis`."""
    summary = diagnosis.get("summary", "")
    slow = sorted(w["rank"] for w in diagnosis.get("slowWorkers", []))
    unsure = "cannot tell" in summary
    rank = s.slow_rank(ranks)
    if rank is None:
        if slow or summary.startswith("rank "):
            return "wrong"
        return "unsure" if unsure else "right"
    if s.second is not None:
        return _judge_several(s, ranks, diagnosis)
    if unsure and not slow:
        return "unsure"
    named = (
        summary.startswith(f"rank {rank} ")
        and any(c in summary for c in s.causes)
        and all(w in summary for w in s.requires)
    )
    # The right rank, and plainly no cause (its stacks were not captured), with what to capture instead.
    if unsure and slow == [rank] and summary.startswith(f"rank {rank} ") and not named:
        return "unsure"
    # A hung rank is no slow worker (it makes no steps); any other fault's rank must be one.
    listed = slow == [rank] or (s.fault == "hang" and not slow)
    return "right" if named and listed else "wrong"


def _analyse(store: Path) -> tuple[dict, float]:
    started = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        analyze_uri(str(store), progress=False)
    took = time.perf_counter() - started
    return json.loads((store / "report" / "diagnosis.json").read_text()), took


def run_scenario(s: Scenario, ranks: int, work: Path, captures: int, steps: int | None) -> list[Result]:
    out = work / f"{s.name}-{ranks}"
    hung = s.fault == "hang"
    results = []
    with LocalRun(out, ranks, s.workload_args(ranks, HANG_AT_STEP)) as local:
        local.start(stepping=HANG_AT_STEP + 1 if hung else 3)
        for i in range(captures):
            store = out / f"session-{i}"
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                local.capture(
                    store,
                    steps=steps,
                    wait=1 if hung else 3,
                    analyze=False,
                    hang_timeout=5 if hung else 60,
                    hardware_metrics=False,
                )
            capture_s = time.perf_counter() - started
            try:
                document, analysis_s = _analyse(store)
            except Exception as exc:  # noqa: BLE001 - a failed analysis is a wrong answer, reported, not the end of the run
                results.append(
                    Result(s.name, ranks, _expected(s, ranks), f"analysis failed: {exc}", "-", "wrong", capture_s, 0.0)
                )
                continue
            d = document["diagnosis"]
            results.append(
                Result(
                    s.name,
                    ranks,
                    _expected(s, ranks),
                    d.get("summary", ""),
                    str(d.get("confidence", "-")),
                    judge(s, ranks, d),
                    capture_s,
                    analysis_s,
                )
            )
    return results


def rescore(work: Path) -> list[Result]:
    """The captures of a kept run (--keep DIR), analysed again by the code as it is now."""
    results = []
    for run in sorted(p for p in work.iterdir() if p.is_dir()):
        name, _, ranks = run.name.rpartition("-")
        if name not in SCENARIOS:
            continue
        s = SCENARIOS[name]
        for store in sorted(run.glob("session-*")):
            document, analysis_s = _analyse(store)
            d = document["diagnosis"]
            results.append(
                Result(
                    name,
                    int(ranks),
                    _expected(s, int(ranks)),
                    d.get("summary", ""),
                    str(d.get("confidence", "-")),
                    judge(s, int(ranks), d),
                    0.0,
                    analysis_s,
                )
            )
    return results


def _print(r: Result) -> None:
    held = (
        f" (held aside, set {SCENARIOS[r.scenario].held_aside})"
        if SCENARIOS[r.scenario].held_aside
        else " (held out)"
        if r.scenario in HELD_OUT
        else ""
    )
    print(
        f"{r.scenario}{held} @ {r.ranks} ranks: {r.verdict.upper()}  capture {r.capture_s:.1f} s, analysis "
        f"{r.analysis_s:.1f} s",
        flush=True,
    )
    print(f"    expected: {r.expected}", flush=True)
    print(f"    headline: {r.headline}  [confidence {r.confidence}]", flush=True)


def _totals(results: list[Result], label: str) -> str:
    if not results:
        return f"{label}: none run"
    counts = {v: sum(r.verdict == v for r in results) for v in ("right", "unsure", "wrong")}
    return f"{label}: {counts['right']}/{len(results)} right, {counts['unsure']} unsure, {counts['wrong']} wrong"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts (default %(default)s)")
    parser.add_argument(
        "--scenarios", default=None, help="comma-separated scenario names (default: all but the held-aside ones)"
    )
    parser.add_argument(
        "--held-out",
        nargs="?",
        const=HELD_ASIDE[-1],
        default="",
        choices=HELD_ASIDE,
        metavar="SET",
        help="run the held-aside set SET (default %(const)s; only it, unless --scenarios names more)",
    )
    parser.add_argument(
        "--healthy-repeats",
        type=int,
        default=5,
        help="captures of the healthy job per rank count (default %(default)s)",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per capture (default: stepscope capture's, the CRD's default)"
    )
    parser.add_argument(
        "--keep", type=Path, default=None, metavar="DIR", help="keep the runs (logs, traces, reports) in DIR"
    )
    parser.add_argument(
        "--rescore",
        type=Path,
        default=None,
        metavar="DIR",
        help="capture nothing: analyse the captures kept in DIR again",
    )
    args = parser.parse_args()
    default = (
        [n for n, s in SCENARIOS.items() if s.held_aside == args.held_out]
        if args.held_out
        else [n for n, s in SCENARIOS.items() if s.held_aside not in HELD_ASIDE]
    )
    names = [n for n in args.scenarios.split(",") if n] if args.scenarios else default
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    rank_counts = [int(r) for r in args.ranks.split(",") if r]
    work = args.keep or args.rescore or Path(tempfile.mkdtemp(prefix="stepscope-accuracy-"))
    results: list[Result] = []
    if args.rescore:
        results = rescore(args.rescore)
        for r in results:
            _print(r)
    try:
        for ranks in rank_counts if not args.rescore else []:
            for name in names:
                s = SCENARIOS[name]
                if ranks < s.min_ranks:
                    continue
                captures = args.healthy_repeats if s.fault is None else 1
                try:
                    got = run_scenario(s, ranks, work, captures, args.steps)
                except RuntimeError as exc:
                    got = [Result(name, ranks, _expected(s, ranks), f"run failed: {exc}", "-", "wrong", 0.0, 0.0)]
                for r in got:
                    _print(r)
                results += got
    finally:
        if args.keep is None and not args.rescore:
            shutil.rmtree(work, ignore_errors=True)
    healthy = [r for r in results if SCENARIOS[r.scenario].fault is None]
    faulty = [r for r in results if SCENARIOS[r.scenario].fault is not None]
    print()
    aside = [r for r in faulty if SCENARIOS[r.scenario].held_aside in HELD_ASIDE]
    developed = [r for r in faulty if r not in aside]
    print(
        _totals(
            [r for r in developed if r.scenario not in HELD_OUT and not SCENARIOS[r.scenario].held_aside],
            "developed-on scenarios",
        )
    )
    print(_totals([r for r in faulty if r.scenario in HELD_OUT], "held-out scenarios"))
    scored = [r for r in developed if SCENARIOS[r.scenario].held_aside]
    letters = ", ".join(sorted({SCENARIOS[r.scenario].held_aside for r in scored})) or "-"
    print(_totals(scored, f"held-aside sets {letters} (developed on since scored)"))
    print(_totals(aside, f"held-aside set(s) {', '.join(HELD_ASIDE)} (not developed on)"))
    print(
        _totals(
            [r for r in developed if r.scenario not in HELD_OUT and r.scenario in FLEET], "of them, the fleet kinds"
        )
    )
    print(
        f"healthy repeats: {sum(r.verdict == 'wrong' for r in healthy)} false positive(s), "
        f"{sum(r.verdict == 'unsure' for r in healthy)} 'cannot tell' in {len(healthy)}"
    )
    if results:
        caps = sorted(r.capture_s for r in results)
        ana = sorted(r.analysis_s for r in results)
        capture = (
            "not timed (rescored)" if args.rescore else f"median {caps[len(caps) // 2]:.1f} s (max {caps[-1]:.1f})"
        )
        print(f"time per capture: {capture}; per analysis: median {ana[len(ana) // 2]:.1f} s (max {ana[-1]:.1f})")
    return 0 if all(r.verdict != "wrong" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
