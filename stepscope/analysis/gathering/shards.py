"""One shard of a session's raw traces summarised into its store, as a pod of the analysis's
Indexed Job does: the ranks with a raw trace are dealt round-robin to `shards` shards, shard
`index` summarises those of its ranks that have no summary and writes each summary where a
sidecar would have put it (layout.rank_summary), so the reduce reads it as an uploaded one.

The deal depends on the ranks that have a trace, which no shard changes, so a retried shard gets
the same ranks and skips what an earlier try of it already wrote."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from stepscope.analysis.gathering.session_files import RankFiles, find_files, local_path, read_summary
from stepscope.analysis.model import encode
from stepscope.contracts import layout
from stepscope.storage import Store, open_store


def shard_of(ranks: Iterable[int], index: int, shards: int) -> list[int]:
    """The ranks of shard `index` of `shards`: every shards-th of the sorted ranks, from the index-th."""
    if not 0 <= index < shards:
        raise ValueError(f"shard index {index} is not in 0..{shards - 1}")
    return sorted(ranks)[index::shards]


def traced_ranks(files: Iterable[RankFiles]) -> list[int]:
    """The ranks of a stepscope session folder that have a raw trace, summarised or not."""
    return sorted(f.rank for f in files if f.trace and f.rank is not None)


def unsummarised(files: Iterable[RankFiles]) -> list[int]:
    """The ranks that have a raw trace and no summary: what the shards have to do."""
    return sorted(f.rank for f in files if f.trace and not f.summary and f.rank is not None)


@dataclass
class ShardResult:
    ranks: list[int]  # the shard's ranks
    written: list[int] = field(default_factory=list)  # summarised here and written
    kept: list[int] = field(default_factory=list)  # had a summary already (the sidecar's, or an earlier try's)


def summarise_shard(store: Store, index: int, shards: int) -> ShardResult:
    """Summarise shard `index` of `shards` of the session in `store` into it. A trace that cannot
    be downloaded raises StoreError (the Job retries the shard); a trace that is no good gets the
    failed summary the single-process analysis would make of it, written like any other."""
    files = {f.rank: f for f in find_files(store).ranks if f.rank is not None}
    result = ShardResult(shard_of(traced_ranks(files.values()), index, shards))
    for rank in result.ranks:
        rank_files = files[rank]
        if rank_files.summary:
            result.kept.append(rank)
            continue
        assert rank_files.trace is not None, "traced_ranks holds ranks with a trace"
        # Downloaded here, so that a store that fails is this shard's failure (retried), not the rank's.
        with local_path(store, rank_files.trace) as path:
            summary = read_summary(open_store(str(path.parent)), RankFiles(rank, trace=path.name), rank)
        store.put_bytes(layout.rank_summary(rank), encode(summary))
        result.written.append(rank)
    return result
