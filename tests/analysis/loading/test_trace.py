"""Loading Kineto traces: formats and profiler generations, streaming in pieces, and bad input."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.loading import trace as trace_module
from stepscope.analysis.loading.trace import TraceError, load_trace
from stepscope.analysis.statistics.summary import summarize, summarize_file

COLUMNS = ("cat", "name", "pid", "ts", "dur", "stream", "correlation", "external_id", "nbytes",
           "python_id", "python_parent")


def one(folder: Path) -> Path:
    return sorted(folder.glob("*.json*"))[0]


def write(path: Path, events: list[dict], **meta) -> Path:
    body = json.dumps({**meta, "traceEvents": events}, indent=1)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(body.encode()))
    else:
        path.write_text(body)
    return path


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": corr, "device": 0}}


def launch(ts: float, dur: float, corr: int, name: str = "cudaLaunchKernel") -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def same_columns(a, b) -> None:
    for col in COLUMNS:
        x, y = getattr(a, col), getattr(b, col)
        if col in ("cat", "name"):
            x = np.array(a.cats if col == "cat" else a.names, dtype=object)[x]
            y = np.array(b.cats if col == "cat" else b.names, dtype=object)[y]
        assert np.array_equal(x, y), col


def test_gzip_and_plain_load_the_same(shared_traces: Path, tmp_path: Path):
    gz = one(shared_traces / "hta__ns_resolution")
    plain = tmp_path / "rank-0.json"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    a, b = load_trace(gz), load_trace(plain)
    assert len(a) == len(b) > 40_000
    same_columns(a, b)
    assert a.rank == 0 and a.world_size == 1 and a.backend == "nccl"


def test_pieces_cut_anywhere_give_the_same_columns(shared_traces: Path, tmp_path: Path, monkeypatch):
    """Tiny windows force thousands of cuts, including inside strings that contain '},'."""
    path = one(shared_traces / "tracelens__b200_eager_trace")
    data = json.loads(gzip.decompress(path.read_bytes()))
    data["traceEvents"][5]["name"] = 'tricky"}, {"ph": "X"}, name'
    data["traceEvents"][9]["args"] = {"nested": [{"a": 1}, {"b": 2}], "stream": 3, "correlation": 12}
    tricky = tmp_path / "tricky.json"
    tricky.write_text(json.dumps(data, separators=(",", ":")))
    whole = load_trace(tricky)
    monkeypatch.setattr(trace_module, "CHUNK_BYTES", 4096)
    pieces = load_trace(tricky)
    same_columns(whole, pieces)
    assert 'tricky"}, {"ph": "X"}, name' in pieces.names
    kept = [e for e in data["traceEvents"] if "dur" in e and e.get("cat") not in (None, "Trace")]
    assert len(pieces) == len(kept)


def test_metadata_after_the_events_and_bare_arrays(tmp_path: Path):
    events = [launch(10, 5, 1), kernel("k", 20, 4, 1)]
    tail = tmp_path / "tail.json"
    tail.write_text('{"traceEvents": ' + json.dumps(events) + ', "distributedInfo": {"rank": 3, "world_size": 4,'
                    ' "backend": "gloo"}, "displayTimeUnit": "ns"}')
    t = load_trace(tail)
    assert (t.rank, t.world_size, t.backend) == (3, 4, "gloo")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events))
    b = load_trace(bare)
    assert len(b) == 2 and b.rank is None and "no distributedInfo" in b.warnings[0]


def test_old_category_names(shared_traces: Path):
    t = load_trace(one(shared_traces / "kineto__resnet50_num_workers_0_run1"))
    assert {"Operator", "Runtime", "Kernel", "Memcpy", "Memset"} <= set(t.cats)
    s = summarize(t)
    assert s.hasGpu and s.kernels and s.launch is not None and s.launch.launches > 1000
    assert {m.kind for m in s.memoryOps} >= {"Memset"}
    assert any(r.name == "cudaLaunchKernel" for r in s.runtime)


def test_rocm_traces_measure_hip_launches(shared_traces: Path):
    for name in ("hta__amd_mi250", "tracelens__mi300_resnet_act_checkpoint"):
        s = summarize(load_trace(one(shared_traces / name)))
        assert s.hasGpu and s.temporal is not None
        hip = [r for r in s.runtime if r.name.startswith("hip")]
        assert hip and s.launch is not None and s.launch.launches > 0
    mi300 = summarize(load_trace(one(shared_traces / "tracelens__mi300_resnet_act_checkpoint")))
    assert mi300.functions and mi300.collectives


def test_nanosecond_timestamps_are_rounded_inwards_like_hta(tmp_path: Path):
    path = write(tmp_path / "ns.json", [
        {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 10.2, "dur": 1.5},
        {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 20.7, "dur": 3.6},
    ], displayTimeUnit="ns")
    t = load_trace(path)
    assert t.rounded
    assert t.ts.tolist() == [11.0, 21.0]  # start rounded up
    assert t.dur.tolist() == [0.0, 3.0]  # end (11.7, 24.3) rounded down


def test_integer_timestamps_are_kept(shared_traces: Path):
    t = load_trace(one(shared_traces / "hta__df_index_resolver"))
    assert not t.rounded and len(t) == 123_378


def test_cpu_only_and_missing_distributed_info(shared_traces: Path):
    s = summarize(load_trace(one(shared_traces / "hta__distributed_info_unavailable")))
    assert not s.hasGpu and s.temporal is None and s.idle is None and s.kernels == []
    assert any("no distributedInfo" in w for w in s.warnings)
    assert any("CPU-only" in w for w in s.warnings)
    assert s.rank == 0 and s.capturedUs > 0


def test_trace_without_steps_is_one_step(shared_traces: Path):
    s = summarize(load_trace(one(shared_traces / "hta__critical_path_alexnet")))
    assert len(s.steps) == 1 and s.steps[0].durationUs == pytest.approx(s.capturedUs)
    assert any("no ProfilerStep" in w for w in s.warnings)


@pytest.mark.parametrize("content, reason", [
    (b"", "empty"),
    (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}',
     "truncated"),
    (b'{"traceEvents": [{"ph": "X", "cat": ', "truncated"),
    (b"this is not json", "no \"traceEvents\""),
    (b'{"traceEvents": []}', "no events"),
    (b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]}', "no events"),
    (b'{"schemaVersion": 1}', "no \"traceEvents\""),
    (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "soon", "dur": 2}]}', "unexpected value"),
])
def test_bad_traces_raise_a_clear_error_and_summaries_carry_it(tmp_path: Path, content: bytes, reason: str):
    path = tmp_path / "rank-2.trace.json"
    path.write_bytes(content)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(path) in str(err.value)
    s = summarize_file(path)
    assert s.error and str(path) in s.error and s.rank == 2 and s.steps == []
    if reason == "no events":
        assert "no events" in str(err.value)


def test_corruption_inside_a_large_trace_is_reported_where_it_is(tmp_path: Path, monkeypatch):
    events = [launch(10 * i, 5, i) for i in range(5000)]
    text = json.dumps({"traceEvents": events})
    broken = text.replace('"correlation": 2500}', '"correlation": 25#0}')
    path = tmp_path / "rank-0.json"
    path.write_text(broken)
    monkeypatch.setattr(trace_module, "CHUNK_BYTES", 4096)
    with pytest.raises(TraceError, match=f"malformed.* at byte {broken.index('#')} of the JSON"):
        load_trace(path)


def test_no_event_boundary_stops_the_window_growing(tmp_path: Path, monkeypatch):
    path = tmp_path / "rank-0.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "' + "a" * 100_000 + '"}]}')
    monkeypatch.setattr(trace_module, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(trace_module, "MAX_WINDOW_BYTES", 16384)
    with pytest.raises(TraceError, match="no event boundary within"):
        load_trace(path)


def test_truncated_gzip_and_missing_file(shared_traces: Path, tmp_path: Path):
    src = one(shared_traces / "hta__ns_resolution")
    cut = tmp_path / "rank-5.trace.json.gz"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(TraceError, match="truncated"):
        load_trace(cut)
    s = summarize_file(cut, pod="p", node="n")
    assert "truncated" in s.error and (s.rank, s.pod, s.node) == (5, "p", "n")
    missing = summarize_file(tmp_path / "nope.json")
    assert "no such file" in missing.error


def test_summary_of_a_copied_trace_keeps_its_rank(shared_traces: Path, tmp_path: Path):
    dst = tmp_path / "anything.json.gz"
    shutil.copy(one(shared_traces / "hta__trace_diff_control"), dst)
    s = summarize_file(dst, pod="trainer-3", node="node-a")
    assert (s.rank, s.worldSize, s.pod, s.node, s.error) == (3, 8, "trainer-3", "node-a", "")
    assert summarize_file(dst, rank=7).rank == 7


@pytest.mark.parametrize("seed", range(12))
def test_random_layouts_and_window_sizes_load_like_json(tmp_path: Path, monkeypatch, seed: int):
    """Any JSON layout, names full of '},' and quotes, nested args, any window size: the rows are
    the ones json.loads sees."""
    rng = np.random.default_rng(seed)
    pieces = ['},', '{', '"', '\\', '}, {', ']', 'é', 'ProfilerStep#1', ' ']
    events = []
    for i in range(int(rng.integers(1, 400))):
        name = "".join(str(rng.choice(pieces)) for _ in range(int(rng.integers(0, 6))))
        event = {"ph": str(rng.choice(["X", "X", "X", "i", "f"])), "cat": str(rng.choice(["kernel", "cpu_op", "Trace"])),
                 "name": name, "pid": int(rng.integers(0, 3)), "tid": "stream 7", "ts": float(rng.integers(0, 1000)),
                 "args": {"stream": 7, "correlation": i, "nested": [{"a": name}, {"b": [1, {"c": "},"}]}]}}
        if event["ph"] == "X":
            event["dur"] = float(rng.integers(0, 50))
        events.append(event)
    layout = [dict(indent=None), dict(indent=1), dict(separators=(",", ":")), dict(indent="\t")][seed % 4]
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "distributedInfo": {"rank": 1}}, **layout))
    monkeypatch.setattr(trace_module, "CHUNK_BYTES", int(rng.integers(64, 4096)))
    expected = [e for e in events if "dur" in e and e["cat"] != "Trace"]
    if not expected:
        with pytest.raises(TraceError, match="no events"):
            load_trace(path)
        return
    t = load_trace(path)
    assert t.rank == 1
    assert [t.names[c] for c in t.name] == [e["name"] for e in expected]
    assert t.ts.tolist() == [e["ts"] for e in expected] and t.dur.tolist() == [e["dur"] for e in expected]
    assert t.correlation.tolist() == [e["args"]["correlation"] for e in expected]


def test_numbers_beyond_int64_read_as_absent(tmp_path: Path):
    huge = 18446744073709551615
    coll = kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 20, 5, huge)
    coll["args"].update({"In msg nelems": huge, "Out msg nelems": 4, "Group size": 2, "dtype": "Float", "External id": huge})
    odd_pid = {**kernel("k", 30, 5, 3), "pid": huge}
    path = write(tmp_path / "huge.json", [launch(10, 2, 1), coll, odd_pid, {**kernel("k", 40, 5, 4), "args": {"stream": huge}}])
    trace = load_trace(path)
    assert trace.correlation.tolist() == [1, -1, 3, -1]
    assert trace.stream.tolist() == [-1, 7, 7, -1]
    assert trace.external_id.tolist() == [-1, -1, -1, -1]
    assert trace.pid[2] < 0 and trace.pid[1] == 0
    assert trace.collectives.in_nelems.tolist() == [-1] and trace.collectives.out_nelems.tolist() == [4]
    assert not summarize_file(path).error


@pytest.mark.parametrize("odd", [{"ph": "i", "dur": 3.0}, {"ph": "Q", "dur": 3.0}, {"dur": 3.0}, {"ph": "i"}])
def test_events_of_other_phases_are_skipped_only_where_that_keeps_the_same_rows(tmp_path: Path, odd: dict):
    """Events of phases other than X are read only as far as their (absent) duration; an event the
    fast reading refuses (a duration on an instant, an unknown or missing phase) turns it off for
    the rest of the trace, so the rows kept are those with a duration either way."""
    flow = {"ph": "f", "cat": "ac2g", "name": "ac2g", "pid": 1, "tid": 1, "ts": 11, "id": 3, "bp": "e"}
    ev = {"cat": "cpu_op", "name": "odd", "pid": 1, "tid": 1, "ts": 12.0, "args": {"correlation": 9}} | odd
    events = [launch(10, 5, 1), flow, kernel("k", 20, 4, 1), ev, flow, launch(30, 2, 2)]
    path = write(tmp_path / "phases.json", events)
    decoders = trace_module._typed()
    trace_module.decode_pieces(path.open("rb"), trace_module._Columns(), decoders)
    assert any(d.fast is None for d in (decoders.events, decoders.tail)) == (odd != {"ph": "i"})
    t = load_trace(path)
    expected = [e for e in events if "dur" in e]
    assert [t.names[c] for c in t.name] == [e["name"] for e in expected]
    assert t.correlation.tolist() == [e["args"]["correlation"] for e in expected]
