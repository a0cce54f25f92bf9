"""The merged Perfetto trace: the text rewrite on the shapes Kineto and other writers produce, the
size limit on the uncompressed JSON, and the file `stepscope analyze` writes, read back with a
standard JSON parser."""

from __future__ import annotations

import gzip
import io
import json
import re
import shutil
from concurrent.futures import Executor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from stepscope.analysis.diagnosis.rank_tables import build_tables
from stepscope.analysis.loading.parallel import pool_workers, worker_pool
from stepscope.analysis.model import RankSummary, StepRow
from stepscope.analysis.pipeline import analyze_uri
from stepscope.analysis.reporting.merged_trace import (
    MergedTrace,
    MergePlan,
    MergeRank,
    expected_size,
    merge_order,
    shift_ts,
    write_merged_trace,
)
from stepscope.contracts import layout


def _write(path: Path, events: list[dict], text: str | None = None, base_ns: int = 0) -> Path:
    data = (text if text is not None else json.dumps({"baseTimeNanoseconds": base_ns, "traceEvents": events})).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _merge(
    ranks: list[MergeRank], counters: list[dict] | None = None, limit: int = 1 << 30
) -> tuple[dict, MergedTrace, bytes]:
    out = io.BytesIO()
    with worker_pool(1) as pool:
        result = write_merged_trace(out, MergePlan(ranks, counters or [], limit), pool=pool)
    text = gzip.decompress(out.getvalue())
    return json.loads(text), result, text


