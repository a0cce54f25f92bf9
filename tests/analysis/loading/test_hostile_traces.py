"""Hostile and corrupt input to `stepscope analyze`: every case ends in a flagged report (the bad
rank named with the reason, the others diagnosed) or a one-line error, never a traceback, and the
analysis process tree never holds more than 1 GiB. Each case runs the real CLI in a subprocess
of a small runner process, which reads the peak RSS of the CLI and its worker processes from
RUSAGE_CHILDREN (a child of the test process itself would count the test's own memory: Linux
keeps a process's peak RSS across the exec that follows its fork)."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis import summarize
from stepscope.analysis.loading.gpu_samples import read_metrics
from stepscope.analysis.loading.trace import Limits, TraceError, load_trace
from stepscope.contracts.wire import GPU_KEY, MAX_SCHEDSTAT_STEPS, SCHEDSTAT_KEY, STOPPED_KEY, THROTTLED_KEY

GIB = 1 << 30
GOOD = "hta__trace_filter_2rank"


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    max_rss: int  # bytes, the largest of the process and its waited-for children

    @property
    def diagnosis(self) -> dict:
        return json.loads((self.folder / "report" / "diagnosis.json").read_text())

    folder: Path = Path()


RUNNER = """import resource, subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(rc)"""


def peak_rss(
    command: list[str], tmp: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, int]:
    """Run `command`; its result and the peak RSS in bytes of it and its descendants."""
    rss = tmp / "rss"
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(rss), *command],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    return done, int(rss.read_text())


def analyze(folder: Path, *args: str, env: dict[str, str] | None = None) -> Run:
    done, rss = peak_rss(
        [sys.executable, "-m", "stepscope.cli", "analyze", str(folder), "--no-progress", *args], folder.parent, env
    )
    return Run(done.returncode, done.stdout, done.stderr, rss, folder)


def session(tmp_path: Path, shared_traces: Path, hostile: bytes | None, name: str = "rank2.json.gz") -> Path:
    """Ranks 0 and 1 of a real job, and a third file `name` holding `hostile`."""
    folder = tmp_path / "s"
    folder.mkdir()
    for rank in (0, 1):
        shutil.copy(shared_traces / GOOD / f"sampled_rank-{rank}.json.gz", folder / f"rank{rank}.json.gz")
    if hostile is not None:
        (folder / name).write_bytes(hostile)
    return folder


def assert_flagged(run: Run, why: str) -> None:
    """Ranks 0 and 1 diagnosed, rank 2 named as not analysed with `why`, one line on stderr."""
    assert "Traceback" not in run.stderr + run.stdout
    assert run.rc == 3, run.stderr
    assert run.stderr.strip().splitlines() == [
        "stepscope analyze: 1 of 3 rank(s) could not be analysed (see the report)"
    ]
    doc = run.diagnosis
    assert doc["ranks"]["failed"] == [2] and doc["ranks"]["analysed"] == 2
    assert why in " ".join(doc["problems"]["2"]), doc["problems"]["2"]
    assert any(f["category"] == "trace" and f["ranks"] == [2] and f["severity"] == "critical" for f in doc["findings"])
    assert run.max_rss < GIB


def event(**fields) -> dict:
    base = {
        "ph": "X",
        "cat": "kernel",
        "name": "k",
        "pid": 0,
        "tid": 7,
        "ts": 1000,
        "dur": 5,
        "args": {"stream": 7, "correlation": 1},
    }
    return {**base, **fields}


def trace(events: list, rank: int = 2) -> bytes:
    return json.dumps({"distributedInfo": {"rank": rank, "world_size": 3}, "traceEvents": events}).encode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def bomb_block(events_per_member: int) -> bytes:
    """Valid events that repeat every 100 (a deflate window holds them: ~1000x compression)."""
    return (
        ",".join(
            json.dumps(e, separators=(",", ":"))
            for i in range(events_per_member)
            for e in (
                event(
                    name=f"k{i % 50}",
                    ts=4 * (i % 100),
                    dur=3,
                    args={"stream": 7, "correlation": i % 100, "External id": i % 100},
                ),
                event(
                    cat="cpu_op",
                    name=f"aten::op{i % 30}",
                    pid=100,
                    ts=4 * (i % 100),
                    dur=2,
                    args={"External id": i % 100},
                ),
            )
        ).encode()
        + b","
    )


def bomb(events_per_member: int, members: int, rank: int = 2) -> bytes:
    """A gzip of many members repeating one block of valid events: a few MB inflating to GBs."""
    member = gzip.compress(bomb_block(events_per_member), 9)
    head = gzip.compress(b'{"distributedInfo":{"rank":%d,"world_size":3},"traceEvents":[' % rank)
    return head + member * members + gzip.compress(json.dumps(event(ts=0)).encode() + b"]}")


# (case, file content, the reason the report gives) for a rank that cannot be analysed at all.
UNREADABLE = [
    (
        "args nested 10k deep",
        trace([event(args={"x": "@"})]).replace(b'"@"', nested(10_000).encode()),
        "nested too deeply",
    ),
    (
        "a metadata key nested 10k deep",
        trace([event()])[:-1] + b', "extra": ' + nested(10_000).encode() + b"}",
        "nested too deeply",
    ),
    (
        "the event list nested 10k deep",
        b'{"traceEvents": ' + nested(10_000).encode() + b"}",
        "Expected `object`, got `array`",
    ),
    ("truncated gzip", gzip.compress(trace([event(ts=t) for t in range(0, 50_000, 10)]))[:3000], "truncated"),
    (
        "truncated JSON",
        gzip.compress(trace([event(ts=t) for t in range(0, 5000, 10)])[:-700]),
        "invalid or truncated JSON",
    ),
    ("empty file", b"", "empty"),
    ("binary junk", random.Random(7).randbytes(200_000), "not a Kineto"),
    ("gzip of binary junk", gzip.compress(random.Random(8).randbytes(200_000)), "not a Kineto"),
    ("JSON's NaN literal", trace([event()]).replace(b'"dur": 5', b'"dur": NaN'), "invalid or truncated JSON"),
    ("an event of 100 MB", trace([event(name="x" * (100 << 20))]), "no event boundary within 64 MiB"),
    (
        "only impossible durations",
        trace([event(dur=-5), event(dur=1e300), event(dur=86_400e6 + 1)]),
        "no events with a duration",
    ),
]


@pytest.mark.parametrize("content,why", [c[1:] for c in UNREADABLE], ids=[c[0] for c in UNREADABLE])
def test_unreadable_rank_is_named_and_the_others_diagnosed(
    tmp_path: Path, shared_traces: Path, content: bytes, why: str
) -> None:
    assert_flagged(analyze(session(tmp_path, shared_traces, content)), why)


def test_zip_of_a_zip_named_like_a_trace(tmp_path: Path, shared_traces: Path) -> None:
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("rank2.json", trace([event()]))
    outer = io.BytesIO()
    with zipfile.ZipFile(outer, "w") as z:
        z.writestr("inner.zip", inner.getvalue())
    run = analyze(session(tmp_path, shared_traces, outer.getvalue()))
    assert_flagged(run, "invalid or truncated JSON")


# Values of the wrong type in each field the loader reads: refused with the field's name, or (for
# the identifiers, which profilers write as numbers, strings or null) read as absent.
WRONG_TYPES = [
    ("cat", 5),
    ("name", []),
    ("pid", {}),
    ("ts", "abc"),
    ("dur", [1]),
    ("args", []),
    ("args", {"stream": {}}),
    ("args", {"correlation": []}),
    ("args", {"Collective name": 5}),
    ("args", {"External id": [1]}),
    ("args", {"dtype": 3}),
]


@pytest.mark.parametrize("key,value", WRONG_TYPES, ids=[f"{k}={json.dumps(v)}" for k, v in WRONG_TYPES])
def test_wrong_type_in_each_field_is_named(tmp_path: Path, key: str, value: object) -> None:
    path = tmp_path / "rank2.json"
    path.write_bytes(trace([event(), event(**{key: value}), event()]))
    with pytest.raises(TraceError, match=r"rank2\.json: (unexpected value in the trace: Expected .*|invalid)"):
        load_trace(path)


def test_huge_numbers_are_read_or_refused_never_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "rank2.json"
    events = [event(ts=1000 + i, dur=3) for i in range(100)]
    path.write_bytes(trace(events).replace(b'"ts": 1000,', b'"ts": 1e400,', 1))
    with pytest.raises(TraceError, match="Number out of range"):
        load_trace(path)
    path.write_bytes(
        trace(
            events
            + [
                event(pid=10**30, args={"stream": 10**40, "correlation": -(10**30), "bytes": 10**25}),
                event(ts=10**30),
                event(dur=10**30),
            ]
        )
    )
    loaded = load_trace(path)
    assert np.isfinite(loaded.ts).all() and np.isfinite(loaded.dur).all() and (loaded.dur >= -1).all()
    assert loaded.stream.max() < 10**18 and loaded.pid.max() < 10**18
    assert any("impossible times" in w for w in loaded.warnings)


def test_nonsense_durations_are_dropped_and_counted(tmp_path: Path, shared_traces: Path) -> None:
    """Negative and day-long durations and a start a year away: out of every metric,
    counted in the rank's warnings and the report; the rest of the rank analysed as before."""
    good = json.loads(gzip.decompress((shared_traces / GOOD / "sampled_rank-0.json.gz").read_bytes()))
    before = load_trace(shared_traces / GOOD / "sampled_rank-0.json.gz")
    start = float(np.min(before.ts))
    bad = [
        event(ts=start + 10, dur=-50),
        event(ts=start + 20, dur=2 * 86_400e6),
        event(ts=start + 1e6 * 86_400 * 365, dur=5),
        event(ts=start + 30, dur=-1e300),
    ]
    good["traceEvents"] += bad
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "rank0.json").write_text(json.dumps(good))
    after = load_trace(folder / "rank0.json")
    assert len(after) == len(before)
    np.testing.assert_array_equal(after.ts, before.ts)
    assert after.warnings[-1] == (
        f"dropped 4 of {len(before) + 4:,} events with impossible times (2 negative duration, "
        "1 longer than a day, 1 starting over a day away from the trace's other events)"
    )
    run = analyze(folder)
    assert run.rc == 0 and "Traceback" not in run.stderr
    assert any("impossible times" in f["message"] for f in run.diagnosis["findings"])


