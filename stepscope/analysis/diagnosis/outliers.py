"""Robust outlier tests over per-rank values (median / MAD), shared by the diagnosis checks.

A mean and standard deviation are dragged by the very straggler they should find; the median and
the median absolute deviation are not, as long as fewer than half of the ranks are slow.
"""

from __future__ import annotations

import warnings

import numpy as np

# Scales the MAD to a standard deviation for normal data, so thresholds read as "sigmas".
MAD_SCALE = 1.4826
# Iglewicz and Hoaglin's cut-off for the modified z-score.
Z_THRESHOLD = 3.5


def peer_median(values: np.ndarray) -> np.ndarray:
    """For each entry (along axis 0), the median of the OTHER entries: a rank's peers without
    itself, so that with two or three ranks the slow one is not half of its own reference."""
    values = np.asarray(values, dtype=float)
    n = values.shape[0]
    if n < 2:
        return values.copy()
    m = n - 1
    low = m // 2 - 1 if m % 2 == 0 else m // 2
    # Only the order statistics around the middle matter, so a partition (linear) replaces a sort.
    kth = sorted({max(low, 0), low + 1, min(low + 2, n - 1)})
    middle = np.partition(values, kth, axis=0)

    def remaining(k: int) -> np.ndarray:
        # The k-th smallest of the others is the k-th smallest of all where the entry lies above it
        # (NaN sorts last), else the (k+1)-th; an entry equal to the k-th changes nothing either way.
        above = (values > middle[k]) | np.isnan(values)
        return np.where(above, middle[k], middle[k + 1])

    if m % 2:
        return remaining(m // 2)
    return 0.5 * (remaining(m // 2 - 1) + remaining(m // 2))


def stands_out(
    values: np.ndarray, *, min_ratio: float, min_excess: float | np.ndarray = 0.0, floor_fraction: float = 0.01
) -> np.ndarray:
    """Mask of entries far above their peers (along axis 0): at least `min_ratio` times and
    `min_excess` above the peers' median and, with four or more ranks, a robust z above the
    threshold too (a ratio alone cannot tell a straggler from a wide healthy spread)."""
    values = np.asarray(values, dtype=float)
    n = values.shape[0]
    if n < 2:
        return np.zeros(values.shape, dtype=bool)
    peers = peer_median(values)
    mask = (values >= peers * min_ratio) & (values - peers >= min_excess) & (values > 0)
    if n >= 4:
        median = np.median(values, axis=0)
        spread = np.maximum(MAD_SCALE * np.median(np.abs(values - median), axis=0), np.abs(median) * floor_fraction)
        z = (values - median) / np.maximum(spread, 1e-12)
        mask &= z > Z_THRESHOLD
    return mask


def group_matrices(groups: np.ndarray) -> list[np.ndarray]:
    """The entries of each group (`groups`: an integer code per entry) as columns of matrices, one
    matrix (size x groups) for each group size, so that a column-wise test or median covers
    thousands of groups with no Python loop per group."""
    groups = np.asarray(groups)
    if not len(groups):
        return []
    # A stable sort of 16-bit numbers is a radix sort: millions of entries at memory speed.
    order = np.argsort(groups.astype(np.int16) if 0 <= groups.min() and groups.max() < 2**15 else groups, kind="stable")
    ordered = groups[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    sizes = np.diff(np.append(starts, len(ordered)))
    return [order[starts[sizes == size][None, :] + np.arange(size)[:, None]] for size in np.unique(sizes)]


def stands_out_in_groups(values: np.ndarray, groups: np.ndarray, *, min_ratio: float) -> np.ndarray:
    """stands_out within each group of entries (`groups`: an integer code per entry), for every
    group at once (the test is column-wise and blind to the order within a column)."""
    values = np.asarray(values, dtype=float)
    out = np.zeros(len(values), dtype=bool)
    for entries in group_matrices(groups):
        out[entries] = stands_out(values[entries], min_ratio=min_ratio)
    return out


def group_medians(values: np.ndarray, groups: np.ndarray, count: int, matrices: list[np.ndarray]) -> np.ndarray:
    """The median of `values` in each group 0..count-1 (`matrices`: group_matrices(groups)); NaN
    for an empty group, NaNs left out as pandas' groupby does."""
    values = np.asarray(values, dtype=float)
    median = np.nanmedian if np.isnan(values).any() else np.median
    out = np.full(count, np.nan)
    for entries in matrices:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a group of NaNs only is NaN, as in pandas
            out[np.asarray(groups)[entries[0]]] = median(values[entries], axis=0)
    return out


def falls_behind(values: np.ndarray, *, max_ratio: float) -> np.ndarray:
    """Mask of entries far below their peers (e.g. a rank's bus bandwidth)."""
    values = np.asarray(values, dtype=float)
    if values.shape[0] < 2:
        return np.zeros(values.shape, dtype=bool)
    return values <= peer_median(values) * max_ratio


def vote_share_threshold(ranks: int, rounds: int) -> float:
    """Share of rounds one rank must win to stand out from chance (expected 1/ranks per round):
    three binomial standard deviations above the expectation, and never below 30 %."""
    p = 1.0 / max(ranks, 1)
    return max(p + 3.0 * float(np.sqrt(p * (1.0 - p) / max(rounds, 1))), 0.3)
