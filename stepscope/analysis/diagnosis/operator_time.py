"""Operators compared across ranks, with their input shapes: a rank whose operators take longer than
its peers' is slowed either by its device or host (the same shapes take longer) or by its inputs
(larger shapes: uneven shards or batches). Both are causes in their own right, from each step's
operator time (OperatorStat.stepsUs, the operators' own time on the training thread).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.diagnosis.wording import ms

# Operators take this many times their peers' time (all operators of the rank together) before
# the difference is a cause: a loaded machine stretches every rank's operators by some per cent.
OPERATOR_RATIO = 1.3
# The rank's operator time in (name, shapes) its peers also run, as a share of its operator time,
# from which its shapes are "the same": a few extra small operators do not make larger inputs.
SAME_SHAPES = 0.8


@dataclass(frozen=True)
class OperatorCause:
    excessUsPerStep: float  # the rank's operator time per step minus its peers' median
    usPerStep: float
    peersUsPerStep: float
    stepsUs: tuple[float, ...]  # the excess in each common step
    sameShapes: bool
    shapesKnown: bool  # the capture recorded input shapes (capture.recordShapes)
    operator: str  # the operator with the most excess
    shapes: str  # its input shapes on the rank
    peersShapes: str  # and on its peers
    # Its inputs are larger than its peers': the shapes it spends most time in, more elements than
    # theirs, that no peer runs. Work they do not have, which no load of the machine makes (a busy
    # machine stretches operators, it does not change their shapes).
    larger: bool = False
    # The larger inputs are to the operators that carry half of its peers' work (_main_larger), not
    # to an operator that one hiccup put in the rank's top operators with shapes its peers' lack.
    mainWork: bool = False
    # Larger inputs: its training thread's time on a CPU beyond its peers' where that is more than
    # its operators' excess. The operators' wall time takes in the run queue's waits, which a loaded
    # machine spreads over every rank's operators (a rank with 2.8x its peers' batches computed
    # 2.0-3.4 ms a step more on a CPU while its operators took 0.6 ms longer at most); its CPU time
    # is its own work.
    cpuExcessUsPerStep: float = 0.0

    @property
    def costUsPerStep(self) -> float:
        return max(self.excessUsPerStep, self.cpuExcessUsPerStep)

    @property
    def ratio(self) -> float:
        return self.usPerStep / self.peersUsPerStep if self.peersUsPerStep > 0 else float("inf")

    def text(self) -> str:
        if self.larger and self.cpuExcessUsPerStep > self.excessUsPerStep:
            return (
                f"its inputs are larger: {self.operator} takes {self.shapes} against {self.peersShapes} on its peers "
                f"(uneven shards or batches); its training thread computes {ms(self.cpuExcessUsPerStep)}/step more "
                f"than its peers' on a CPU, while its operators took {ms(self.excessUsPerStep)}/step more "
                f"({ms(self.usPerStep)} vs {ms(self.peersUsPerStep)} a step): the machine's run queue stretched "
                "its peers' operators too"
            )
        if self.larger and self.excessUsPerStep <= 0:
            return (
                f"its inputs are larger: {self.operator} takes {self.shapes} against {self.peersShapes} on its peers "
                f"(uneven shards or batches), yet in these steps its operators took no longer than theirs "
                f"({ms(self.usPerStep)} vs {ms(self.peersUsPerStep)} a step): the machine's noise hid what they cost"
            )
        times = f"{self.ratio:.1f}x its peers'" if self.peersUsPerStep > 0 else "where its peers take none"
        head = (
            f"its operators compute {ms(self.excessUsPerStep)}/step more than its peers' ({ms(self.usPerStep)} vs "
            f"{ms(self.peersUsPerStep)}, {times})"
        )
        if not self.shapesKnown:
            return (
                f"{head}, most in {self.operator}; their input shapes were not recorded (capture.recordShapes), so a "
                "slow device or host cannot be told from larger inputs"
            )
        if self.sameShapes:
            return f"{head} with the same shapes, most in {self.operator} {self.shapes}: a slow device or host"
        if not self.larger:
            return (
                f"{head}, with other input shapes than its peers': {self.operator} takes {self.shapes} against "
                f"{self.peersShapes} on its peers"
            )
        return (
            f"{head}, as its inputs are larger: {self.operator} takes {self.shapes} against {self.peersShapes} on its "
            "peers: uneven shards or batches"
        )


def _dims(shapes: str) -> list:
    """The profiler's "Input Dims" text as a list ([] where it cannot be read)."""
    try:
        dims = json.loads(shapes) if shapes else []
    except ValueError:
        return []
    return dims if isinstance(dims, list) else []


