"""The report page escapes what comes from the traces: a kernel or pod name is text, never markup
(the page is opened in a browser, and a trace is anyone's input)."""
from __future__ import annotations

from pathlib import Path

import msgspec
from synthetic_ranks import make_summaries

from stepscope.analysis.command import analyze_uri
from stepscope.analysis.model import encode

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
