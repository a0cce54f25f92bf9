"""Intermittent causes: a cost that a rank pays in some steps and not in the others (a checkpoint or
an evaluation every few steps), judged per step rather than on the mean per step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A step shows the cause when its excess reaches this share of the largest one...
HIT = 0.5
# ... and the others are quiet: below this share of it.
QUIET = 0.25


@dataclass(frozen=True)
class Pattern:
    hits: np.ndarray  # bool per step: the cause shows there
    period: int | None  # steps between hits when they are evenly spaced and none is missing

    def text(self) -> str:
        if self.period is not None:
            return f"every {_ordinal(self.period)} step"
        return f"in {int(self.hits.sum())} of {len(self.hits)} steps"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def intermittent(excess: np.ndarray, numbers: np.ndarray, floor: float) -> Pattern | None:
    """The pattern of a cost with `excess` (µs over the peers) in the steps `numbers`: None unless
    it rises above twice `floor` in at least two steps but not all, and stays quiet in the others."""
    excess = np.asarray(excess, dtype=float)
    numbers = np.asarray(numbers, dtype=np.int64)
    if len(excess) < 3:
        return None
    peak = float(excess.max())
    hits = excess >= HIT * peak
    if peak < 2 * floor or not 2 <= int(hits.sum()) < len(excess) or (excess[~hits] >= QUIET * peak).any():
        return None
    at = numbers[hits]
    gaps = np.diff(at)
    period = int(gaps[0]) if len(set(gaps.tolist())) == 1 and gaps[0] > 1 else None
    # Evenly spaced, and no step where the next hit was due lies outside the hits.
    if period is not None and (at[0] - period >= numbers.min() or at[-1] + period <= numbers.max()):
        period = None
    return Pattern(hits=hits, period=period)