def _elements(shapes: str) -> int:
    """The elements of all of an operator's input tensors, from the profiler's "Input Dims" text
    (0 where it cannot be read)."""
    tensors = [d for d in _dims(shapes) if isinstance(d, list) and d and all(isinstance(n, int) for n in d)]
    return sum(math.prod(d) for d in tensors)


def _dominant_shapes(ops: pd.DataFrame) -> pd.Series:
    """(rank, name) -> the input shapes it spends most time in."""
    top = ops.sort_values("sumUs", ascending=False, kind="stable").drop_duplicates(["rank", "name"])
    return top.set_index(["rank", "name"])["shapes"]


def _differs(a: str, b: str) -> int:
    """In how many dimensions two shapes of one operator differ (their inputs' ranks alike), else
    a number larger than any such count."""
    x, y = _dims(a), _dims(b)
    if [len(d) if isinstance(d, list) else -1 for d in x] != [len(d) if isinstance(d, list) else -1 for d in y]:
        return 1 << 30
    return sum(p != q for d, e in zip(x, y) if isinstance(d, list) for p, q in zip(d, e))


def _larger_in_place(calls: pd.DataFrame, rank: int, peers: int) -> tuple[str, str] | None:
    """Where the rank runs `calls`' operator with larger shapes in place of those most of its
    peers run (shapes no peer runs, more elements in all than its peers' calls of the shapes most
    of them run and it does not): its shapes it spends most time in, and the peers' shapes they
    replace that differ from them in the fewest dimensions (a batch of 64 against one of 32, not
    the weight gradient's shapes against the forward's). None where the rank's shapes only add
    to its peers': the summaries keep each rank's top operators, so a call that the machine's load
    stretched into one rank's top (a 0.5 ms aten::as_strided) is a shape its peers' summaries
    lack, not an input they do not have."""
    key = calls["shapes"].astype(str)
    theirs = calls["rank"] != rank
    runners = calls[theirs].groupby(key[theirs])["rank"].nunique()
    common = set(runners.index[2 * runners >= peers])
    new = calls[~theirs & ~key.isin(set(runners.index))]
    replaced = calls[theirs & key.isin(common - set(key[~theirs]))]
    if new.empty or replaced.empty:
        return None
    elements = calls["count"] * key.map(_elements)
    if float(elements[new.index].sum()) <= float(elements[replaced.index].groupby(replaced["rank"]).sum().median()):
        return None
    mine = str(key[new["sumUs"].idxmax()])
    time = replaced.groupby(key[replaced.index])["sumUs"].sum()
    return mine, min(time.index, key=lambda k: (_differs(mine, str(k)), -float(time[k])))


def _main_work(theirs: pd.Series) -> pd.Index:
    """The operators that carry half of the peers' operator time (`theirs`: their median time per
    step by name), the largest first."""
    order = theirs.sort_values(ascending=False, kind="stable")
    return order.index[: int(np.searchsorted(order.cumsum().to_numpy(), 0.5 * float(order.sum()))) + 1]


def _main_larger(ops: pd.DataFrame, rank: int, peers: int, theirs: pd.Series) -> str | None:
    """The operator, of those that carry half of its peers' operator time, to which the rank's inputs
    are larger than theirs (_larger_in_place); None where there is none. Larger inputs to the peers'
    main work are the rank's extra work whatever the machine's load did to each operator's time,
    which can put any operator at the top of the rank's excess (aten::randint, 1.3x its peers',
    beside aten::addmm on a 2.2x batch)."""
    return next(
        (str(n) for n in _main_work(theirs) if _larger_in_place(ops[ops["name"] == n], rank, peers) is not None), None
    )


def main_work_alike(tables: RankTables, rank: int) -> tuple[bool, bool]:
    """Whether the rank's operators' input shapes were recorded, and whether it runs its peers' main
    work (the operators that carry half of their time) with their shapes: the whole of its operators
    is no measure where a host stretched its small operators into its summary's top operators, with
    shapes its peers' summaries lack."""
    ops = tables.operators
    ranks = sorted(int(r) for r in tables.ranks["rank"])
    if ops.empty or rank not in set(ops["rank"]) or len(ranks) < 2:
        return False, False
    by_name = ops.groupby(["name", "rank"])["sumUs"].sum().unstack("rank").reindex(columns=ranks).fillna(0.0)
    main = _main_work(by_name.drop(columns=[rank]).median(axis=1))
    return shapes_alike(ops[ops["name"].isin(main)], rank)