def test_gzip_bomb_is_cut_within_memory_with_default_caps(tmp_path: Path, shared_traces: Path) -> None:
    """A 57 MB gzip of 5 GB of valid events: the rank is cut at the default cap on events, said
    in the report, the two real ranks diagnosed, under 1 GiB."""
    content = bomb(20_000, 1000)
    assert len(content) < 60e6 and len(bomb_block(20_000)) * 1000 > 4.5e9
    run = analyze(session(tmp_path, shared_traces, content))
    assert "Traceback" not in run.stderr and run.rc == 0, run.stderr
    doc = run.diagnosis
    assert doc["ranks"]["analysed"] == 3
    assert any("cut after 2,000,000 events" in p for p in doc["problems"]["2"])
    assert any(f["ranks"] == [2] and "cut after" in f["message"] for f in doc["findings"])
    assert run.max_rss < GIB


def test_byte_cap_cuts_a_rank_and_the_report_says_so(tmp_path: Path, shared_traces: Path) -> None:
    run = analyze(session(tmp_path, shared_traces, bomb(5000, 100)), "--max-trace-mb", "16")
    assert run.rc == 0, run.stderr
    assert any("cut after 16 MiB of JSON" in p for p in run.diagnosis["problems"]["2"])
    html = (run.folder / "report" / "index.html").read_text()
    assert "cut after 16 MiB of JSON" in html
    cut = load_trace(run.folder / "rank2.json.gz", Limits(max_bytes=16 << 20))
    per_event = len(bomb_block(5000)) / 10_000
    assert 0.99 * (16 << 20) / per_event < len(cut) < (16 << 20) / per_event  # whole events up to the cap


