"""A session of hundreds of ranks: its summaries read from the store a bounded number at a time into
one table, diagnosed over all ranks at once as it was rank by rank, and a report page that shows
distributions, the ranks that matter and a search instead of a bar and a row per rank."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import msgspec
import pandas as pd
import pytest

from stepscope.analysis.diagnosis.diagnose import diagnose
from stepscope.analysis.gathering import session_files
from stepscope.analysis.gathering.session_files import find_files, read_ranks
from stepscope.analysis.model import (
    CriticalPathSummary,
    PathShare,
    compact_schema,
    encode,
    encode_summary,
    table_summaries,
)
from stepscope.analysis.pipeline import analyze_uri
from stepscope.analysis.reporting.html import HISTOGRAM_BINS, MAX_RANK_ROWS
from stepscope.analysis.reporting.tables import DETAIL_RANKS
from stepscope.contracts import layout
from stepscope.storage import FileStore, S3Store, open_store
from stepscope.testing.synthetic_ranks import make_summaries


def _session(folder: Path, ranks: int, **kwargs) -> list:
    summaries = make_summaries(ranks, slow_rank=5, kernel_factor=1.3, seed=11, kernels=12, functions=2, **kwargs)
    (folder / "ranks").mkdir(parents=True)
    for s in summaries:
        (folder / layout.rank_summary(s.rank)).write_bytes(encode_summary(s))
    return summaries


def test_the_summaries_of_a_session_read_into_one_table_whatever_each_holds(tmp_path: Path) -> None:
    summaries = _session(tmp_path, 40)
    (tmp_path / layout.rank_summary(7)).unlink()
    (tmp_path / "ranks" / "rank-7.summary.json").write_bytes(encode(summaries[7]))  # as an older sidecar wrote it
    (tmp_path / layout.rank_summary(9)).write_bytes(encode_summary(summaries[9])[:-500])  # cut short
    (tmp_path / layout.rank_summary(12)).unlink()  # never uploaded
    read = read_ranks(find_files(open_store(str(tmp_path))))
    assert read.table.column("rank").to_pylist() == list(range(40))
    back = table_summaries(read.table)
    assert back[7] == summaries[7] and back[30] == summaries[30] and read.summaries == back
    assert "ranks/rank-9.summary.arrow is not a valid summary (not an Arrow summary" in back[9].error
    assert back[12].error == "no trace or summary was uploaded for this rank"
    assert set(read.problems) == {9, 12}


class _SlowStore(FileStore):
    """A folder whose reads take a while, like an object store's, counting those in flight."""

    parallel_reads = S3Store.parallel_reads

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(0.01)
            return super().get_bytes(key, max_bytes)
        finally:
            with self.lock:
                self.now -= 1


def test_summaries_are_read_several_at_a_time_and_no_more_than_the_bound(tmp_path: Path) -> None:
    _session(tmp_path, 120)
    store = _SlowStore(tmp_path)
    read = read_ranks(find_files(store))
    assert read.table.num_rows == 120 and not read.problems
    assert 2 <= store.most <= S3Store.parallel_reads


def test_the_diagnosis_over_the_table_is_the_diagnosis_over_the_summaries(tmp_path: Path) -> None:
    summaries = _session(tmp_path, 48, extra_step_us=20_000.0)
    summaries[20] = msgspec.structs.replace(summaries[20], error="trace truncated", kernels=[], steps=[])
    (tmp_path / layout.rank_summary(20)).write_bytes(encode_summary(summaries[20]))
    read = read_ranks(find_files(open_store(str(tmp_path))))
    from_table, from_objects = diagnose(read.table), diagnose(summaries)
    assert msgspec.json.encode(from_table[0]) == msgspec.json.encode(from_objects[0])
    assert [f.message for f in from_table[1]] == [f.message for f in from_objects[1]]
    assert [w.rank for w in from_table[0].slowWorkers] == [5]
    assert any(f.category == "trace" and f.ranks == [20] for f in from_table[1])


