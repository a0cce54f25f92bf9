"""The merged Perfetto trace's text rewrite on the shapes Kineto and other writers produce."""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

from stepscope.analysis.report_merge import write_merged_trace


def _write(path: Path, events: list[dict], text: str | None = None, base_ns: int = 0) -> Path:
    path.write_text(text if text is not None else json.dumps({"baseTimeNanoseconds": base_ns, "traceEvents": events}))
    return path


def _merge(traces: list[tuple[int, Path]], counters: list[dict] | None = None) -> tuple[list[dict], dict[int, str], list[int]]:
    out, errors = io.BytesIO(), {}
    ranks = write_merged_trace(out, traces, lambda base_us: counters or [], on_error=lambda r, why: errors.__setitem__(r, why))
    return json.loads(gzip.decompress(out.getvalue()))["traceEvents"], errors, ranks


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
    # The same events written with other spacing, as another writer would.
    b = _write(tmp_path / "b.json", [], text=json.dumps({"traceEvents": events}, separators=(",", " :  ")), base_ns=0)
    merged, errors, ranks = _merge([(0, a), (3, b)])
    assert errors == {} and ranks == [0, 3]
    xs = [e for e in merged if e["ph"] != "M"]
    assert len(xs) == 2 * (len(events) - 1)
    rank0 = {e["name"]: e for e in xs[: len(events) - 1]}
    rank3 = {e["name"]: e for e in xs[len(events) - 1:]}
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
    a = _write(tmp_path / "a.json", [{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 100, "dur": 5}], base_ns=1_000_000_000)
    b = _write(tmp_path / "b.json", [{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 100, "dur": 5}], base_ns=1_000_250_000)
    cut = tmp_path / "c.json.gz"
    cut.write_bytes(gzip.compress(a.read_bytes())[:-10])
    counters = [{"ph": "C", "name": "GPU 0 SM clock (MHz)", "pid": 10_000_000, "tid": 0, "ts": 1.0, "args": {"value": 1980.0}}]
    merged, errors, ranks = _merge([(0, a), (1, b), (2, cut)], counters)
    assert ranks == [0, 1] and list(errors) == [2] and "left out of the merged trace" in errors[2]
    ts = {e["pid"]: e["ts"] for e in merged if e["ph"] == "X"}
    # Rank 1's clock starts 250 us later: its events move 250 us on.
    assert ts == {1000001: 100, 1000011: 350}
    assert merged[-1] == counters[0]
