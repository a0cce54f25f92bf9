"""`stepscope diff`: kernels and functions added, removed, slower, faster; synthetic runs and the
real control/test pair HTA's trace diff ships."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepscope.analysis.comparison.diff import diff_runs, format_table
from stepscope.analysis.comparison.diff_command import compare
from stepscope.analysis.model import FunctionStat, KernelStat, encode
from stepscope.cli import main
from stepscope.testing.synthetic_ranks import make_summaries


def _changed_run():
    """Run B: one sgemm 1.5x longer, one elementwise kernel 20 % shorter, one kernel gone, a new
    kernel and a new Python function."""
    b = make_summaries(4, seed=31)
    for s in b:
        kernels = {k.name: k for k in s.kernels}
        for name, factor in (("volta_sgemm_128x64_nn_3", 1.5), ("void at::native::elementwise_kernel<7>", 0.8)):
            kernels[name].meanUs *= factor
            kernels[name].sumUs *= factor
        s.kernels = [k for k in s.kernels if k.name != "volta_sgemm_128x64_nn_11"]
        s.kernels.append(KernelStat(name="triton_fused_add_mul_0", type="COMP", count=40, sumUs=4000.0, meanUs=100.0, medianUs=100.0, minUs=90.0, maxUs=110.0))
        s.functions.append(FunctionStat(name="train.py(120): log_metrics", stack="train.py(120): log_metrics", count=4, exclusiveUs=80_000.0, notOverlappedUs=80_000.0))
    return make_summaries(4, seed=31), b


def test_diff_classifies_every_change():
    a, b = _changed_run()
    result = diff_runs(a, b)
    table = result.table.set_index("name")
    assert table.loc["volta_sgemm_128x64_nn_3", "status"] == "slower"
    assert table.loc["volta_sgemm_128x64_nn_3", "ratio"] == pytest.approx(1.5)
    assert table.loc["void at::native::elementwise_kernel<7>", "status"] == "faster"
    assert table.loc["volta_sgemm_128x64_nn_11", "status"] == "removed"
    assert table.loc["triton_fused_add_mul_0", "status"] == "added"
    assert table.loc["triton_fused_add_mul_0", "usB"] == pytest.approx(4000.0 / 4)
    assert (table.loc["train.py(120): log_metrics", ["kind", "status"]] == ["function", "added"]).all()
    assert table.loc["volta_sgemm_128x64_nn_0", "status"] == "unchanged"
    assert result.table["deltaUs"].abs().is_monotonic_decreasing
    assert result.ranksA == result.ranksB == 4 and result.stepMsA == result.stepMsB


def test_diff_cli_on_session_folders(tmp_path: Path, capsys: pytest.CaptureFixture):
    a, b = _changed_run()
    for name, run in (("a", a), ("b", b)):
        (tmp_path / name / "ranks").mkdir(parents=True)
        for s in run:
            (tmp_path / name / "ranks" / f"rank-{s.rank}.summary.json").write_bytes(encode(s))
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--csv", str(tmp_path / "d.csv"), "--json", str(tmp_path / "d.json")]) == 0
    out = capsys.readouterr().out
    assert "2 added, 1 removed, 1 slower, 1 faster" in out
    assert "volta_sgemm_128x64_nn_3" in out and "unchanged " not in out
    assert "note: compared from edge summaries" in out
    assert len(pd.read_csv(tmp_path / "d.csv")) == len(json.loads((tmp_path / "d.json").read_text())["rows"])
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "missing")]) == 1
    assert "missing does not exist" in capsys.readouterr().err


def _raw_kernels(path: Path) -> pd.DataFrame:
    """Kernel, memcpy and memset events straight from the JSON, to check the diff independently."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    rows = [(e["name"], e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return pd.DataFrame(rows, columns=["name", "dur"])


def test_diff_on_the_real_control_and_test_traces(shared_traces: Path, capsys: pytest.CaptureFixture):
    control = shared_traces / "hta__trace_diff_control" / "control.json.gz"
    test = shared_traces / "hta__trace_diff_test" / "test.json.gz"
    result, partial = compare(str(control), str(test))
    assert not partial
    table = result.table[result.table["kind"] == "kernel"].set_index("name")
    raw_a, raw_b = _raw_kernels(control), _raw_kernels(test)
    names_a, names_b = set(raw_a["name"]), set(raw_b["name"])
    assert set(table.index[table["status"] == "added"]) == names_b - names_a
    assert set(table.index[table["status"] == "removed"]) == names_a - names_b
    mean_a, mean_b = raw_a.groupby("name")["dur"].mean(), raw_b.groupby("name")["dur"].mean()
    both = sorted(names_a & names_b)
    expected = (mean_b[both] / mean_a[both]).rename("expected")
    # The summaries count kernels inside the profiled steps (HTA's scope), the raw means every
    # event in the file, so the ratios agree closely but not exactly; clear changes agree in kind.
    assert (table.loc[both, "ratio"] - expected).abs().median() < 0.05
    # Slower or faster by the cost per step (both files hold 6 steps): the raw totals' ratio.
    cost_a, cost_b = raw_a.groupby("name")["dur"].sum(), raw_b.groupby("name")["dur"].sum()
    cost = (cost_b[both] / cost_a[both]).rename("cost")
    clear = (cost_b[both] - cost_a[both]).abs() / 6 >= 0.01 * 1000 * result.stepMsB
    assert (table.loc[cost.index[(cost > 1.5) & clear], "status"] == "slower").all()
    assert (table.loc[cost.index[(cost < 1 / 1.5) & clear], "status"] == "faster").all()
    assert ((cost > 1.5) & clear).sum() >= 3
    assert result.stepMsB > result.stepMsA

    assert main(["diff", str(control), str(test), "--top", "5", "--kind", "kernel"]) == 0
    out = capsys.readouterr().out
    assert f"{len(names_b - names_a)} added, {len(names_a - names_b)} removed" in out
    assert "note: compared from edge summaries" not in out


