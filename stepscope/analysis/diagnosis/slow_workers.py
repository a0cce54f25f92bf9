"""Which ranks hold the others up, from three independent pieces of evidence.

- Step time: a rank whose median step is far above its peers' (robust test, outliers.py).
- Kernel durations: a rank whose kernels run longer than the same kernels on its peers. In a
  synchronous job step times even out (everyone waits for the slowest), so this often is the
  only place a slow GPU shows.
- Collective voting: line up the i-th collective of each kind across ranks; the rank that
  arrives last waits least, so its duration is the shortest. The rank that most often has the
  shortest duration is the straggler, and the others' extra wait is what it costs them.
- Waiting per step (traces without GPU events, where StepRow.collectiveUs holds each step's time
  inside collectives): in every step all ranks captured, the rank that waits least is the one the
  others wait for, and the gap is what it costs them. This holds from a single step, so it is the
  evidence of a short capture; it is weighed (`confidence`) by how many steps agree, how large the
  gap is against the step, and how much of it a cause on that rank (causes.py) accounts for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.outliers import (
    group_matrices,
    group_medians,
    peer_median,
    stands_out,
    vote_share_threshold,
)
from stepscope.analysis.diagnosis.rank_tables import RankTables

# A rank must be this much slower than its peers before it is called slow: below, the
# difference is within the jitter of a healthy job and no action would follow.
MIN_SLOWDOWN = 1.05
# A kernel counts as "slower on this rank" at 10 % above its peers.
KERNEL_SLOWER = 1.10
# Collectives matched across ranks before a vote means anything.
MIN_ROUNDS = 5
# A rank that is last at most collectives but costs the others under 2 % of a step is not worth
# acting on (someone is always last).
MIN_VOTE_COST = 0.02
# The collectives contradict a cause when even the top of their gap's noise band (this many
# standard errors above its mean over the steps) is below half of what the cause costs; a
# measure whose band's bottom clears what is worth acting on is shown by its steps as one.
NOISE_BAND = 2.0
# ... or causes this share of all the waiting at collectives.
WAIT_SHARE = 0.75
# Waiting per step: a rank holds the others back when they wait this share of the step longer
# than it does; below, it is the jitter of a healthy job (someone is always last).
MIN_GAP_SHARE = 0.05
# With three or more ranks, one late rank makes all others wait alike: the second least waiting
# rank must wait this share of the gap more than the least waiting one.
ALONE = 0.5
# The confidence below which the diagnosis says it cannot tell rather than name a rank, and below
# which what little evidence there is is no reason to doubt a healthy job.
CONFIDENT = 0.65
DOUBT = 0.4


@dataclass
class SlowEvidence:
    """What marks one rank as slow; every figure is optional, each check fills its own."""

    rank: int
    stepRatio: float | None = None
    kernelRatio: float | None = None
    slowKernels: list[dict] = field(default_factory=list)
    voteShare: float | None = None
    votes: int = 0
    rounds: int = 0
    peersWaitUsPerStep: float = 0.0

    @property
    def holds_back(self) -> bool:
        """Its step is longer, or its peers wait for it. Kernels that run longer while its step
        does not (the collectives absorb the difference: it waits less) are a kernel finding."""
        return bool(self.stepRatio or self.voteShare)

    def waitUsPerStep(self, median_step_us: float) -> float:
        """The peers' wait for it, at most the step (the rounds' waits are summed medians)."""
        return min(self.peersWaitUsPerStep, median_step_us) if median_step_us > 0 else self.peersWaitUsPerStep

    def slowdown(self, median_step_us: float) -> float:
        """Consistent with the step times beside it: its step over its peers' where they differ,
        else the step over the step less the peers' wait for it (what the step would be without
        it); 1 when nothing shows it holding anyone back."""
        wait = self.waitUsPerStep(median_step_us)
        by_wait = median_step_us / (median_step_us - wait) if self.voteShare and 0 < wait < median_step_us else 1.0
        return max(self.stepRatio or 1.0, by_wait)


def step_time_outliers(tables: RankTables) -> dict[int, float]:
    """Rank -> step time / peers' median step time, for ranks far slower than their peers."""
    steps = tables.step_us.dropna()
    if len(steps) < 2:
        return {}
    values = steps.to_numpy()
    mask = stands_out(values, min_ratio=MIN_SLOWDOWN)
    peers = peer_median(values)
    return {int(r): float(v / p) for r, v, p in zip(steps.index[mask], values[mask], peers[mask]) if p > 0}