def shapes_alike(ops: pd.DataFrame, rank: int) -> tuple[bool, bool]:
    """Whether the rank's operators' input shapes were recorded, and whether it runs the same
    (name, shapes) as its peers do (SAME_SHAPES of its operator time)."""
    keys = ops["name"].astype(str) + "\0" + ops["shapes"].astype(str)
    others = set(keys[ops["rank"] != rank])
    own = ops[ops["rank"] == rank]
    shared = float(own.loc[keys[own.index].isin(others), "sumUs"].sum()) / max(float(own["sumUs"].sum()), 1e-9)
    return bool((own["shapes"] != "").any()), shared >= SAME_SHAPES


def operator_cause(tables: RankTables, rank: int, steps: pd.Index) -> OperatorCause | None:
    """The operators' part of `rank`'s extra time over `steps` (those every rank captured); None
    when its operators take no longer than its peers' (by OPERATOR_RATIO, unless its inputs are
    larger than theirs: OperatorCause.larger, whose excess may then be none), or none were recorded."""
    ops = tables.operators
    ranks = sorted(int(r) for r in tables.ranks["rank"])
    if ops.empty or rank not in set(ops["rank"]) or len(ranks) < 2 or len(steps) == 0:
        return None
    per_step = tables.per_step_of(ops, steps)
    peers = per_step.drop(columns=[rank]).median(axis=1).to_numpy(dtype=float)
    mine = per_step[rank].to_numpy(dtype=float)
    excess = mine - peers
    typical = float(np.median(excess))
    # Which of its operators carry the excess, and whether its peers run them with the same shapes.
    by_name = ops.groupby(["name", "rank"])["sumUs"].sum().unstack("rank").reindex(columns=ranks).fillna(0.0)
    counts = tables.step_counts(np.asarray(ranks))
    by_name = by_name / counts
    theirs = by_name.drop(columns=[rank]).median(axis=1)
    operator = str((by_name[rank] - theirs).idxmax())
    known, same = shapes_alike(ops, rank)
    main = _main_larger(ops, rank, len(ranks) - 1, theirs) if known and not same else None
    # Operators that took no longer than its peers' are no cause, unless its inputs to their main
    # work are larger: then they are told as such (a loaded machine's noise hid what they cost).
    if typical <= 0 and main is None:
        return None
    operator = main or operator
    dominant = _dominant_shapes(ops)
    peer_shapes = [str(dominant[(r, operator)]) for r in ranks if r != rank and (r, operator) in dominant.index]
    shapes = str(dominant.get((rank, operator), ""))
    peers_shapes = max(set(peer_shapes), key=peer_shapes.count) if peer_shapes else ""
    # Its inputs to that operator over all of its calls (each shape's calls times its elements: the
    # dominant shapes of an operator may be different calls of it on different ranks) against its
    # peers' median.
    calls = ops[ops["name"] == operator]
    work = (
        (calls["count"] * calls["shapes"].astype(str).map(_elements))
        .groupby(calls["rank"])
        .sum()
        .reindex(ranks)
        .fillna(0.0)
    )
    inputs = float(work[rank]) - float(work.drop(rank).median())
    in_place = _larger_in_place(calls, rank, len(ranks) - 1) if known and not same and inputs > 0 else None
    if in_place is not None:
        shapes, peers_shapes = in_place
    # Smaller inputs that take longer are neither uneven shards of its own nor its peers' work run
    # slower: the operators tell nothing of it (a peer with the larger inputs may be the one).
    if known and not same and inputs < 0:
        return None
    # Its typical step against its peers': the median of each step's difference, not of each side
    # (operators a few ms long swing 3x from step to step on a loaded machine, on every rank, and
    # the medians of the two sides then fall in different steps).
    peers_us = float(np.median(peers))
    cause = OperatorCause(
        excessUsPerStep=typical,
        usPerStep=peers_us + typical,
        peersUsPerStep=peers_us,
        stepsUs=tuple(float(e) for e in excess),
        sameShapes=same,
        shapesKnown=known,
        operator=operator,
        shapes=shapes,
        peersShapes=peers_shapes,
        larger=in_place is not None,
        mainWork=main is not None and in_place is not None,
    )
    return cause if cause.larger or cause.ratio >= OPERATOR_RATIO else None
