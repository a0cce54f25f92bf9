"""Python functions (python_function events, recorded with with_stack=True), grouped by call stack.

A function's exclusive time is its duration minus its Python callees'; the part of it during
which no GPU event runs is what it costs the step (PerfTracker's bottleneck ratio divides that by
the captured wall time). Stacks are interned level by level (root first) with numpy, so the cost
grows with the depth of the call tree, not with a Python loop over events.
"""
from __future__ import annotations

import numpy as np

from stepscope.analysis.loading.trace import PYTHON_CAT, Trace

from ..model import FunctionStat
from . import intervals

MAX_STACK_FRAMES = 24


def _stack_ids(parent: np.ndarray, name: np.ndarray, n_names: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intern call stacks: (stack id of each event, parent stack of each stack, name code of each stack)."""
    n = len(parent)
    depth = np.zeros(n, dtype=np.int64)
    cur = parent.copy()
    # A cycle in broken parent ids must not loop forever: no real stack is this deep.
    for _ in range(10_000):
        live = cur >= 0
        if not live.any():
            break
        depth[live] += 1
        cur[live] = parent[cur[live]]
    sid = np.full(n, -1, dtype=np.int64)
    stack_parent: list[np.ndarray] = []
    stack_name: list[np.ndarray] = []
    base = 0
    for d in range(int(depth.max()) + 1 if n else 0):
        sel = np.flatnonzero(depth == d)
        psid = np.where(parent[sel] >= 0, sid[np.maximum(parent[sel], 0)], -1)
        keys, inverse = np.unique((psid + 1) * (n_names + 1) + name[sel], return_inverse=True)
        sid[sel] = base + inverse
        stack_parent.append(keys // (n_names + 1) - 1)
        stack_name.append(keys % (n_names + 1))
        base += len(keys)
    return sid, np.concatenate(stack_parent) if stack_parent else np.empty(0, np.int64), \
        np.concatenate(stack_name) if stack_name else np.empty(0, np.int64)


def _step_of(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index of the step each start time falls in (spans sorted by start), -1 outside every step."""
    order = np.argsort(starts, kind="stable")
    i = np.searchsorted(starts[order], ts, side="right") - 1
    inside = (i >= 0) & (ts < ends[order][np.maximum(i, 0)])
    return np.where(inside, order[np.maximum(i, 0)], -1)


def python_functions(trace: Trace, gpu_union: tuple[np.ndarray, np.ndarray], captured_us: float,
                     top: int = 50, steps: tuple[np.ndarray, np.ndarray] | None = None) -> list[FunctionStat]:
    """`steps`: the (starts, ends) of the trace's steps, in StepRow order; each stack then carries
    its exclusive time per step (a cause repeats every step, a hiccup does not)."""
    rows = np.flatnonzero(trace.cat_mask(PYTHON_CAT))
    if len(rows) == 0:
        return []
    dur, exposed = intervals.outside(gpu_union, trace.ts[rows], trace.dur[rows])
    parents = trace.python_parent[rows]
    parent = np.where(parents >= 0, intervals.lookup(trace.python_id[rows], parents), -1)
    has_parent = parent >= 0
    exclusive = dur - np.bincount(parent[has_parent], weights=dur[has_parent], minlength=len(rows))
    exclusive_exposed = exposed - np.bincount(parent[has_parent], weights=exposed[has_parent], minlength=len(rows))
    sid, stack_parent, stack_name = _stack_ids(parent, trace.name[rows].astype(np.int64), len(trace.names))
    n_stacks = len(stack_name)
    count = np.bincount(sid, minlength=n_stacks)
    # Callees lie inside their caller in real traces; clipping keeps broken nesting from giving
    # negative times or more exposed time than exclusive time.
    exclusive = np.maximum(exclusive, 0)
    excl = np.bincount(sid, weights=exclusive, minlength=n_stacks)
    excl_exposed = np.bincount(sid, weights=np.clip(exclusive_exposed, 0, exclusive), minlength=n_stacks)
    n_steps = len(steps[0]) if steps is not None else 0
    per_step = None
    if n_steps and steps is not None:
        step = _step_of(trace.ts[rows], np.asarray(steps[0], dtype=float), np.asarray(steps[1], dtype=float))
        inside = step >= 0
        per_step = np.bincount(sid[inside] * n_steps + step[inside], weights=exclusive[inside],
                               minlength=n_stacks * n_steps).reshape(n_stacks, n_steps)
    out = []
    for s in np.argsort(-excl_exposed, kind="stable")[:top]:
        frames: list[str] = []
        cur = int(s)
        while cur >= 0 and len(frames) < MAX_STACK_FRAMES:
            frames.append(trace.names[int(stack_name[cur])])
            cur = int(stack_parent[cur])
        stack = " > ".join(reversed(frames))
        if cur >= 0:
            stack = "... > " + stack
        out.append(FunctionStat(name=frames[0], stack=stack, count=int(count[s]), exclusiveUs=float(excl[s]),
                                notOverlappedUs=float(excl_exposed[s]),
                                bottleneckRatio=float(excl_exposed[s] / captured_us) if captured_us > 0 else 0.0,
                                stepsUs=[] if per_step is None else np.round(per_step[s], 1).tolist()))
    return out
