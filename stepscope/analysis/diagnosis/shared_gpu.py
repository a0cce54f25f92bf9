"""Ranks that compute on one GPU. Processes that share a GPU without MPS take turns on it (the
driver time-slices their contexts), so at every collective one of them arrives after the other
with no more work of its own: on an H100 that two healthy ranks of a job shared, the
collectives named one of them a slow worker in 4 captures of 8, its peer waiting 1.5-4.8 ms of a
50 ms step for it. The agent writes the UUID of its rank's GPU into the trace (wire.GPU_KEY), so
ranks that share one are known whatever index each process sees it under.
"""

from __future__ import annotations

import pandas as pd

from stepscope.analysis.diagnosis.rank_tables import RankTables
from stepscope.analysis.diagnosis.slow_workers import SlowEvidence, kernel_ratios
from stepscope.analysis.diagnosis.wording import ms, ranks_text
from stepscope.analysis.model import Finding


def shared_gpus(tables: RankTables) -> dict[str, list[int]]:
    """Each GPU (UUID) that two or more ranks with GPU events compute on: its ranks."""
    r = tables.ranks
    if "gpuUuid" not in r:
        return {}
    on = r[r["hasGpu"] & (r["gpuUuid"] != "")]
    groups = on.groupby("gpuUuid")["rank"].apply(lambda ranks: sorted(int(x) for x in ranks))
    return {str(uuid): ranks for uuid, ranks in groups.items() if len(ranks) > 1}


def _gpu_time(tables: RankTables) -> pd.DataFrame:
    """Per rank, its compute kernels' time per step (`busy`) and how much of it is beyond its
    peers' for the same kernels (`excess`); communication kernels apart, as the rank that arrives
    last at a collective has the shortest ones."""
    _, k = kernel_ratios(tables)
    computing = k[k["type"] != "COMM"]
    if computing.empty:
        return pd.DataFrame({"busy": [], "excess": []}, dtype=float)
    per_rank = computing.groupby("rank")[["sumUs", "excessUsPerStep"]].sum()
    busy = per_rank["sumUs"] / tables.step_counts(per_rank.index.to_numpy())
    return pd.DataFrame({"busy": busy, "excess": per_rank["excessUsPerStep"]})


def taking_turns(tables: RankTables, evidence: dict[int, SlowEvidence], explained: set[int]) -> list[int]:
    """The ranks that only the collectives name slow, that share their GPU, and whose lateness
    their turn on it accounts for: no more than the GPU time of the ranks they share it with (what
    a turn can make them wait), and neither their own GPU work (at least half of what their peers
    wait for them, as a cause must account for elsewhere in the diagnosis) nor a finding of their
    own (`explained`) accounts for it instead."""
    sharing = {rank: ranks for ranks in shared_gpus(tables).values() for rank in ranks}
    if not sharing:
        return []
    gpu = _gpu_time(tables)
    return [
        rank
        for rank, e in evidence.items()
        if rank in sharing
        and e.voteShare
        and not e.stepRatio
        and not e.kernelRatio
        and rank not in explained
        and float(gpu["excess"].get(rank, 0.0)) < 0.5 * e.peersWaitUsPerStep
        and e.peersWaitUsPerStep <= float(gpu["busy"].reindex([r for r in sharing[rank] if r != rank]).sum())
    ]


def shared_gpu_findings(
    tables: RankTables, turns: list[int], evidence: dict[int, SlowEvidence], median_step_us: float
) -> list[Finding]:
    """A finding per GPU that several ranks share, with what their turns cost where the collectives
    showed it (`turns`, from taking_turns)."""
    found = []
    for uuid, ranks in shared_gpus(tables).items():
        late = [r for r in turns if r in ranks]
        cost = max((evidence[r].waitUsPerStep(median_step_us) for r in late), default=0.0)
        message = (
            f"{ranks_text(ranks)} compute on one GPU ({uuid}): they take turns on it, each waiting for "
            "the others' kernels"
        )
        if late:
            message += (
                f"; {ranks_text(late)} arrives last at most collectives with no more GPU work than its peers "
                f"(they wait {ms(cost)} of each {ms(median_step_us)} step): its turn on the GPU, not a slow worker"
            )
        share = cost / median_step_us if median_step_us > 0 else 0.0
        found.append(
            Finding(
                "warning",
                "hardware",
                ranks,
                message + ". Give each rank its own GPU (torch.cuda.set_device(local_rank), one GPU per process)",
                share,
                {"gpuUuid": uuid, "late": late, "peersWaitUsPerStep": round(cost, 1)},
            )
        )
    return found
