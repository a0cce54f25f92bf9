"""The report's CSV tables agree with the summaries they come from."""
from __future__ import annotations

import pytest

from stepscope.analysis.diagnosis.rank_tables import build_tables
from stepscope.analysis.reporting.tables import report_tables
from stepscope.testing.synthetic_ranks import make_summaries


def test_tables_add_up():
    summaries = make_summaries(6, slow_rank=2, kernel_factor=1.4, seed=41)
    csv = report_tables(build_tables(summaries))
    steps = csv["step_trace_time.csv"]
    assert len(steps) == sum(len(s.steps) for s in summaries)
    assert steps["Stage"].to_numpy() == pytest.approx((steps["Computing"] + steps["Communication(Not Overlapped)"] + steps["Free"]).to_numpy())

    ops = csv["op_statistic.csv"]
    assert ops["Ratio(%)"].sum() == pytest.approx(100.0)
    assert ops["Count"].sum() == sum(k.count for s in summaries for k in s.kernels)
    assert (ops["Ranks"] == 6).all() and ops["Total Time(us)"].is_monotonic_decreasing

    kernels = csv["kernel_details.csv"]
    compute = kernels[kernels["Type"] == "COMP"]
    assert compute[compute["Rank"] == 2]["Ratio To Peers"].between(1.35, 1.45).all()
    assert compute[compute["Rank"] != 2]["Ratio To Peers"].between(0.95, 1.05).all()

    comm = csv["communication.csv"]
    assert list(comm["Rank"]) == list(range(6)) and set(comm["Collective"]) == {"AllReduce"}
