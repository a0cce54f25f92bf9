"""Ranks that compute on one GPU take turns on it: the late one at the collectives is no slow
worker unless more than its turn explains its lateness. On an H100 that two healthy ranks shared,
the collectives named one of them slow in 3 captures of 4 (docs/benchmarks.md, "Real GPU")."""

from __future__ import annotations

import pytest

from stepscope.analysis.diagnosis.diagnose import diagnose
from stepscope.analysis.model import RankSummary
from stepscope.testing.synthetic_ranks import make_summaries

GPU = "GPU-5a9bd1c2-7e21-4e5f-8a1b-2c3d4e5f6a7b"


def _on(summaries: list[RankSummary], *uuids: str) -> list[RankSummary]:
    for s, uuid in zip(summaries, uuids):
        s.gpuUuid = uuid
    return summaries


def test_the_late_rank_of_two_that_share_a_gpu_is_its_turn_not_a_slow_worker():
    # Rank 1 arrives last at most collectives, its peer waiting 26 ms of an 898 ms step for it,
    # with no more GPU work than its peer, far less than the peer's 859 ms of kernels a step that
    # it waits for on the shared GPU (before: "rank 1 holds its peers back").
    diagnosis, found = diagnose(_on(make_summaries(2, slow_rank=1, extra_step_us=20_000, seed=4), GPU, GPU))
    assert diagnosis.slowWorkers == [], diagnosis.summary
    shared = [f for f in found if f.category == "hardware" and f.data.get("gpuUuid") == GPU]
    assert len(shared) == 1 and shared[0].ranks == [0, 1] and shared[0].data["late"] == [1]
    assert shared[0].message.startswith(f"ranks 0-1 compute on one GPU ({GPU}): they take turns on it")
    assert "rank 1 arrives last at most collectives" in shared[0].message
    assert "not a slow worker" in shared[0].message and "torch.cuda.set_device(local_rank)" in shared[0].message


def test_ranks_on_gpus_of_their_own_keep_the_late_rank_a_slow_worker():
    diagnosis, found = diagnose(_on(make_summaries(2, slow_rank=1, extra_step_us=20_000, seed=4), GPU, GPU[:-1] + "c"))
    assert [w.rank for w in diagnosis.slowWorkers] == [1], diagnosis.summary
    assert not [f for f in found if "compute on one GPU" in f.message]


@pytest.mark.parametrize(
    "slowed",
    [
        {"extra_step_us": 1_200_000.0, "seed": 4},  # later than any turn: more than its peer's GPU time
        {"kernel_factor": 1.3, "seed": 5},  # its kernels run longer
    ],
)
def test_a_rank_slower_than_its_turn_on_a_shared_gpu_is_still_named(slowed: dict):
    diagnosis, found = diagnose(_on(make_summaries(2, slow_rank=1, **slowed), GPU, GPU))
    assert [w.rank for w in diagnosis.slowWorkers] == [1], diagnosis.summary
    shared = [f for f in found if "compute on one GPU" in f.message]
    assert len(shared) == 1 and shared[0].data["late"] == []


def test_traces_without_the_agents_gpu_say_nothing_of_sharing():
    # Traces others recorded carry no UUID: the same index on two ranks may be two GPUs
    # (CUDA_VISIBLE_DEVICES), so nothing is claimed and the late rank stays a slow worker.
    diagnosis, found = diagnose(make_summaries(2, slow_rank=1, extra_step_us=20_000, seed=4))
    assert [w.rank for w in diagnosis.slowWorkers] == [1]
    assert not [f for f in found if "compute on one GPU" in f.message]