def test_bad_cap_setting_is_a_one_line_error(tmp_path: Path, shared_traces: Path) -> None:
    run = analyze(session(tmp_path, shared_traces, None), env={"STEPSCOPE_MAX_TRACE_EVENTS": "lots"})
    assert run.rc == 1 and run.stderr.strip().splitlines() == [
        "stepscope analyze: STEPSCOPE_MAX_TRACE_EVENTS must be a positive integer, not 'lots'"
    ]


def test_every_rank_hostile_is_one_line_and_nonzero(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(b'{"traceEvents": ' + nested(5000).encode() + b"}")
    (folder / "rank1.json.gz").write_bytes(b"\x1f\x8b" + b"\0" * 100)
    run = analyze(folder)
    assert run.rc == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        "stepscope analyze: 2 of 2 rank(s) could not be analysed (see the report)"
    ]


def test_symlink_out_of_the_session_is_not_read(tmp_path: Path, shared_traces: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes(trace([event()], rank=1))
    folder = session(tmp_path, shared_traces, None)
    (folder / "rank1.json.gz").unlink()
    shutil.copy(shared_traces / GOOD / "sampled_rank-1.json.gz", folder / "rank2.json.gz")
    (folder / "rank1.json").symlink_to(outside)
    run = analyze(folder)
    assert run.rc == 3 and "Traceback" not in run.stderr
    assert run.diagnosis["problems"]["1"] == ["no trace or summary was uploaded for this rank"]


def test_random_mutations_of_a_real_trace_never_crash(tmp_path: Path, shared_traces: Path) -> None:
    """Seeded fuzzing: byte flips, cuts, insertions and duplicated spans of a real trace's JSON;
    each load either gives columns or a TraceError."""
    text = gzip.decompress((shared_traces / GOOD / "sampled_rank-1.json.gz").read_bytes())[:400_000]
    text = text[: text.rfind(b"},") + 1] + b"]}"
    rng = random.Random(1234)
    path = tmp_path / "rank.json"
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(150):
        data = bytearray(text)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            match rng.randrange(5):
                case 0:
                    data[at] = rng.randrange(256)
                case 1:
                    del data[at : at + rng.randint(1, 500)]
                case 2:
                    data[at:at] = rng.choice(
                        [b"[" * 3000, b"{", b"}", b'"', b",", b"-1e999", b"NaN", b"null", b"\xff\xfe"]
                    )
                case 3:
                    data[at:at] = data[at : at + rng.randint(1, 5000)]
                case 4:
                    data[at:at] = str(rng.choice([-1, 10**20, -(10**20), 1e308, 0.5])).encode()
        path.write_bytes(gzip.compress(bytes(data), 1) if rng.random() < 0.5 else bytes(data))
        try:
            loaded = load_trace(path)
        except TraceError:
            outcomes["refused"] += 1
            continue
        outcomes["loaded"] += 1
        assert (loaded.dur >= -1).all() and np.isfinite(loaded.ts).all()
    assert outcomes["loaded"] and outcomes["refused"]


# GPU metrics files (nodes/<pod>/gpu-metrics.csv.gz) are untrusted too.


def test_metrics_gzip_bomb_is_cut_at_the_cap(tmp_path: Path) -> None:
    rows = b"".join(b"%d,0,1410,1215,0,300,60,1000,90,40,,,,,\n" % (1_700_000_000_000_000 + i) for i in range(20_000))
    header = (
        b"ts_us,gpu,sm_clock_mhz,mem_clock_mhz,clock_reasons,power_w,temperature_c,memory_used_mib,"
        b"gpu_util_pct,mem_util_pct,pcie_tx_bytes,pcie_rx_bytes,ecc_sbe,ecc_dbe,xid\n"
    )
    member = gzip.compress(rows, 9)
    path = tmp_path / "gpu-metrics.csv.gz"
    path.write_bytes(gzip.compress(header) + member * 2000)  # ~1.7 GB of CSV
    code = (
        "from pathlib import Path; from stepscope.analysis.loading.gpu_samples import read_metrics;"
        f"f = read_metrics(Path({str(path)!r}), 32 << 20); print(len(f), f.attrs['warnings'])"
    )
    done, rss = peak_rss([sys.executable, "-c", code], tmp_path)
    assert "cut after 32 MiB of CSV" in done.stdout and int(done.stdout.split()[0]) > 300_000, done.stderr
    assert rss < GIB / 2


def test_metrics_with_too_many_values_are_cut(tmp_path: Path) -> None:
    header = b"ts_us,gpu," + b",".join(b"c%d" % i for i in range(3000)) + b"\n"
    row = b"1,0" + b",1" * 3000 + b"\n"
    frame = read_metrics(gzip.compress(header + row * 12_000))
    assert len(frame) == 32_000_000 // 3002
    assert any("cut after" in w and "values" in w for w in frame.attrs["warnings"])


def test_a_nodes_metrics_bomb_is_cut_and_reported_by_the_cli(tmp_path: Path, shared_traces: Path) -> None:
    """A session (stepscope's layout) whose node metrics file inflates to 560 MB: the analysis
    reads the first 16 MiB of it, says so for the node's ranks, diagnoses them, under 1 GiB."""
    root = tmp_path / "session"
    (root / "ranks").mkdir(parents=True)
    for rank in (0, 1):
        shutil.copy(
            shared_traces / GOOD / f"sampled_rank-{rank}.json.gz", root / "ranks" / f"rank-{rank}.trace.json.gz"
        )
    header = b"ts_us,gpu,sm_clock_mhz,power_w\n"
    rows = b"".join(b"%d,0,1410,300\n" % (1_700_000_000_000_000 + i) for i in range(20_000))
    (root / "nodes" / "pod-a").mkdir(parents=True)
    (root / "nodes" / "pod-a" / "gpu-metrics.csv.gz").write_bytes(gzip.compress(header) + gzip.compress(rows, 9) * 1000)
    run = analyze(root, "--max-metrics-mb", "16")
    assert run.rc == 0 and "Traceback" not in run.stderr, run.stderr
    problems = run.diagnosis["problems"]
    assert all(any("gpu metrics file cut after 16 MiB of CSV" in p for p in problems[r]) for r in ("0", "1")), problems
    assert run.max_rss < GIB


def test_oversized_summary_and_stacks_files_are_refused_unread(tmp_path: Path, shared_traces: Path) -> None:
    root = tmp_path / "session"
    (root / "ranks").mkdir(parents=True)
    for rank in (0, 1):
        shutil.copy(
            shared_traces / GOOD / f"sampled_rank-{rank}.json.gz", root / "ranks" / f"rank-{rank}.trace.json.gz"
        )
    (root / "ranks" / "rank-2.summary.json").write_bytes(
        b'{"version": 1, "rank": 2, "warnings": [' + b'"x",' * (10 << 20) + b'"x"]}'
    )
    (root / "ranks" / "rank-1.stacks.json").write_bytes(b'{"step": 3, "threads": [' + b"[1.5]," * (7 << 20) + b"[1]]}")
    run = analyze(root)
    assert run.rc == 3 and "Traceback" not in run.stderr, run.stderr
    problems = run.diagnosis["problems"]
    assert any(
        "ranks/rank-2.summary.json holds 42 MB, more than the 32 MiB such a file may" in p for p in problems["2"]
    ), problems
    assert any(
        "ranks/rank-1.stacks.json cannot be read: " in p and "more than the 32 MiB" in p for p in problems["1"]
    ), problems
    assert run.diagnosis["ranks"]["analysed"] == 2 and run.max_rss < GIB


def test_scheduler_counters_of_any_other_form_are_left_out_and_bounded(tmp_path: Path) -> None:
    """The agent's per-step scheduler counters (wire.SCHEDSTAT_KEY, THROTTLED_KEY, STOPPED_KEY):
    entries of three (two, three) non-negative integers are read, in step order, at most MAX_SCHEDSTAT_STEPS of them;
    anything else is left out, and a value that is no object reads as none."""
    path = tmp_path / "rank2.json"
    good = [[12, 5_000_000, 100_000], [11, 1_000_000, 0]]
    bad = [[13, -1, 0], [14, 1.5, 2], [15, True, 2], ["16", 1, 2], [17, 1], {"step": 18}, [19, 10**30, 0]]
    document = json.loads(trace([event()]))
    document[SCHEDSTAT_KEY] = {"steps": good + bad}
    path.write_bytes(json.dumps(document).encode())
    assert load_trace(path).schedstat.tolist() == [[11, 1_000_000, 0], [12, 5_000_000, 100_000]]
    document[SCHEDSTAT_KEY] = {"steps": [[i, i, i] for i in range(MAX_SCHEDSTAT_STEPS + 50)]}
    path.write_bytes(json.dumps(document).encode())
    assert len(load_trace(path).schedstat) == MAX_SCHEDSTAT_STEPS
    for value in ("steps", [[1, 2, 3]], {"steps": {"1": 2}}, None):
        document[SCHEDSTAT_KEY] = value
        path.write_bytes(json.dumps(document).encode())
        assert load_trace(path).schedstat.shape == (0, 3)
    # The cgroup's throttled time, at the same boundaries: pairs only, bounded alike.
    document[THROTTLED_KEY] = {"steps": [[12, 3_000_000], [11, 0], [13, 1, 2], [14, -5], ["15", 1]]}
    path.write_bytes(json.dumps(document).encode())
    assert load_trace(path).throttled.tolist() == [[11, 0], [12, 3_000_000]]
    document[THROTTLED_KEY] = {"steps": [[i, i] for i in range(MAX_SCHEDSTAT_STEPS + 50)]}
    path.write_bytes(json.dumps(document).encode())
    assert len(load_trace(path).throttled) == MAX_SCHEDSTAT_STEPS
    for value in ("steps", [[1, 2]], {"steps": {"1": 2}}, None):
        document[THROTTLED_KEY] = value
        path.write_bytes(json.dumps(document).encode())
        assert load_trace(path).throttled.shape == (0, 2)
    # The stop watch's lateness and run-queue time, likewise: triples only, bounded alike.
    document[STOPPED_KEY] = {"steps": [[12, 9_000_000, 1_000], [11, 0, 0], [13, 1], [14, -5, 0], [15, 1, 2.5]]}
    path.write_bytes(json.dumps(document).encode())
    assert load_trace(path).stopped.tolist() == [[11, 0, 0], [12, 9_000_000, 1_000]]
    document[STOPPED_KEY] = {"steps": [[i, i, i] for i in range(MAX_SCHEDSTAT_STEPS + 50)]}
    path.write_bytes(json.dumps(document).encode())
    assert len(load_trace(path).stopped) == MAX_SCHEDSTAT_STEPS


def test_the_agents_gpu_is_read_where_it_is_a_uuid_and_left_out_otherwise(tmp_path: Path) -> None:
    """The GPU the agent writes (wire.GPU_KEY) reaches the summary; a UUID of anything but 1-64
    letters, digits and dashes, or a value of another form, reads as none."""
    path = tmp_path / "rank0.json"
    document = json.loads(trace([event()]))
    uuid = "GPU-5a9bd1c2-7e21-4e5f-8a1b-2c3d4e5f6a7b"
    document[GPU_KEY] = {"index": 0, "uuid": uuid}
    path.write_bytes(json.dumps(document).encode())
    assert load_trace(path).gpu_uuid == uuid
    assert summarize(path, rank=0).gpuUuid == uuid
    for value in ({"uuid": "x" * 65}, {"uuid": "GPU-1\n<b>"}, {"uuid": 7}, {"uuid": ""}, uuid, [uuid], None):
        document[GPU_KEY] = value
        path.write_bytes(json.dumps(document).encode())
        assert load_trace(path).gpu_uuid == ""
