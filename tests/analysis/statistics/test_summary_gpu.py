"""Summaries of real GPU traces: PerfTracker's and Ascend's sections, which HTA does not have."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stepscope.analysis.model import decode_summary, encode
from stepscope.analysis.statistics.summary import summarize_file


def one(folder: Path) -> Path:
    return sorted(folder.glob("*.json*"))[0]


def nccl_kernels(path: Path) -> int:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return sum(1 for e in events if e.get("cat") == "kernel" and e.get("name", "").startswith("nccl"))


def test_sections_of_a_v100_nccl_trace(shared_traces: Path):
    path = one(shared_traces / "hta__df_index_resolver")
    s = summarize_file(path)
    assert (s.error, s.rank, s.worldSize, s.hasGpu, s.gpu) == ("", 1, 2, True, 1)
    assert [x.step for x in s.steps] == [2, 3, 4, 5, 6]
    for step in s.steps:
        assert step.durationUs > 0 and 0 <= step.overlappedUs <= min(step.computingUs, step.communicationUs)
        assert step.commNotOverlappedUs == pytest.approx(step.communicationUs - step.overlappedUs)
        assert step.freeUs == pytest.approx(max(step.durationUs - step.computingUs - step.commNotOverlappedUs, 0))
    assert 0 < s.gpuUtilizationPct < 100
    allreduce = s.collectives[0]
    assert (allreduce.kind, allreduce.algorithm, allreduce.protocol) == ("AllReduce", "RING", "LL")
    assert allreduce.count == nccl_kernels(path)  # every NCCL kernel, the last step's too
    assert 0 < allreduce.bottleneckRatio < 1
    assert {m.kind for m in s.memoryOps} == {"Memcpy DtoD", "Memset"}
    assert all(m.bytes > 0 and m.bandwidthGBs > 0 for m in s.memoryOps)
    top = s.kernels[0]
    assert top.sumUs >= s.kernels[-1].sumUs and top.minUs <= top.medianUs <= top.maxUs
    assert {k.type for k in s.kernels} == {"COMP", "COMM", "MEM"}
    assert len(s.kernels) <= 150 and s.runtime[0].count > 0
    assert decode_summary(encode(s)) == s


def test_message_sizes_give_bus_bandwidth(shared_traces: Path):
    s = summarize_file(one(shared_traces / "hta__nccl_parser_config"))
    sized = [c for c in s.collectives if c.bytes > 0]
    assert sized, s.collectives
    for c in sized:
        assert c.busBandwidthGBs > 0 and c.count == len(c.durationsUs)


def test_python_stacks_on_a_gpu_trace(shared_traces: Path):
    s = summarize_file(one(shared_traces / "tracelens__b200_eager_trace"))
    assert s.functions and all(0 <= f.notOverlappedUs <= f.exclusiveUs for f in s.functions)
    assert all(f.stack.endswith(f.name) for f in s.functions)
    assert s.functions == sorted(s.functions, key=lambda f: -f.notOverlappedUs)
