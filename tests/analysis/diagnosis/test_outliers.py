"""The robust outlier functions against their definitions, on ties and all sizes of a job."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stepscope.analysis.diagnosis import outliers, slow_workers
from stepscope.analysis.diagnosis.outliers import peer_median


@pytest.mark.parametrize("ranks", range(2, 12))
def test_each_entrys_peer_median_is_the_median_of_the_others(ranks: int) -> None:
    rng = np.random.default_rng(ranks)
    for values in (rng.normal(size=(ranks, 6)), rng.integers(0, 3, size=(ranks, 6)).astype(float)):  # ties too
        others = np.array([np.median(np.delete(values, i, axis=0), axis=0) for i in range(ranks)])
        assert np.array_equal(peer_median(values), others)
        assert np.array_equal(peer_median(values[:, 0]), others[:, 0])


@pytest.mark.parametrize("bitmap_cells", [slow_workers._BITMAP_CELLS, 0], ids=["bitmap", "hashed"])
def test_the_ranks_running_each_kernel_are_counted_once_each(
    monkeypatch: pytest.MonkeyPatch, bitmap_cells: int
) -> None:
    monkeypatch.setattr(slow_workers, "_BITMAP_CELLS", bitmap_cells)
    rng = np.random.default_rng(5)
    codes, ranks = rng.integers(0, 40, 5000), rng.integers(0, 70, 5000)  # many rows of one kernel on one rank
    counted = slow_workers._ranks_running(codes, ranks, 41, 70)
    assert counted.tolist() == [len(set(ranks[codes == k])) for k in range(41)]


def test_group_medians_are_pandas_group_medians_nans_and_empty_groups_included() -> None:
    rng = np.random.default_rng(9)
    groups = rng.integers(0, 50, 4000)  # groups of every size, 50 .. 53 empty
    values = rng.normal(size=4000)
    values[rng.random(4000) < 0.05] = np.nan
    values[groups == 7] = np.nan  # a group of NaNs only
    expected = pd.Series(values).groupby(groups).median().reindex(range(54)).to_numpy()
    got = outliers.group_medians(values, groups, 54, outliers.group_matrices(groups))
    assert np.allclose(got, expected, equal_nan=True)
