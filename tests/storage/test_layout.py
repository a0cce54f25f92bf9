"""The readers' patterns in stepscope.contracts.layout match exactly the keys its writers' functions build."""

from __future__ import annotations

from stepscope.contracts import layout


def test_readers_match_the_writers_keys() -> None:
    for key, kind in (
        (layout.rank_summary(12), "summary.arrow"),
        (layout.rank_trace(12), "trace.json.gz"),
        (layout.rank_stacks(12), "stacks.json"),
        ("ranks/rank-12.summary.json", "summary.json"),
    ):  # the last as older sidecars wrote it
        m = layout.RANK_FILE.match(key)
        assert m and (m[1], m[2]) == ("12", kind), key
    m = layout.NODE_METRICS.match(layout.node_metrics("trainer-0"))
    assert m and m[1] == "trainer-0"
    for other in (layout.session_json(), layout.REPORT_HTML, "ranks/rank-1.state.json", "nodes/a/b/gpu-metrics.csv.gz"):
        assert not layout.RANK_FILE.match(other) and not layout.NODE_METRICS.match(other), other
