"""Vectorised interval arithmetic on [start, end) microsecond intervals (numpy, no Python loops),
and the key lookups and per-key statistics the metrics share.

`merge` reproduces HTA's `merge_kernel_intervals` exactly (including its treatment of the
negative-length intervals that inward rounding can produce), so unions, idle time and overlaps
computed from it match HTA number by number.
"""
from __future__ import annotations

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted disjoint groups (HTA: a new group starts where ts > max end so far)."""
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = ends[order]
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > np.maximum.accumulate(e)[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def length(starts: np.ndarray, ends: np.ndarray) -> float:
    return float((ends - starts).sum())


def sweep(sets: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HTA's status sweep over merged interval sets: set k adds 2**k while open.

    Returns (start, running, length) for each segment between consecutive boundaries: `running` is
    the bitmask of the sets open in the segment and `length` its duration (µs).
    """
    times = np.concatenate([np.concatenate([s, e]) for s, e in sets]) if sets else np.empty(0)
    steps = np.concatenate([np.concatenate([np.full(len(s), 1 << k), np.full(len(e), -(1 << k))])
                            for k, (s, e) in enumerate(sets)]) if sets else np.empty(0, dtype=np.int64)
    if len(times) == 0:
        return np.empty(0), np.empty(0, dtype=np.int64), np.empty(0)
    order = np.argsort(times, kind="stable")
    times = times[order]
    running = np.cumsum(steps[order])
    return times[:-1], running[:-1], np.diff(times)


def intersection(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Time covered by both merged sets."""
    _, running, seconds = sweep([a, b])
    return float(seconds[running == 3].sum())


def covered(merged: tuple[np.ndarray, np.ndarray], starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each [start, end), the time inside the union `merged` (sorted, disjoint)."""
    ms, me = merged
    if len(ms) == 0:
        return np.zeros(len(starts))
    lengths = np.maximum(me - ms, 0)
    before = np.concatenate([[0.0], np.cumsum(lengths)])

    def upto(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(ms, x, side="right") - 1
        inside = np.clip(x - ms[np.maximum(k, 0)], 0, lengths[np.maximum(k, 0)])
        return np.where(k >= 0, before[np.maximum(k, 0)] + inside, 0.0)

    return np.maximum(upto(np.maximum(ends, starts)) - upto(starts), 0.0)


def outside(merged: tuple[np.ndarray, np.ndarray], starts: np.ndarray,
            durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(duration, time outside the union `merged`) of each interval; negative durations count as 0."""
    dur = np.maximum(durations, 0)
    return dur, dur - covered(merged, starts, starts + dur)


def lookup(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index into `keys` of each wanted value (its first occurrence), -1 where absent."""
    if len(keys) == 0:
        return np.full(len(wanted), -1)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, wanted), len(keys) - 1)
    return np.where(sorted_keys[pos] == wanted, order[pos], -1)


def group_stats(keys: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
    """count, sum, mean, median, min, max and sample std of `values` per distinct key (sorted keys)."""
    order = np.lexsort((values, keys))
    k = keys[order]
    v = values[order]
    if len(k) == 0:
        empty = np.empty(0)
        return {"key": k, "count": empty.astype(np.int64), "sum": empty, "mean": empty, "median": empty,
                "min": empty, "max": empty, "std": empty}
    first = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
    count = np.diff(np.append(first, len(k)))
    total = np.add.reduceat(v, first)
    mean = total / count
    dev = (v - np.repeat(mean, count)) ** 2
    var = np.add.reduceat(dev, first) / np.maximum(count - 1, 1)
    lo = first + (count - 1) // 2
    hi = first + count // 2
    return {"key": k[first], "count": count, "sum": total, "mean": mean, "median": (v[lo] + v[hi]) / 2,
            "min": v[first], "max": v[first + count - 1], "std": np.where(count > 1, np.sqrt(var), 0.0)}