def test_odd_pids_ids_and_spacing_stay_valid_and_apart(tmp_path: Path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        {"ph": "X", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5},
        {"ph": "X", "name": "span", "pid": "Spans", "tid": "x", "ts": 11, "dur": 1},
        {"ph": "X", "name": "neg", "pid": -1, "tid": 1, "ts": 12, "dur": 1, "args": {"pid": "not a pid", "id": None}},
        {"ph": "s", "name": "flow-s", "pid": 783658, "tid": 1, "ts": 12, "id": 0, "cat": "ac2g"},
        {"ph": "f", "name": "flow-f", "pid": 0, "tid": 7, "ts": 13, "id": "abc", "cat": "ac2g", "bp": "e"},
    ]
    a = _write(tmp_path / "a.json", events)
    # The same events written with other spacing, as other writers would, and both mixed.
    b = _write(tmp_path / "b.json", [], text=json.dumps({"traceEvents": events}, separators=(",", " :  ")))
    mixed = [json.dumps(e) for e in events[:3]] + [json.dumps(e, separators=(",", ":")) for e in events[3:]]
    c = _write(tmp_path / "c.json", [], text='{"traceEvents": [' + ", ".join(mixed) + "]}")
    trace, result, _ = _merge([MergeRank(0, a), MergeRank(3, b), MergeRank(4, c)])
    merged = trace["traceEvents"]
    assert result.left_out == {} and result.ranks == [0, 3, 4]
    xs = [e for e in merged if e["ph"] != "M"]
    n = len(events) - 1
    assert len(xs) == 3 * n
    rank0 = {e["name"]: e for e in xs[:n]}
    rank3 = {e["name"]: e for e in xs[n : 2 * n]}
    assert {e["pid"] for e in xs[2 * n :] if isinstance(e["pid"], int)} <= {1000040, 100004783658} | {
        int(f"200004{i}") for i in range(3)
    }
    assert rank0["k"]["pid"] == 1000000 and rank3["k"]["pid"] == 1000030
    assert rank0["flow-s"]["id"] == 1000000 and rank3["flow-s"]["id"] == 1000030
    assert rank0["flow-f"]["id"] == rank3["flow-f"]["id"] == "abc"
    assert str(rank3["span"]["pid"]).startswith("200003") and str(rank3["neg"]["pid"]).startswith("200003")
    # The text rewrite cannot tell an args "pid" from the event's own: it is renumbered alike, and
    # JSON stays valid.
    assert str(rank0["neg"]["args"]["pid"]).startswith("200000") and rank0["neg"]["args"]["id"] is None
    names = {e["pid"]: e["args"]["name"] for e in merged if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[1000000] == "rank 0: GPU 0" and names[1000030] == "rank 3: GPU 0"
    assert names[rank3["span"]["pid"]] == "rank 3: Spans"


def test_time_bases_are_aligned_and_bad_ranks_left_out(tmp_path: Path):
    events = [
        {"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 100, "dur": 5},
        {"ph": "X", "name": "f", "pid": 1, "tid": 1, "ts": 7.125, "dur": 1},
        {"ph": "i", "name": "neg", "pid": 1, "tid": 1, "ts": -3, "s": "t"},
        {"ph": "i", "name": "exp", "pid": 1, "tid": 1, "ts": 1.5e2, "s": "t"},
    ]
    a = _write(tmp_path / "a.json", events, base_ns=1_000_000_000)
    b = _write(tmp_path / "b.json.gz", events, base_ns=1_000_250_000)
    cut = tmp_path / "c.json.gz"
    cut.write_bytes(gzip.compress(a.read_bytes())[:-10])
    counters = [
        {"ph": "C", "name": "GPU 0 SM clock (MHz)", "pid": 10_000_000, "tid": 0, "ts": 1.0, "args": {"value": 1980.0}}
    ]
    # Rank 1's clock starts 250 us later: its events move 250 us on (b was parsed already this run).
    trace, result, _ = _merge(
        [MergeRank(0, a), MergeRank(1, b, shift_us=250, checked=True), MergeRank(2, cut)], counters
    )
    assert (
        result.ranks == [0, 1] and list(result.left_out) == [2] and "left out of the merged trace" in result.left_out[2]
    )
    merged = trace["traceEvents"]
    ts = {(e["pid"], e["name"]): e["ts"] for e in merged if e["ph"] in "Xi"}
    assert ts == {
        (1000001, "k"): 100,
        (1000001, "f"): 7.125,
        (1000001, "neg"): -3,
        (1000001, "exp"): 150,
        (1000011, "k"): 350,
        (1000011, "f"): 257.125,
        (1000011, "neg"): 247,
        (1000011, "exp"): 400,
    }
    assert merged[0] == counters[0]
    assert trace["stepscope"]["leftOut"]["2"].startswith("left out of the merged trace")


def test_shift_keeps_every_number_shape_valid():
    body = (
        b'{"ts":1234,"x":1},{"ts":0.5},{"ts":99999.125,"dur":3},{"ts":-5},{"ts":1.5e3},{"ts":null},{"ts":"a"},{"ts":9},'
        b'{"ts": 77},{"ts":    8.25},{"ts":  -2}'
    )
    shifted = json.loads(b"[" + shift_ts(body, 1000) + b"]")
    assert [e["ts"] for e in shifted] == [2234, 1000.5, 100999.125, 995, 2500, None, "a", 1009, 1077, 1008.25, 998]


def test_shift_rewrites_kineto_spacing_in_place_and_makes_room_where_it_must():
    """Kineto writes `"ts": N`: a number that gains a digit takes the space; one that gains two
    cannot, and the piece is padded instead. Either way every value moves, fractions exact."""
    body = b'{"ts": 9999,"dur": 1},{"ts": 123.456},{"ts":    7}'
    shifted = shift_ts(body, 1)
    assert len(shifted) == len(body) and json.loads(b"[" + shifted + b"]") == [
        {"ts": 10000, "dur": 1},
        {"ts": 124.456},
        {"ts": 8},
    ]
    shifted = shift_ts(body, 99_990_000)
    assert json.loads(b"[" + shifted + b"]") == [{"ts": 99999999, "dur": 1}, {"ts": 99990123.456}, {"ts": 99990007}]


def _kineto_rank(path: Path, rank: int, events: int) -> Path:
    """A Kineto-shaped trace: metadata, CPU ops, kernels and flows, "pid": 1 spacing."""
    rows = [{"name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"name": "python3"}}]
    for i in range(events):
        rows.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"k{i % 7}",
                "pid": 0,
                "tid": 7,
                "ts": 10 * i,
                "dur": 4,
                "args": {"correlation": i, "stream": 7},
            }
        )
        rows.append({"ph": "f", "id": i, "pid": 0, "tid": 7, "ts": 10 * i, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    text = json.dumps({"distributedInfo": {"rank": rank}, "traceEvents": rows, "baseTimeNanoseconds": 5_000_000 + rank})
    return _write(path, [], text=text.replace("}, {", "},\n  {"))


@pytest.mark.parametrize("checked", [False, True])
def test_the_size_limit_is_never_exceeded(tmp_path: Path, checked: bool):
    sizes = [300, 40, 900, 120]
    ranks = [
        MergeRank(
            r,
            _kineto_rank(tmp_path / f"rank{r}.json{'.gz' if r % 2 else ''}", r, n),
            why=f"reason {r}",
            shift_us=r,
            checked=checked,
            size_hint=0,
        )
        for r, n in enumerate(sizes)
    ]
    ranks = [MergeRank(j.rank, j.path, j.why, j.shift_us, j.checked, expected_size(j.path)) for j in ranks]
    counters = [
        {"ph": "C", "name": "GPU 0 power (W)", "pid": 10_000_000, "tid": 0, "ts": float(t), "args": {"value": 300.0}}
        for t in range(50)
    ]
    _, everything, full = _merge(ranks, counters)
    assert everything.ranks == [0, 1, 2, 3] and everything.bytes == len(full)
    held_before = None
    # The footer saying what was left out and why is reserved at its largest (300 characters a reason).
    roomy = len(full) + 2 * len(ranks) * 330
    for limit in sorted(
        {
            100,
            3_000,
            len(full) // 3,
            len(full) // 2,
            len(full) - 1,
            len(full),
            len(full) + 1,
            roomy,
            *range(20_000, len(full), 23_456),
        }
    ):
        trace, result, text = _merge(ranks, counters, limit)
        assert len(text) <= limit and result.bytes == len(text)
        assert sorted(result.ranks + [int(r) for r in result.left_out]) == [0, 1, 2, 3]
        assert result.ranks == sorted(result.ranks, key=[0, 1, 2, 3].index)  # in the order given
        pids = {str(e["pid"])[1:6] for e in trace["traceEvents"] if e["ph"] != "C"}
        assert pids <= {f"{r:05d}" for r in result.ranks}
        assert "stepscope" not in trace or [h["rank"] for h in trace["stepscope"]["ranks"]] == result.ranks
        if held_before is not None:
            assert len(result.ranks) >= len(held_before)  # more room never holds fewer ranks
        held_before = result.ranks
    assert held_before == [0, 1, 2, 3]


@pytest.fixture()
def session_with_metrics(tmp_path: Path, shared_traces: Path) -> Path:
    """Two real Kineto ranks (raw traces only) and one node's NVML samples."""
    root = tmp_path / "session"
    (root / "ranks").mkdir(parents=True)
    pair = shared_traces / "hta__trace_filter_2rank"
    for rank in (0, 1):
        shutil.copy(pair / f"sampled_rank-{rank}.json.gz", root / layout.rank_trace(rank))
    base_us = (
        json.loads(gzip.decompress((pair / "sampled_rank-0.json.gz").read_bytes())).get("baseTimeNanoseconds", 0) / 1000
    )
    rows = [b"ts_us,gpu,sm_clock_mhz,gpu_util_pct,power_w,temperature_c,memory_used_mib,clock_reasons\n"]
    rows += [
        b"%d,%d,%d,%d,%d,60,1000,0\n" % (base_us + t, g, 1980 - (t // 50_000) % 3, t % 97, 250 + g)
        for t in range(0, 2_000_000, 10_000)
        for g in (0, 1)
    ]
    metrics = root / layout.node_metrics("trainer-0")
    metrics.parent.mkdir(parents=True)
    metrics.write_bytes(gzip.compress(b"".join(rows)))
    return root


def test_analyze_writes_a_merged_trace_of_per_rank_processes_with_counter_tracks(
    session_with_metrics: Path, tmp_path: Path
):
    analyze_uri(str(session_with_metrics), progress=False, output=str(tmp_path / "out"))
    with gzip.open(tmp_path / "out" / "merged.trace.json.gz") as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    by_rank = {r: {p for p, n in names.items() if n.startswith(f"rank {r}: ")} for r in (0, 1)}
    assert by_rank[0] and by_rank[1] and not by_rank[0] & by_rank[1]
    slices = [e for e in events if e.get("ph") == "X"]
    assert {str(e["pid"])[1:6] for e in slices} == {"00000", "00001"}
    counters = [e for e in events if e.get("ph") == "C"]
    tracks = {e["name"] for e in counters}
    assert {"GPU 0 SM clock (MHz)", "GPU 1 power (W)", "GPU 0 GPU utilization (%)"} <= tracks
    assert {names[e["pid"]] for e in counters} == {"GPU metrics trainer-0"}
    document = json.loads((tmp_path / "out" / "diagnosis.json").read_text())
    merged = document["mergedTrace"]
    # No slow worker here (rank 1's step is 619 ms against 615 ms; its kernel skew is a kernel finding),
    # so the order is the healthy reference, then rank 0 (the test below covers slow and hung ranks).
    assert not document["diagnosis"].get("slowWorkers") and sorted(merged["ranks"]) == [0, 1]
    whys = [held["why"] for held in merged["held"]]
    assert whys[0].startswith("healthy reference") and len(whys) == 2
    assert merged["bytes"] == len(gzip.decompress((tmp_path / "out" / "merged.trace.json.gz").read_bytes()))
    assert f"holds rank {merged['ranks'][0]} (healthy reference" in (tmp_path / "out" / "index.html").read_text()


def test_analyze_keeps_the_merged_trace_within_its_limit(session_with_metrics: Path, tmp_path: Path):
    one_rank = expected_size(session_with_metrics / layout.rank_trace(1))
    analyze_uri(str(session_with_metrics), progress=False, output=str(tmp_path / "out"), merged_limit_mb=1)
    data = gzip.decompress((tmp_path / "out" / "merged.trace.json.gz").read_bytes())
    assert len(data) <= 1 << 20 < 2 * one_rank
    document = json.loads((tmp_path / "out" / "diagnosis.json").read_text())
    assert document["mergedTrace"]["ranks"] == [] or len(document["mergedTrace"]["ranks"]) == 1
    assert set(document["mergedTrace"]["leftOut"]) | {str(r) for r in document["mergedTrace"]["ranks"]} == {"0", "1"}
    assert json.loads(data)["stepscope"]["leftOut"]


def test_the_ranks_that_explain_the_diagnosis_come_first() -> None:
    """Slow workers, then hung ranks, then the rank whose step is closest to the median, then rank 0."""

    def rank(r: int, ms: float) -> RankSummary:
        return RankSummary(
            version=1, rank=r, steps=[StepRow(step=i, startUs=0.0, durationUs=ms * 1000.0) for i in range(3)]
        )

    summaries = [rank(0, 104), rank(1, 103), rank(2, 180), rank(3, 90), rank(4, 103), rank(5, 100), rank(6, 95)]
    diagnosis = SimpleNamespace(
        slowWorkers=[SimpleNamespace(rank=2, slowdown=1.8)], findings=[SimpleNamespace(category="hang", ranks=[4])]
    )
    order = merge_order(diagnosis, build_tables(summaries), stacks=[])  # type: ignore[arg-type]
    assert [r for r, _ in order] == [2, 4, 5, 0, 1, 3, 6]
    assert (
        order[0][1].startswith("slow worker (1.80x")
        and order[1][1].startswith("hung")
        and order[2][1].startswith("healthy reference")
    )


def test_shift_adds_exactly_where_carries_run_and_numbers_are_shorter_than_the_shift():
    """The column-wise addition against Python's integers: carries through runs of nines, into a
    new leading digit, numbers with fewer digits than the shift, fractions left as written."""
    rng = np.random.default_rng(13)
    for shift in (1, 7, 1000, 99_999, 123_456_789):
        ints = np.concatenate(
            [rng.integers(0, 10 ** rng.integers(1, 16, 300)), [9, 99, 9999, 99_999_999, 10**15 - 1, 0, 999_000]]
        )
        spaces = rng.integers(1, 4, len(ints))
        fractions = [b"" if i % 3 else b".%03d" % (i % 1000) for i in range(len(ints))]
        body = b",".join(
            b'{"ts":%s%d%s,"dur":5}' % (b" " * int(s), int(v), f) for v, s, f in zip(ints, spaces, fractions)
        )
        shifted = shift_ts(body, shift)
        got = re.findall(rb'"ts":\s*(\d+)(\.\d+)?', bytes(shifted))
        assert [int(g[0]) for g in got] == [int(v) + shift for v in ints]
        assert [g[1] for g in got] == fractions


class _Recording(Executor):
    """The pool it wraps, noting which ranks it was given."""

    def __init__(self, pool: Executor) -> None:
        self.pool, self.workers, self.ranks = pool, pool_workers(pool), []

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.ranks.append(args[0].rank)
        return self.pool.submit(fn, *args, **kwargs)


def test_ranks_that_do_not_divide_over_the_workers_are_shared_with_this_process(tmp_path: Path):
    """3 ranks on 2 workers: the main process rewrites the third beside them, and the file is the
    same as one process writes."""
    events = [{"ph": "X", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5, "id": 3}]
    ranks = [MergeRank(r, _write(tmp_path / f"{r}.json", events, base_ns=r * 1000), shift_us=r) for r in (0, 3, 5)]
    _, alone, text = _merge(ranks)
    out = io.BytesIO()
    with worker_pool(2) as pool:
        recording = _Recording(pool)
        result = write_merged_trace(out, MergePlan(ranks, [], 1 << 30), pool=recording)
    assert recording.workers == 2 and recording.ranks == [0, 3]
    assert result == alone and gzip.decompress(out.getvalue()) == text
