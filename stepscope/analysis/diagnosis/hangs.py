"""Hangs from the agents' stacks files: where each rank is stuck, and which rank is the odd one out.

In a hung collective job every healthy rank waits at the same collective call; the rank that
stopped elsewhere (in a data loader, a deadlock, an endless loop) is what holds the others up.
With few ranks the groups are as large as each other, so a rank waiting in a collective counts as
a waiter first.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from stepscope.analysis.diagnosis.wording import ranks_text
from stepscope.analysis.model import Finding

# Frames of these files are plumbing around the place a rank is stuck, not the place itself.
_PLUMBING = ("threading.py", "/torch/", "\\torch\\", "stepscope_agent", "site-packages/", "dist-packages/")


def _main_frames(stacks: dict[str, Any]) -> list[dict[str, Any]]:
    threads = stacks.get("threads") or []
    main = next((t for t in threads if t.get("main")), threads[0] if threads else None)
    return list((main or {}).get("frames") or [])


def _where(frame: dict[str, Any], file: str) -> str:
    """'function (file:line)'; Python reports no line number for some frames (line null)."""
    line = frame.get("line")
    return f"{frame.get('function') or '?'} ({file}{'' if line is None else f':{line}'})"


def _frame_text(frame: dict[str, Any]) -> str:
    return _where(frame, str(frame.get("file") or "?").replace("\\", "/").rsplit("/", 1)[-1])


# Where a rank that waits for the others blocks: torch.distributed's collectives and barriers.
_COLLECTIVE = re.compile(
    r"all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|barrier|\bsend\b|\brecv\b|monitored_barrier|_wait|wait_stream",
    re.I,
)


def stuck_at(stacks: dict[str, Any]) -> str:
    """The innermost frame of user code in the main thread (frames are listed outermost first)."""
    frames = _main_frames(stacks)
    user = [f for f in frames if not any(p in str(f.get("file", "")) for p in _PLUMBING)]
    chosen = (user or frames)[-1:]
    if not chosen:
        return "an unknown place (no frames recorded)"
    inner = str(frames[-1].get("function", ""))
    # A rank blocked inside torch.distributed reads better as "all_reduce in train_step (...)".
    if frames[-1] is not chosen[0] and _COLLECTIVE.search(inner):
        return f"{inner} in {_frame_text(chosen[0])}"
    return _frame_text(chosen[0])


def in_collective(stacks: dict[str, Any]) -> bool:
    """Whether the main thread waits in a collective (and so most likely for another rank)."""
    return any(
        "distributed" in str(f.get("file", "")) or _COLLECTIVE.search(str(f.get("function", "")))
        for f in _main_frames(stacks)
    )


def _frame_path(stacks: dict[str, Any]) -> str:
    """The main thread's frames with full paths, outermost first, for the report's data."""
    return " > ".join(_where(f, str(f.get("file") or "?")) for f in _main_frames(stacks))


def _signature(stacks: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """Where a rank is, by file and function (lines differ between code versions of one call)."""
    return tuple((str(f.get("file", "")), str(f.get("function", ""))) for f in _main_frames(stacks))


def hang_findings(stacks: dict[int, dict[str, Any]], ranks: list[int]) -> list[Finding]:
    """Findings (severity, category, ranks, message, score, data) for the ranks that reported a hang.

    `ranks` are all ranks known to the session: one without a stacks file while others hung is
    named too, since a rank that crashed or still runs is a suspect as well."""
    if not stacks:
        return []
    groups: dict[tuple, list[int]] = defaultdict(list)
    for rank in sorted(stacks):
        groups[_signature(stacks[rank])].append(rank)
    # The waiters are the ranks in a collective (or, when all or none are, the largest group);
    # whoever is elsewhere holds them up.
    ordered = sorted(groups.values(), key=lambda g: (in_collective(stacks[g[0]]), len(g)), reverse=True)
    seconds = max(float(s.get("secondsSinceStep") or 0.0) for s in stacks.values())
    steps = sorted({int(s["step"]) for s in stacks.values() if s.get("step") is not None})
    data = {
        "stuckAt": {str(r): stuck_at(s) for r, s in sorted(stacks.items())},
        "stacks": {str(r): _frame_path(s) for r, s in sorted(stacks.items())},
        "secondsSinceStep": seconds,
        "steps": steps,
    }
    out: list[Finding] = []
    majority = ordered[0]
    where = stuck_at(stacks[majority[0]])
    if len(ordered) == 1:
        text = (
            f"{ranks_text(majority)} hung for {seconds:.0f} s at {where}"
            if len(majority) == 1
            else f"{len(majority)} ranks hung for {seconds:.0f} s, all at {where}"
        )
        out.append(Finding("critical", "hang", majority, text, 1.0, data))
    else:
        for group in ordered[1:]:
            out.append(
                Finding(
                    "critical",
                    "hang",
                    group,
                    f"{ranks_text(group)} stuck at {stuck_at(stacks[group[0]])} while {len(majority)} other rank(s) "
                    f"wait at {where}: "
                    f"{'this rank is' if len(group) == 1 else 'these ranks are'} the likely culprit",
                    1.0 + len(majority) / max(len(stacks), 1),
                    data,
                )
            )
    silent = sorted(set(ranks) - set(stacks))
    if silent:
        out.append(
            Finding(
                "warning",
                "hang",
                silent,
                f"{ranks_text(silent)} left no readable stacks while {len(stacks)} rank(s) hung: check whether it "
                "crashed or is still running",
                0.5,
                data,
            )
        )
    return out
