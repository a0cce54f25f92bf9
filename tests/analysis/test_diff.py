"""`stepscope diff`: kernels and functions added, removed, slower, faster; synthetic runs and the
real control/test pair HTA's trace diff ships."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from stepscope.analysis.diff import diff_runs
from stepscope.analysis.diff_command import compare
from stepscope.analysis.model import FunctionStat, KernelStat, encode
from stepscope.cli import main
from synthetic_ranks import make_summaries


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
    assert (table.loc[expected.index[expected > 1.5], "status"] == "slower").all()
    assert (table.loc[expected.index[expected < 1 / 1.5], "status"] == "faster").all()
    assert (expected > 1.5).sum() >= 5 and (expected < 1 / 1.5).sum() >= 5
    assert result.stepMsB > result.stepMsA

    assert main(["diff", str(control), str(test), "--top", "5", "--kind", "kernel"]) == 0
    out = capsys.readouterr().out
    assert f"{len(names_b - names_a)} added, {len(names_a - names_b)} removed" in out
    assert "note: compared from edge summaries" not in out
