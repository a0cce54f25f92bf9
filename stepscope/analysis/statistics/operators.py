"""Operator time by name and input shapes: each CPU operator's own time (its duration less its
child operators'), on the thread that runs most of them (the training thread; autograd's CPU work
runs there too), each step apart. Own time, as an operator that encloses another (aten::linear
around aten::addmm) would count the same time twice.

Operators on one thread nest: sorted by start (the longer first), an operator's enclosing ones are
the earlier ones that end after it starts, and its parent the last earlier one a level up; both are
found level by level with numpy, as python_functions interns stacks. Collectives and their waits
are left out: the rank the others wait for waits least there, which is no operator work of its own.
"""
from __future__ import annotations

import re

import numpy as np

from stepscope.analysis.loading.trace import OPERATOR_CAT, Trace

from ..model import OperatorStat
from .python_functions import _step_of

# Operators that wait for peers (gloo/NCCL collectives, DDP's reducer hooks into them).
# autograd's evaluate_function wraps each backward node: its own time is the hooks run there (DDP's
# reducer), not an operator.
WAITING_OPERATORS = re.compile(r"c10d::|gloo|nccl|record_param_comms|^ProfilerStep|allreduce|barrier|wait|^autograd::engine::evaluate_function",
                               re.IGNORECASE)


def _depths(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For events sorted by (start, longer first) on one thread: how many earlier events end after
    each one starts (its enclosing ones). The events that end by its start are every event ending
    by then, less those later in the order that do: zero-length events at that same start."""
    position = np.arange(len(ts))
    ended = np.searchsorted(np.sort(end), ts, side="right")
    zero = np.flatnonzero(end <= ts)
    # Zero-length events at the same start, at or after each position in the order.
    later = np.searchsorted(ts[zero], ts, side="right") - np.maximum(np.searchsorted(zero, position, side="left"),
                                                                    np.searchsorted(ts[zero], ts, side="left"))
    return np.maximum(position - (ended - later), 0)


def _children_time(ts: np.ndarray, end: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Each event's children's summed duration (events sorted as _depths wants)."""
    depth = _depths(ts, end)
    children = np.zeros(len(ts))
    for d in range(1, int(depth.max()) + 1 if len(depth) else 0):
        parents = np.flatnonzero(depth == d - 1)
        kids = np.flatnonzero(depth == d)
        if len(parents) == 0 or len(kids) == 0:
            continue
        parent = parents[np.maximum(np.searchsorted(parents, kids, side="right") - 1, 0)]
        children += np.bincount(parent, weights=dur[kids], minlength=len(ts))
    return np.minimum(children, dur)


def operator_stats(trace: Trace, steps: tuple[np.ndarray, np.ndarray] | None, top: int = 50) -> list[OperatorStat]:
    rows = np.flatnonzero(trace.cat_mask(OPERATOR_CAT) & ~trace.name_mask(lambda n: WAITING_OPERATORS.search(n) is not None))
    if len(rows) == 0:
        return []
    tids, per_tid = np.unique(trace.tid[rows], return_counts=True)
    rows = rows[trace.tid[rows] == tids[np.argmax(per_tid)]]
    rows = rows[np.lexsort((-trace.dur[rows], trace.ts[rows]))]
    ts, end = trace.ts[rows], trace.end[rows]
    dur = np.maximum(trace.dur[rows], 0.0)
    dur = dur - _children_time(ts, end, dur)
    # One key per (name, shapes): name code times the number of shape codes, plus the shape code.
    n_shapes = len(trace.shape_texts) + 1
    keys, key_of = np.unique(trace.name[rows].astype(np.int64) * n_shapes + trace.shape[rows] + 1, return_inverse=True)
    sums = np.bincount(key_of, weights=dur, minlength=len(keys))
    counts = np.bincount(key_of, minlength=len(keys))
    per_step = None
    if steps is not None and len(steps[0]):
        n_steps = len(steps[0])
        step = _step_of(ts, np.asarray(steps[0], dtype=float), np.asarray(steps[1], dtype=float))
        inside = step >= 0
        per_step = np.bincount(key_of[inside] * n_steps + step[inside], weights=dur[inside],
                               minlength=len(keys) * n_steps).reshape(len(keys), n_steps)
    out = []
    for k in np.argsort(-sums, kind="stable")[:top]:
        shape = int(keys[k] % n_shapes) - 1
        out.append(OperatorStat(name=trace.names[int(keys[k] // n_shapes)], shapes=trace.shape_texts[shape] if shape >= 0 else "",
                                count=int(counts[k]), sumUs=float(sums[k]),
                                stepsUs=[] if per_step is None else np.round(per_step[k], 1).tolist()))
    return out
