"""stepscope.analysis's facade: what the sidecar, the analysis Job and the CLI call."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stepscope import analysis
from stepscope.analysis.model import encode
from stepscope.contracts import layout
from stepscope.testing.synthetic_ranks import make_summaries


def test_importing_the_facade_loads_no_stage() -> None:
    """The sidecar imports it at start: no pandas, numpy or stage module until a function runs."""
    code = ("import sys, stepscope.analysis; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'numpy') or m.startswith('stepscope.analysis.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_load_diagnose_report_and_diff_of_one_session(tmp_path: Path) -> None:
    session = tmp_path / "session"
    for s in make_summaries(4, seed=5, slow_rank=2, kernel_factor=1.3):
        path = session / layout.rank_summary(s.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode(s))
    read = analysis.load(str(session))
    assert [s.rank for s in read.summaries] == [0, 1, 2, 3] and not read.problems
    diagnosis, findings = analysis.diagnose(read.summaries, stacks=read.stacks)
    assert findings[0].category == "slow-worker" and findings[0].ranks == [2] and findings[0].score > 0
    reported = analysis.report(str(session), output=str(tmp_path / "out"), progress=False)
    assert reported == diagnosis and (tmp_path / "out" / "index.html").is_file()
    changes, partial = analysis.diff(str(session), str(session))
    assert partial and set(changes.table["status"]) == {"unchanged"}
