"""The rank summary as it is uploaded: an Arrow IPC stream of one row, decoded many at a time into
one table; older JSON summaries still read; a damaged or hostile file costs its own rank only."""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pytest

from stepscope.analysis.diagnosis.rank_tables import build_tables
from stepscope.analysis.model import (
    SUMMARY_VERSION,
    CriticalPathSummary,
    DeviceSpec,
    PathShare,
    RankSummary,
    decode_summaries,
    decode_summary,
    encode,
    encode_summary,
    summaries_table,
    summary_batch,
    summary_schema,
    table_critical_path,
    table_summaries,
)
from stepscope.analysis.reporting.tables import critical_path
from stepscope.testing.synthetic_ranks import make_summaries


def _varied() -> list[RankSummary]:
    """Summaries with every kind of field: optional ones absent, set and None, maps, lists."""
    out = make_summaries(4, slow_rank=1, kernel_factor=1.3, seed=3, functions=3)
    out[0].temporal, out[1].launch, out[2].overlapPct = None, None, None
    out[2].steps[0].collectiveUs = 12.5
    out[3].device = DeviceSpec(
        name="NVIDIA H100 80GB HBM3", model="H100 SXM", tflops={"bf16": 989.0, "fp32": 67.0}, tbs=3.35
    )
    out[3].hardware = {"smClockMHz": [1980.0, 1410.0]}
    out[3].warnings = ["a warning", "another"]
    return out


def test_an_uploaded_summary_is_one_arrow_row_and_reads_back_the_same() -> None:
    for summary in _varied():
        data = encode_summary(summary)
        assert data.startswith(b"\xff\xff\xff\xff")  # an Arrow IPC stream, not JSON
        assert decode_summary(data) == summary
    table = summaries_table(_varied())
    assert table.schema.equals(summary_schema()) and table.num_rows == 4
    # A field left at its default is the default in the table, not a null; None stays None.
    assert table.column("worldSize").null_count == 0 and table.column("temporal").null_count == 1
    assert table_summaries(table) == _varied()


def test_many_summaries_decode_together_and_json_ones_from_older_sidecars_too() -> None:
    summaries = _varied()
    blobs = [encode_summary(s) for s in summaries[:3]] + [encode(summaries[3])]
    table, rows, errors = decode_summaries(blobs)
    assert errors == {} and sorted(rows) == [0, 1, 2, 3]
    back = dict(zip(rows, table_summaries(table)))
    assert [back[i] for i in range(4)] == summaries


def _with_path(summary: RankSummary, total_us: float) -> RankSummary:
    path = CriticalPathSummary(
        totalUs=total_us,
        startUs=10.0,
        endUs=10.0 + total_us,
        byBound={"cpu_bound": 0.25 * total_us, "gpu_compute_bound": 0.75 * total_us},
        top=[
            PathShare("ampere_sgemm_128x64_tn", "gpu_compute_bound", 0.5 * total_us),
            PathShare("aten::addmm", "cpu_bound", 0.125 * total_us),
        ],
        spans=[
            (10.0, 0.5 * total_us, 0, "gpu_compute_bound"),
            (20.5, 3.0, 1, "cpu_bound"),
            (30.0, 1.5, 7, "cpu_bound"),
        ],
        spanNames=["ampere_sgemm_128x64_tn", "aten::addmm"],
    )
    return msgspec.structs.replace(summary, criticalPath=path)


def test_the_critical_path_travels_in_the_arrow_summary_and_reaches_the_tables() -> None:
    summaries = make_summaries(3, seed=4)
    summaries[0], summaries[2] = _with_path(summaries[0], 800.0), _with_path(summaries[2], 1000.0)
    for summary in summaries:  # nested: a struct with a map, a list of structs and tuples (spans)
        assert decode_summary(encode_summary(summary)) == summary
    table, rows, errors = decode_summaries([encode_summary(s) for s in summaries])
    assert errors == {} and rows == [0, 1, 2] and table_summaries(table) == summaries
    assert table.column("criticalPath").null_count == 1
    assert table_critical_path(table.column("criticalPath"), 2) == summaries[2].criticalPath
    assert table_critical_path(table.column("criticalPath"), 1) is None
    csv = critical_path(build_tables(table))
    assert csv["Rank"].tolist() == [0, 0, 2, 2, 0, 0, 2, 2]  # each rank's bounds, then its top contributors
    assert csv["Name"].tolist()[:4] == [""] * 4 and csv["Short Name"].tolist()[4] != ""
    assert csv["Path Share(%)"].tolist() == [25.0, 75.0, 25.0, 75.0, 50.0, 12.5, 50.0, 12.5]
    assert csv["Path(us)"].tolist() == [800.0] * 2 + [1000.0] * 2 + [800.0] * 2 + [1000.0] * 2


def _compressed(summary: RankSummary) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, summary_schema(), options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(summaries_table([summary]))
    return sink.getvalue().to_pybytes()


def _bad_offsets(data: bytes) -> bytes:
    """The blob with the last string offsets of its body overwritten (a hostile or damaged file)."""
    body = bytearray(data)
    body[-200:-100] = b"\x7f" * 100
    return bytes(body)


def test_a_damaged_or_hostile_summary_is_its_own_ranks_error_and_the_others_read() -> None:
    summaries = make_summaries(6, seed=5)
    newer = msgspec.structs.replace(summaries[4], version=SUMMARY_VERSION + 1)
    two_rows = pa.BufferOutputStream()
    with pa.ipc.new_stream(two_rows, summary_schema()) as writer:
        writer.write_table(summaries_table(summaries[:2]))
    blobs = [
        encode_summary(summaries[0]),
        _compressed(summaries[1]),  # its buffers would state their own decompressed size
        _bad_offsets(encode_summary(summaries[2])),
        encode_summary(summaries[3])[:-300],  # cut short
        encode_summary(newer),
        two_rows.getvalue().to_pybytes(),
        b"\xff\xff\xff\xff" + b"\x00" * 64,
    ]
    table, rows, errors = decode_summaries(blobs)
    assert rows == [0] and table_summaries(table) == [summaries[0]]
    assert set(errors) == {1, 2, 3, 4, 5, 6}
    assert "compressed" in errors[1]
    assert "newer than this stepscope understands" in errors[4]
    assert "one row" in errors[5]
    with pytest.raises(ValueError, match="not an Arrow summary|compressed"):
        summary_batch(blobs[2])


def test_a_summary_of_an_older_schema_reads_with_the_fields_it_lacks_at_their_defaults() -> None:
    summary = _with_path(make_summaries(2, seed=1)[1], 500.0)
    full = summaries_table([summary])
    older = full.drop_columns(
        ["operators", "kernelEfficiency", "gpu", "criticalPath"]
    )  # as a version before those fields wrote it
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, older.schema) as writer:
        writer.write_table(older)
    back = decode_summary(sink.getvalue().to_pybytes())
    assert back == msgspec.structs.replace(summary, operators=[], kernelEfficiency=[], gpu=-1, criticalPath=None)
    # A field of another type is no summary of this model.
    wrong = full.set_column(full.schema.get_field_index("rank"), "rank", pa.array(["1"]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, wrong.schema) as writer:
        writer.write_table(wrong)
    with pytest.raises(ValueError, match="field rank is string"):
        summary_batch(sink.getvalue().to_pybytes())
