"""The report page escapes what comes from the traces: a kernel or pod name is text, never markup
(the page is opened in a browser, and a trace is anyone's input)."""
from __future__ import annotations

import csv
import html
from pathlib import Path

import msgspec

from stepscope.analysis.model import encode
from stepscope.analysis.pipeline import analyze_uri
from stepscope.testing.synthetic_ranks import make_summaries

HOSTILE = '<img src=x onerror="alert(1)">&'


def test_names_from_traces_are_escaped(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for s in make_summaries(4, slow_rank=2, kernel_factor=1.5, seed=3):
        s.kernels = [msgspec.structs.replace(k, name=HOSTILE + k.name) for k in s.kernels]
        s.pod = HOSTILE
        (ranks / f"rank-{s.rank}.summary.json").write_bytes(encode(s))
    analyze_uri(str(tmp_path), progress=False)
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<img" not in page
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;&amp;" in page


def test_kernel_tables_show_a_readable_name_beside_the_full_one(tmp_path: Path) -> None:
    full = "void cutlass::device_kernel<flash::FlashAttnBwd<flash::CollectiveMainloopBwd<2, cute::tuple<cute::C<64>>>>>(flash::Params)"
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for s in make_summaries(2, slow_rank=1, kernel_factor=1.5, seed=3):
        s.kernels = [msgspec.structs.replace(s.kernels[0], name=full, sumUs=s.kernels[0].sumUs * 100), *s.kernels[1:]]
        (ranks / f"rank-{s.rank}.summary.json").write_bytes(encode(s))
    analyze_uri(str(tmp_path), progress=False)
    page = (tmp_path / "report" / "index.html").read_text()
    assert "cutlass::device_kernel&lt;flash::FlashAttnBwd&gt;<details" in page
    assert html.escape(full, quote=True).replace("&#x27;", "&#39;") in page
    with open(tmp_path / "report" / "op_statistic.csv", newline="") as f:
        top = next(csv.DictReader(f))
    assert (top["OP Type"], top["Short Name"]) == (full, "cutlass::device_kernel<flash::FlashAttnBwd>")