def test_summaries_read_in_several_chunks_make_one_compact_table_and_the_same_diagnosis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summaries = _session(tmp_path, 48, extra_step_us=20_000.0)
    monkeypatch.setattr(session_files, "COMPACT_EVERY", 7)  # several chunks, each with dictionaries of its own
    read = read_ranks(find_files(open_store(str(tmp_path))))
    assert read.table.schema.equals(compact_schema()) and {c.num_chunks for c in read.table.columns} == {1}
    assert table_summaries(read.table) == summaries
    assert msgspec.json.encode(diagnose(read.table)[0]) == msgspec.json.encode(diagnose(summaries)[0])


def test_the_report_of_hundreds_of_ranks_shows_distributions_the_ranks_that_matter_and_a_search(tmp_path: Path) -> None:
    ranks = 600
    summaries = make_summaries(ranks, slow_rank=5, kernel_factor=1.3, seed=2, kernels=12, functions=2)
    # Every rank with a critical path, rank 0's the shortest: the section shows the slow worker and the longest.
    summaries = [
        msgspec.structs.replace(
            s,
            criticalPath=CriticalPathSummary(
                totalUs=1000.0 + s.rank,
                startUs=0.0,
                endUs=1000.0 + s.rank,
                byBound={"cpu_bound": 1000.0 + s.rank},
                top=[PathShare("aten::addmm", "cpu_bound", 500.0)],
            ),
        )
        for s in summaries
    ]
    (tmp_path / "ranks").mkdir()
    for s in summaries:  # JSON, as older sidecars uploaded them: the report does not depend on the format
        (tmp_path / "ranks" / f"rank-{s.rank}.summary.json").write_bytes(encode(s))
    diagnosis = analyze_uri(str(tmp_path), progress=False)
    assert [w.rank for w in diagnosis.slowWorkers] == [5]
    page = (tmp_path / "report" / "index.html").read_text()
    # Two histograms and a hundred-odd ranks of the breakdown, not a bar (or four) per rank.
    assert page.count("<rect") <= 2 * HISTOGRAM_BINS + 4 * 110
    assert f"{ranks:,} ranks by ms, in {HISTOGRAM_BINS} bins" in page and "the rank at each percentile" in page
    assert re.search(r'fill="var\(--c2\)"><title>[^<]*: 1 ranks \(5\)</title>', page), "the slow worker's bin is marked"
    table = page.split("<h2>Ranks</h2>")[1].split("</section>")[0]
    rows = table.split("</table>")[-2].count("<tr")  # the ranks table, after the search's
    assert rows <= MAX_RANK_ROWS + 1 and '<tr class="slow"><td class="n">5</td>' in table
    data = json.loads(re.search(r'<script type="application/json" id="rank-data">(.*?)</script>', page, re.S)[1])
    assert (
        data["rank"] == list(range(ranks))
        and data["pods"][data["pod"][599]] == "train-74"
        and data["slowdown"] == {"5": round(diagnosis.slowWorkers[0].slowdown, 2)}
    )
    section = page.split("<h2>Critical path</h2>")[1].split("</section>")[0]
    shown = [int(r) for r in re.findall(r'<tr><td class="n">(\d+)</td>', section)]
    assert len(shown) == MAX_RANK_ROWS and 5 in shown and 599 in shown and 0 not in shown
    assert f"{MAX_RANK_ROWS} of {ranks:,} ranks here" in section
    assert (
        len(pd.read_csv(tmp_path / "report" / "critical_path.csv")) == 2 * ranks
    )  # every rank's bound and contributor
    assert len(page) < 400_000
    detail = (tmp_path / "report" / "kernel_details.csv").read_text().splitlines()[1:]
    held = {int(line.split(",")[0]) for line in detail}
    assert len(held) == DETAIL_RANKS and 5 in held and 0 in held