_BITMAP_CELLS = 1 << 26


def kernel_ratios(tables: RankTables) -> tuple[pd.Series, pd.DataFrame]:
    """Per rank, how much longer its kernels run than the same kernels on its peers (the time-
    weighted geometric mean of per-kernel ratios), and the per-(rank, kernel) table behind it.

    Kernels seen on fewer than half of the ranks are left out: a kernel only one rank runs has
    no peers to compare with. Communication kernels are left out of the rank ratio when there is
    other work: the rank that arrives last at a collective has the shortest ones."""
    k = tables.kernels
    ranks = tables.ranks["rank"].nunique()
    if k.empty or ranks < 2:
        return pd.Series(dtype=float), k.iloc[0:0]
    return tables.memo("kernel_ratios", lambda: _kernel_ratios(tables, ranks))


def _ranks_running(codes: np.ndarray, rank: np.ndarray, kernels: int, span: int) -> np.ndarray:
    """How many ranks run each kernel (`codes`, 0..kernels-1) on ranks 0..span-1: a kernel by rank
    bitmap where it is small (a few hundred kernels of thousands of ranks: tens of MB), else the
    distinct pairs by hashing."""
    pairs = codes.astype(np.int64) * span + rank
    if kernels * span <= _BITMAP_CELLS:
        seen = np.zeros(kernels * span, dtype=bool)
        seen[pairs] = True
        return seen.reshape(kernels, span).sum(axis=1)
    return np.bincount(pd.unique(pairs) // span, minlength=kernels)


def _kernel_ratios(tables: RankTables, ranks: int) -> tuple[pd.Series, pd.DataFrame]:
    k = tables.kernels[["rank", "name", "type", "count", "sumUs", "meanUs"]]
    # Each kernel name as a number once: every figure below groups millions of rows by it.
    codes, names = pd.factorize(k["name"])
    rank = k["rank"].to_numpy(dtype=np.int64) - int(k["rank"].min())
    span = int(rank.max()) + 1
    on = _ranks_running(codes, rank, len(names), span)
    keep = on[codes] >= max(2, (ranks + 1) // 2)
    k = k if keep.all() else k[keep]  # copy-on-write: the columns added below are this frame's own
    codes = codes[keep]
    if k.empty:
        return pd.Series(dtype=float), k
    # Per kernel, its peers' medians, spread back over its rows: arrays of the rows, no frame per step.
    mean, total = k["meanUs"].to_numpy(dtype=float), k["sumUs"].to_numpy(dtype=float)
    by_kernel = group_matrices(codes)
    peer_mean = group_medians(mean, codes, len(names), by_kernel)[codes]
    peer_sum = group_medians(total, codes, len(names), by_kernel)[codes]
    k = k.assign(
        peerMeanUs=peer_mean,
        peerSumUs=peer_sum,
        ratio=np.divide(mean, peer_mean, out=np.ones_like(mean), where=peer_mean > 0),
        excessUsPerStep=(total - peer_sum) / tables.step_counts(k["rank"].to_numpy()),
    )
    computing = (k["type"] != "COMM").to_numpy()
    weighted = computing if computing.any() else np.ones(len(k), dtype=bool)
    weight = k["peerSumUs"].to_numpy()[weighted]
    logs = np.log(np.clip(k["ratio"].to_numpy()[weighted], 1e-6, None)) * weight
    grouped = pd.DataFrame({"log": logs, "w": weight}).groupby(k["rank"].to_numpy()[weighted]).sum()
    per_rank = np.exp(grouped["log"] / grouped["w"].where(grouped["w"] > 0, 1.0)).rename_axis("rank")
    return per_rank, k


def kernel_outliers(tables: RankTables) -> dict[int, tuple[float, list[dict]]]:
    """Rank -> (kernel ratio, the kernels that cost it most time) for ranks whose kernels run
    far longer than their peers'."""
    per_rank, k = kernel_ratios(tables)
    if len(per_rank) < 2:
        return {}
    # Compare ratios to each other, not to 1: a rank's ratio is relative to the per-kernel median.
    mask = stands_out(per_rank.to_numpy(), min_ratio=MIN_SLOWDOWN)
    out: dict[int, tuple[float, list[dict]]] = {}
    for rank, ratio in per_rank[mask].items():
        mine = k[(k["rank"] == rank) & (k["ratio"] >= KERNEL_SLOWER)].nlargest(5, "excessUsPerStep")
        out[int(rank)] = (
            float(ratio),
            [
                {"name": n, "type": t, "ratio": round(float(r), 3), "excessUsPerStep": round(float(e), 1)}
                for n, t, r, e in zip(mine["name"], mine["type"], mine["ratio"], mine["excessUsPerStep"])
            ],
        )
    return out


@dataclass
class Votes:
    votes: dict[int, int]
    rounds: int
    waitUs: dict[int, float]  # the others' extra wait summed over the rounds each rank won
    kinds: list[str]


def collective_votes(durations: pd.DataFrame) -> Votes:
    """Count, per rank, the matched collectives it arrived last at (shortest duration), from
    RankTables.durations.

    A round with a tie for the shortest duration, or where all durations are equal, says
    nothing about who was late and is left out."""
    votes: dict[int, int] = {}
    waits: dict[int, float] = {}
    rounds = 0
    kinds: list[str] = []
    if durations.empty:
        return Votes(votes=votes, rounds=rounds, waitUs=waits, kinds=kinds)
    for kind, calls in durations.groupby("kind", sort=True):
        ranks = np.unique(calls["rank"].to_numpy(dtype=np.int64))
        if len(ranks) < 2:
            continue
        n = int(calls.groupby("rank").size().min())
        # The first n calls of each rank, as a matrix of ranks (rows) by calls in issue order.
        kept = calls[calls["position"] < n]
        matrix = np.empty((len(ranks), n), dtype=float)
        matrix[np.searchsorted(ranks, kept["rank"].to_numpy()), kept["position"].to_numpy()] = kept[
            "durationUs"
        ].to_numpy(dtype=float)
        lowest = matrix.min(axis=0)
        clear = ((matrix == lowest).sum(axis=0) == 1) & (matrix.max(axis=0) > lowest)
        if not clear.any():
            continue
        winners = ranks[matrix.argmin(axis=0)[clear]]
        # What the others waited: their median minus the last arrival's time (the winner is the
        # lowest, so the others are the sorted column without its first entry).
        wait = (np.median(np.sort(matrix, axis=0)[1:], axis=0) - lowest)[clear]
        counted = np.bincount(np.searchsorted(ranks, winners), minlength=len(ranks))
        waited = np.bincount(np.searchsorted(ranks, winners), weights=wait, minlength=len(ranks))
        for r, c, w in zip(ranks, counted, waited):
            votes[int(r)] = votes.get(int(r), 0) + int(c)
            waits[int(r)] = waits.get(int(r), 0.0) + float(w)
        rounds += int(clear.sum())
        kinds.append(str(kind))
    return Votes(votes=votes, rounds=rounds, waitUs=waits, kinds=kinds)


def vote_stragglers(votes: Votes, ranks: int, steps: int) -> dict[int, tuple[float, float]]:
    """Rank -> (share of rounds it was last at, the others' wait per step it costs).

    A rank stands out by how often it is last (more than chance allows) or by how much of all
    the waiting it causes: with two ranks and a data-parallel step of several collectives, the
    early ones are a toss-up and only the one that waits for the slow rank's work tells."""
    if votes.rounds < MIN_ROUNDS or ranks < 2:
        return {}
    need = vote_share_threshold(ranks, votes.rounds)
    total_wait = sum(votes.waitUs.values()) or 1.0
    return {
        r: (v / votes.rounds, votes.waitUs.get(r, 0.0) / max(steps, 1))
        for r, v in votes.votes.items()
        if v / votes.rounds >= need or votes.waitUs.get(r, 0.0) / total_wait >= WAIT_SHARE
    }


@dataclass
class WaitVerdict:
    """Who the others wait for, from each step's time in collectives (CPU traces)."""

    rank: int | None  # the rank they wait for; None when none stands out
    gapUsPerStep: float  # the others' median wait per step minus its own
    stepUs: float  # median step over the steps every rank captured
    steps: int  # steps every rank captured
    agreeing: int  # of those, steps in which this rank alone waits least, by a clear gap
    waitUs: dict[int, float]  # each rank's mean wait per step
    commonSteps: pd.Index  # the step numbers every rank captured
    perStepUs: pd.DataFrame  # each common step's wait (rows) by rank (columns)

    @property
    def share(self) -> float:
        return self.gapUsPerStep / self.stepUs if self.stepUs > 0 else 0.0

    def gap(self, rank: int) -> float:
        """The others' median mean wait per step minus `rank`'s: what they wait for it (negative
        where it waits longer than they do)."""
        return float(np.median([w for r, w in self.waitUs.items() if r != rank])) - self.waitUs[rank]

    def gap_band(self, rank: int, also: pd.DataFrame | None = None) -> tuple[float, float]:
        """The others' median wait minus `rank`'s, as a mean over the steps and its standard
        error from the step-to-step spread (inf from one step: a single step shows no spread).
        `also`: more waiting per step (rows) by rank (columns), added to the collectives'."""
        waits = self.perStepUs if also is None else self.perStepUs + also.reindex_like(self.perStepUs).fillna(0.0)
        peers = waits.drop(columns=[rank]).median(axis=1).to_numpy(dtype=float)
        gaps = peers - waits[rank].to_numpy(dtype=float)
        if len(gaps) < 2:
            return float(gaps.mean()) if len(gaps) else 0.0, float("inf")
        return float(gaps.mean()), float(gaps.std(ddof=1) / np.sqrt(len(gaps)))


def _late_rank(waits: np.ndarray) -> tuple[int, float, bool]:
    """For one step's waits (one per rank): the least waiting rank's index, the others' median
    wait minus its own, and whether it alone is late (not one of several)."""
    order = np.argsort(waits, kind="stable")
    low = int(order[0])
    others = np.delete(waits, low)
    gap = float(np.median(others) - waits[low])
    alone = len(waits) < 3 or float(waits[order[1]] - waits[low]) >= ALONE * gap
    return low, gap, alone


def wait_verdict(tables: RankTables, step_us: float | None = None) -> WaitVerdict | None:
    """None where the steps carry no collective time (GPU traces, older summaries) or no step was
    captured by every rank (each rank's capture starts at its own step). `step_us`: the step that
    the gaps are weighed against, where not the ranks' median step."""
    s = tables.steps
    if s.empty or "collectiveUs" not in s or len(tables.ranks) < 2 or s["collectiveUs"].isna().all():
        return None
    ranks = np.asarray(sorted(tables.ranks["rank"]), dtype=np.int64)
    waits = tables.by_step("collectiveUs").reindex(columns=ranks).dropna()
    durations = tables.by_step("durationUs").reindex(index=waits.index, columns=ranks)
    # Ranks that never meet in a collective do not wait for each other: no lockstep to judge.
    if waits.empty or float(waits.to_numpy().max()) <= 0:
        return None
    step_us = float(np.median(durations.median(axis=1))) if step_us is None else step_us
    per_step = [_late_rank(row) for row in waits.to_numpy(dtype=float)]
    mean = waits.mean(axis=0).to_numpy(dtype=float)
    low, gap, _ = _late_rank(mean)
    agreeing = sum(1 for r, g, alone in per_step if r == low and alone and g >= MIN_GAP_SHARE * step_us)
    verdict = WaitVerdict(
        rank=int(ranks[low]),
        gapUsPerStep=gap,
        stepUs=step_us,
        steps=len(waits),
        agreeing=agreeing,
        waitUs={int(r): float(w) for r, w in zip(ranks, mean)},
        commonSteps=waits.index,
        perStepUs=waits,
    )
    if gap < MIN_GAP_SHARE * step_us:
        verdict.rank = None
    return verdict


def find_slow_workers(tables: RankTables, votes: bool = True, steps: bool = True) -> dict[int, SlowEvidence]:
    """Slow ranks from kernel times and (with `steps`, `votes`) step times and collective voting; a
    job whose steps carry their collective time is judged by straggler.py instead of those two."""
    evidence: dict[int, SlowEvidence] = {}
    for rank, ratio in (step_time_outliers(tables) if steps else {}).items():
        evidence.setdefault(rank, SlowEvidence(rank)).stepRatio = ratio
    for rank, (ratio, kernels) in kernel_outliers(tables).items():
        e = evidence.setdefault(rank, SlowEvidence(rank))
        e.kernelRatio, e.slowKernels = ratio, kernels
    if not votes:
        return evidence
    counted = collective_votes(tables.durations)
    per_rank_steps = int(tables.ranks["steps"].median()) if len(tables.ranks) else 1
    median_step = float(tables.step_us.median()) if tables.step_us.notna().any() else 0.0
    for rank, (share, wait) in vote_stragglers(counted, len(tables.ranks), per_rank_steps).items():
        if median_step > 0 and wait < MIN_VOTE_COST * median_step:
            continue
        e = evidence.setdefault(rank, SlowEvidence(rank))
        e.voteShare, e.votes, e.rounds, e.peersWaitUsPerStep = share, counted.votes[rank], counted.rounds, wait
    return evidence