def _jittered(seed: int, spread: float) -> list:
    """The same job again on a noisy machine: every step, kernel and function up to `spread`
    longer or shorter, as in two captures of one CPU demo job."""
    rng = np.random.default_rng(seed)
    run = make_summaries(4, seed=41)
    for s in run:
        for row in s.steps:
            row.durationUs *= rng.uniform(1 - spread, 1 + spread)
        for k in s.kernels:
            f = rng.uniform(1 - spread, 1 + spread)
            k.sumUs, k.meanUs = k.sumUs * f, k.meanUs * f
        for fn in s.functions:
            fn.exclusiveUs *= rng.uniform(1 - spread, 1 + spread)
    return run


def test_two_runs_of_the_same_job_report_no_change():
    """The old diff called dozens of items slower or faster between two captures of one job; the
    step-to-step spread inside each capture sets the noise band, within which nothing changed."""
    result = diff_runs(_jittered(1, 0.15), _jittered(2, 0.15))
    counts = result.table["status"].value_counts()
    assert counts.get("slower", 0) == 0 and counts.get("faster", 0) == 0, result.table.head(10)
    assert result.noise >= 0.05


def test_cost_per_step_decides_not_time_per_call():
    a = make_summaries(4, seed=43)
    b = make_summaries(4, seed=43)
    for s in b:
        k = next(k for k in s.kernels if k.name == "volta_sgemm_128x64_nn_3")
        # twice as many calls, each 0.8x as long: 1.6x the cost per step
        k.count, k.meanUs, k.sumUs = k.count * 2, k.meanUs * 0.8, k.sumUs * 1.6
    row = diff_runs(a, b).table.set_index("name").loc["volta_sgemm_128x64_nn_3"]
    assert row["status"] == "slower" and row["ratio"] == pytest.approx(0.8) and row["deltaUs"] > 0


def test_the_rank_that_changed_is_shown_and_long_names_stay_apart():
    a = make_summaries(4, seed=44)
    b = make_summaries(4, seed=44)
    steps = len(b[2].steps)
    b[2].functions.append(FunctionStat(name="train.py(77): rebuild_index", stack="train.py(77): rebuild_index", count=steps,
                                       exclusiveUs=60_000.0 * steps, notOverlappedUs=60_000.0 * steps))
    long = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, at::native::MulFunctor<float>>, " \
           "at::detail::Array<char*, 3>>(int, at::native::BinaryFunctor<float, float, float, at::native::MulFunctor<float>>, variant{}"
    for run, variant in ((a, "1"), (b, "2")):
        for s in run:
            s.kernels.append(KernelStat(name=long + variant + ")", type="COMP", count=4, sumUs=400.0, meanUs=100.0, medianUs=100.0, minUs=90.0, maxUs=110.0))
    result = diff_runs(a, b)
    row = result.table.set_index("name").loc["train.py(77): rebuild_index"]
    assert row["rank"] == 2 and row["rankDeltaUs"] == pytest.approx(60_000.0) and row["usB"] == pytest.approx(15_000.0)
    text = format_table(result.table[result.table["name"].str.startswith(long)], top=5)
    assert "variant{}1)" in text and "variant{}2)" in text
    assert "rank 2: +60,000.0" in format_table(result.table, top=3)


def test_a_one_step_hiccup_of_a_function_is_within_its_own_noise():
    """A busy machine stretched one call in one step: the function's own step-to-step spread
    (FunctionStat.stepsUs) covers it; a function slower in every step is still slower."""
    def run(hiccup: list[float], steady: list[float]) -> list:
        summaries = make_summaries(2, seed=45)
        for s in summaries:
            for name, per_step in (("train.py(9): load_batch", hiccup), ("train.py(12): augment", steady)):
                s.functions.append(FunctionStat(name=name, stack=name, count=len(per_step), exclusiveUs=sum(per_step),
                                                notOverlappedUs=sum(per_step), stepsUs=per_step))
        return summaries

    table = diff_runs(run([300.0] * 4, [5_000.0] * 4), run([300.0, 24_000.0, 300.0, 300.0], [9_000.0, 9_100.0, 8_900.0, 9_000.0])).table.set_index("name")
    assert table.loc["train.py(9): load_batch", "status"] == "unchanged"
    assert table.loc["train.py(12): augment", "status"] == "slower"
