"""The critical path of one rank's trace across CPU ops, launches, GPU kernels and synchronisation.

The definition is Holistic Trace Analysis' `critical_path_analysis` (HTA 0.5.0), built here from
the trace's columns without HTA or a graph library:

- every CPU operator and CUDA runtime/driver call, and every GPU kernel, copy or set with a launching
  call, is two nodes, its start and its end;
- on each CPU thread, the starts and ends in call-stack order are chained by edges weighing the time
  between them (an edge into the end of a blocking call such as cudaStreamSynchronize weighs 0: the
  wait is the GPU's), and consecutive top-level ops by a 0-weight dependency edge;
- each GPU event's start and end are joined by its duration; a kernel starts either after a launch
  delay edge from its launching call (when its stream was empty at the launch and the kernel
  before it had ended) or after a kernel-kernel edge from the previous kernel's end on its stream;
- a Stream Sync or Context Sync adds a 0-weight edge from the last kernel of its stream (all
  streams) to the end of the synchronising call; an Event Sync from the kernel launched just
  before the cudaEventRecord it waits on; a Stream Wait Event from that kernel to the next kernel
  launched on the waiting stream.

The critical path is the longest path of that graph. Every edge goes forward in time, and every
node has at most one in-edge along its thread or stream (its chain); so the longest distance to
each node is a max-plus scan along the chains (a prefix sum and a running maximum), repeated while
the edges between chains (launches, syncs) raise a distance. The rounds are as many as the times
the longest path changes chains, plus one. The path's edges are classified as HTA does: CPU-bound
(an op's own time on a thread), GPU compute or communication (a kernel's time), kernel launch
overhead, kernel-kernel overhead (the gap between kernels on a stream).

Between equally long ways into a node this takes the one along the chain, HTA the first edge its
graph was given; on the shared real traces the two give the same path. A sub-µs kernel rounded
inwards ends a µs before it starts: its edge weighs 0, as in HTA's search (HTA's breakdown then
reports it as -1 µs). Of the kernels of one cudaGraphLaunch, HTA's clipping keeps only the one
its call is linked to (`hta=True`); by default all are on the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepscope.analysis.loading.trace import OPERATOR_CAT, RUNTIME_CATS, SYNC_CAT, Trace

from ..model import CriticalPathSummary, PathShare
from . import intervals
from .gpu_scope import HTA_COMM_KERNELS, CommKernels

# HTA's BLOCKING_SYNC_CALLS: the CPU waits in them for the GPU.
BLOCKING_CALLS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventQuery",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpyAsync",
)
# HTA's launch calls for the queue length and the launch edges (its get_runtime_launch_events_query).
LAUNCH_CALLS = (
    "cudaMemsetAsync",
    "cudaMemcpyAsync",
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "runFunction - job_prep_and_submit_for_execution",
    "hipLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipMemcpyAsync",
    "hipMemsetAsync",
    "hipMemcpyWithStream",
)
OPERATOR, DEPENDENCY, LAUNCH_DELAY, KERNEL_KERNEL, SYNC = range(5)
EDGE_TYPES = ("operator", "dependency", "kernel_launch_delay", "kernel_kernel_delay", "sync_dependency")
# HTA's bound_by of an edge, by code; "" for the edges of no weight (dependencies and syncs).
BOUNDS = (
    "cpu_bound",
    "gpu_compute_bound",
    "gpu_communication_bound",
    "gpu_kernel_kernel_overhead",
    "gpu_kernel_launch_overhead",
    "",
)
CPU_BOUND, GPU_COMPUTE, GPU_COMM, KERNEL_OVERHEAD, LAUNCH_OVERHEAD, NO_BOUND = range(len(BOUNDS))


@dataclass
class CriticalPath:
    """The path's edges in time order: source and destination times (µs), weight, edge type (index
    into EDGE_TYPES), the trace row the edge is attributed to (-1 for none) and its bound_by (index
    into BOUNDS)."""

    src_ts: np.ndarray
    dst_ts: np.ndarray
    weight: np.ndarray
    kind: np.ndarray
    row: np.ndarray
    bound: np.ndarray
    rounds: int

    @property
    def total_us(self) -> int:
        return int(self.weight.sum())

    def breakdown(self) -> dict[str, float]:
        """Time on the path by what bounds it (HTA's bound_by), edges of no weight left out."""
        sums = np.bincount(self.bound, weights=self.weight, minlength=len(BOUNDS))
        present = np.bincount(self.bound, minlength=len(BOUNDS)) > 0
        return {BOUNDS[i]: float(sums[i]) for i in range(NO_BOUND) if present[i]}


def _launchers(trace: Trace, keep: np.ndarray) -> np.ndarray:
    """For each row, the CPU runtime/driver call with its correlation when the row is on a GPU stream,
    the GPU row with its correlation when the row is such a call (of several, as HTA's
    index_correlation: the last to start); -1 otherwise."""
    n = len(trace)
    out = np.full(n, -1, dtype=np.int64)
    runtime = np.flatnonzero(trace.cat_mask(RUNTIME_CATS) & (trace.correlation >= 0) & (trace.stream == -1) & keep)
    gpu = np.flatnonzero((trace.stream != -1) & (trace.correlation >= 0) & keep)
    j = intervals.lookup(trace.correlation[runtime], trace.correlation[gpu])
    out[gpu[j >= 0]] = runtime[j[j >= 0]]
    latest = gpu[np.lexsort((gpu, trace.ts[gpu]))[::-1]]
    k = intervals.lookup(trace.correlation[latest], trace.correlation[runtime])
    out[runtime[k >= 0]] = latest[k[k >= 0]]
    return out


def _queue_lengths(trace: Trace, corr: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Outstanding launches on each stream (HTA's queue length): after each launch call (indexed by
    the launch row) and after each GPU event starts (indexed by the GPU row); NaN for other rows."""
    n = len(trace)
    q = np.full(n, np.nan)
    calls = np.flatnonzero(launch & (corr >= 0))
    kernels = corr[calls]
    rows = np.concatenate([calls, kernels])
    step = np.concatenate([np.ones(len(calls)), -np.ones(len(kernels))])
    stream = trace.stream[np.concatenate([kernels, kernels])]
    order = np.lexsort((trace.ts[rows], stream))
    rows, step, stream = rows[order], step[order], stream[order]
    total = np.cumsum(step)
    first = np.concatenate([[True], stream[1:] != stream[:-1]]) if len(stream) else np.zeros(0, bool)
    base = np.maximum.accumulate(np.where(first, np.arange(len(stream)), 0)) if len(stream) else np.zeros(0, np.int64)
    q[rows] = total - (total[base] - step[base])
    return q


def _previous_launch(
    trace: Trace,
    corr: np.ndarray,
    launch: np.ndarray,
    at_rows: np.ndarray,
    streams: np.ndarray,
    pids: np.ndarray,
    tids: np.ndarray | None,
    after: bool,
) -> np.ndarray:
    """For each call in at_rows, the GPU row of the launch on (pid, stream) [and CPU thread] that comes
    last at or before it (after=False), or first at or after it (after=True); -1 where none."""
    calls = np.flatnonzero(launch & (corr >= 0))
    kernels = corr[calls]
    out = np.full(len(at_rows), -1, dtype=np.int64)
    if len(calls) == 0 or len(at_rows) == 0:
        return out
    thread_c = trace.tid[calls] if tids is not None else np.zeros(len(calls), np.int64)
    thread_a = tids if tids is not None else np.zeros(len(at_rows), np.int64)
    keys_c = np.stack([trace.pid[kernels], trace.stream[kernels], thread_c], axis=1)
    keys_a = np.stack([pids, streams, thread_a], axis=1)
    _, inverse = np.unique(np.concatenate([keys_c, keys_a]), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    gc, ga = inverse[: len(calls)], inverse[len(calls) :]
    # Each group's launches on a time axis of its own: the group's offset keeps them apart.
    span = float(max(trace.ts.max() - trace.ts.min(), 1.0)) * 4 + 4
    tc = trace.ts[calls] - trace.ts.min() + gc * span
    ta = trace.ts[at_rows] - trace.ts.min() + ga * span
    order = np.argsort(tc, kind="stable")
    tc_sorted, kernels_sorted, gc_sorted = tc[order], kernels[order], gc[order]
    if after:
        pos = np.searchsorted(tc_sorted, ta, side="left")
        ok = pos < len(tc_sorted)
        pos = np.minimum(pos, len(tc_sorted) - 1)
    else:
        pos = np.searchsorted(tc_sorted, ta, side="right") - 1
        ok = pos >= 0
        pos = np.maximum(pos, 0)
    ok &= gc_sorted[pos] == ga
    out[ok] = kernels_sorted[pos[ok]]
    return out


def critical_path(
    trace: Trace,
    rows: np.ndarray | None = None,
    start: float | None = None,
    end: float | None = None,
    comm: CommKernels = HTA_COMM_KERNELS,
    hta: bool = False,
) -> CriticalPath | None:
    """The critical path of the events in [start, end] (default: all), as HTA's critical_path_analysis
    clips them: CPU events starting in the window, GPU events whose launching call starts in it.
    `rows`: the rows HTA analyses (gpu_scope's, without the last step's). None when the window holds
    no CPU op or call. `hta`: HTA's own clipping, which keeps of the kernels of one launch (a CUDA
    graph's) only the one the call is linked to; by default all of them are on the graph, chained
    along their stream."""
    keep = np.ones(len(trace), dtype=bool)
    if rows is not None:
        keep[:] = False
        keep[rows] = True
    return _critical_path(trace, keep, start, end, comm, hta)


def _critical_path(
    trace: Trace, keep: np.ndarray, start: float | None, end: float | None, comm: CommKernels, hta: bool
) -> CriticalPath | None:
    n = len(trace)
    if n == 0 or not keep.any():
        return None
    ts = np.rint(trace.ts).astype(np.int64)
    dur = np.rint(trace.dur).astype(np.int64)
    end_ts = ts + dur
    lo = int(ts[keep].min()) if start is None else start
    hi = int(end_ts[keep].max()) if end is None else end
    corr = _launchers(trace, keep)
    on_cpu = trace.stream == -1
    sync_cat = trace.cat_mask(SYNC_CAT)
    names = np.array(trace.names + [""], dtype=object)
    name_of = names[trace.name]

    def named(values: tuple[str, ...]) -> np.ndarray:
        return trace.name_mask(lambda s: s in values)

    cpu_in = keep & on_cpu & (ts >= lo) & (ts <= hi) & (dur > 0)
    has_call = corr >= 0
    call = np.where(has_call, corr, 0)
    gpu_in = (
        keep
        & ~on_cpu
        & (
            (
                has_call
                & (ts[call] >= lo)
                & (ts[call] <= hi)
                & (dur[call] > 0)
                & on_cpu[call]
                & ((not hta) | (corr[call] == np.arange(n)))
            )
            | named(("Stream Wait Event",))
        )
    )
    node_ev = np.flatnonzero(
        (cpu_in & trace.cat_mask((OPERATOR_CAT, *RUNTIME_CATS))) | (gpu_in & has_call & on_cpu[call] & cpu_in[call])
    )
    if not cpu_in.any() or not (cpu_in[node_ev]).any():  # no CPU op or call: nothing to start a path
        return None
    # Kernels none of which has a launching call (an Ascend capture) are out of reach of the graph:
    # a path of the CPU alone would pass for the whole.
    if (keep & ~on_cpu).any() and not (keep & ~on_cpu & has_call).any():
        return None
    # Nodes: 2k is the start of node_ev[k], 2k+1 its end.
    # Node and row numbers fit an int32 (a trace holds a few million rows at most): half the memory.
    slot = np.full(n, -1, dtype=np.int32)
    slot[node_ev] = np.arange(len(node_ev), dtype=np.int32)
    node_ts = np.empty(2 * len(node_ev), dtype=np.int64)
    node_ts[0::2], node_ts[1::2] = ts[node_ev], end_ts[node_ev]
    node_row = np.repeat(node_ev.astype(np.int32), 2)

    cpu_seq, cpu_w, cpu_kind, cpu_attr = _cpu_chains(
        trace, node_ev[on_cpu[node_ev]], slot, ts, dur, node_row, named(BLOCKING_CALLS)
    )

    # --- GPU: kernels in HTA's order (syncs by their end), per stream.
    gpu_ev = node_ev[~on_cpu[node_ev] & ~sync_cat[node_ev]]
    syncs = np.flatnonzero(gpu_in & sync_cat & has_call)
    sort_by = np.concatenate([ts[gpu_ev], end_ts[syncs]])
    items = np.concatenate([gpu_ev, syncs])
    order = np.lexsort((items, sort_by))
    items = items[order]
    position = np.full(n, -1, dtype=np.int64)
    position[items] = np.arange(len(items))
    is_kernel = ~sync_cat[items]
    kern = items[is_kernel]
    kpos = position[kern]
    kstream = trace.stream[kern]
    by_stream = np.lexsort((kpos, kstream))
    ks = kern[by_stream]
    first_on_stream = np.concatenate([[True], kstream[by_stream][1:] != kstream[by_stream][:-1]])[: len(ks)]
    prev_kernel = np.full(n, -1, dtype=np.int64)
    prev_kernel[ks[~first_on_stream]] = ks[np.flatnonzero(~first_on_stream) - 1]

    launch = named(LAUNCH_CALLS) & on_cpu & keep
    q = _queue_lengths(trace, corr, launch)

    # Stream Wait Event: the kernel launched last before the cudaEventRecord, on the recorded stream,
    # must end before the next kernel launched on the waiting stream after cudaStreamWaitEvent.
    gpu_sync_src = np.full(n, -1, dtype=np.int64)  # dest kernel row -> source kernel row
    event_sync = (np.empty(0, np.int64), np.empty(0, np.int64))  # (Event Sync row, source kernel row)
    kind_name = name_of[syncs]
    waits = syncs[(kind_name == "Stream Wait Event") | (kind_name == "Event Sync")]
    if len(waits):
        src = _record_source(trace, keep, corr, launch, waits)
        wait_calls = corr[waits]
        stream_wait = name_of[waits] == "Stream Wait Event"
        dest = np.full(len(waits), -1, dtype=np.int64)
        if stream_wait.any():
            w = waits[stream_wait]
            dest[stream_wait] = _previous_launch(
                trace,
                corr,
                launch,
                wait_calls[stream_wait],
                trace.stream[w],
                trace.pid[w],
                trace.tid[wait_calls[stream_wait]],
                after=True,
            )
        ok = stream_wait & (src >= 0) & (dest >= 0)
        # A wait applies to kernels processed after it.
        ok &= position[np.maximum(dest, 0)] > position[waits]
        gpu_sync_src[dest[ok]] = src[ok]
        known = ~stream_wait & (src >= 0)
        event_sync = (waits[known], src[known])

    ksrc = gpu_sync_src[kern]
    has_src = (ksrc >= 0) & (slot[np.maximum(ksrc, 0)] >= 0)
    ksrc = np.where(has_src, ksrc, -1)
    prev = prev_kernel[kern]
    runtime = corr[kern]
    rt_ts = ts[runtime]
    prev_end = np.where(prev >= 0, end_ts[np.maximum(prev, 0)], 0)
    src_end = np.where(ksrc >= 0, end_ts[np.maximum(ksrc, 0)], 0)
    launched = (
        (q[runtime] == 1)
        & (q[kern] == 0)
        & ((prev < 0) | (prev_end < rt_ts))
        & ((ksrc < 0) | (src_end < rt_ts))
        & (slot[runtime] >= 0)
    )
    after_kernel = ~launched & (prev >= 0) & ((ksrc < 0) | (src_end < prev_end))

    # --- Chains: each CPU thread's tokens, each stream's kernels (start, end); the in-edge along
    # the chain of each position (weight, type, attribution), -1 weight where a chain breaks.
    ks_start = 2 * slot[ks]
    gpu_nodes = np.stack([ks_start, ks_start + 1], axis=1).ravel()
    kk = np.zeros(n, bool)
    kk[kern[after_kernel]] = True
    # A kernel overlapping the one before it on its stream (HTA refuses such a graph) gets a 0-weight edge.
    gap = np.maximum(ts[ks] - end_ts[np.maximum(prev_kernel[ks], 0)], 0)
    # A sub-µs kernel rounded inwards ends a µs before it starts: HTA weighs that -1 as 0.
    g_w = np.stack([np.where(kk[ks], gap, -1), np.maximum(dur[ks], 0)], axis=1).ravel()
    g_kind = np.stack([np.where(kk[ks], KERNEL_KERNEL, -1), np.full(len(ks), OPERATOR)], axis=1).ravel()
    g_attr = np.stack([np.where(kk[ks], prev_kernel[ks], -1), ks], axis=1).ravel()
    seq = np.concatenate([cpu_seq, gpu_nodes]).astype(np.int32)
    in_w = np.concatenate([cpu_w, g_w])
    in_kind = np.concatenate([cpu_kind, g_kind]).astype(np.int8)
    in_attr = np.concatenate([cpu_attr, g_attr]).astype(np.int32)
    del cpu_seq, cpu_w, cpu_kind, cpu_attr, gpu_nodes, g_w, g_kind, g_attr, prev_kernel, kk, q

    # --- Edges between chains.
    x_src: list[np.ndarray] = []
    x_dst: list[np.ndarray] = []
    x_kind: list[np.ndarray] = []
    kl = kern[launched]
    x_src.append(2 * slot[corr[kl]])
    x_dst.append(2 * slot[kl])
    x_kind.append(np.full(len(kl), LAUNCH_DELAY))
    kw = kern[ksrc >= 0]
    x_src.append(2 * slot[gpu_sync_src[kw]] + 1)
    x_dst.append(2 * slot[kw])
    x_kind.append(np.full(len(kw), SYNC))
    s_src, s_dst = _cpu_syncs(trace, syncs, name_of, position, ks, first_on_stream, corr, slot, event_sync)
    x_src.append(s_src)
    x_dst.append(s_dst)
    x_kind.append(np.full(len(s_src), SYNC))
    xs, xd, xk = np.concatenate(x_src), np.concatenate(x_dst), np.concatenate(x_kind)
    xw = np.where(xk == LAUNCH_DELAY, node_ts[xd] - node_ts[xs], 0)
    del position, name_of, corr, slot, ts, dur, end_ts
    del node_row
    return _longest(node_ts, seq, in_w, in_kind, in_attr, xs, xd, xw, xk, trace, comm)


def _cpu_chains(
    trace: Trace,
    cpu_ev: np.ndarray,
    slot: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    node_row: np.ndarray,
    blocking: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each CPU thread's chain: the nodes of its ops' starts and ends in call-stack order, and the
    in-edge of each along the chain (weight, -1 at a thread's first; type; attributed row)."""
    k = len(cpu_ev)
    end_ts = ts[cpu_ev] + dur[cpu_ev]
    tok_start = np.concatenate([np.ones(k, bool), np.zeros(k, bool)])
    # Sorted by thread, time, then at one time: ends before starts; of two starts the longer (the
    # parent) first; of two ends the later-started (the child) first; then the row. One stable sort
    # per key from the last (a lexsort would hold all the keys at once).
    order = np.argsort(np.concatenate([cpu_ev, -cpu_ev]), kind="stable")
    for key in (
        np.concatenate([-dur[cpu_ev], -ts[cpu_ev]]),
        tok_start,
        np.concatenate([ts[cpu_ev], end_ts]),
        np.concatenate([trace.tid[cpu_ev], trace.tid[cpu_ev]]),
    ):
        order = order[np.argsort(key[order], kind="stable")]
        del key
    tok_node = np.concatenate([2 * slot[cpu_ev], 2 * slot[cpu_ev] + 1])[order]
    tok_ts = np.concatenate([ts[cpu_ev], end_ts])[order]
    tok_tid = np.concatenate([trace.tid[cpu_ev], trace.tid[cpu_ev]])[order]
    tok_start = tok_start[order]
    del order, end_ts
    depth_after = np.cumsum(np.where(tok_start, 1, -1))
    dependency = tok_start & (depth_after == 1)  # a top-level op starts
    tok_row = node_row[tok_node]
    parent = _parents(tok_start, depth_after, tok_row)
    del depth_after
    same = np.concatenate([[False], tok_tid[1:] == tok_tid[:-1]])
    prev_start = np.concatenate([[False], tok_start[:-1]])
    prev_row = np.concatenate([[-1], tok_row[:-1]])
    weight = np.where(dependency | (~tok_start & blocking[tok_row]), 0, tok_ts - np.concatenate([[0], tok_ts[:-1]]))
    kind = np.where(dependency, DEPENDENCY, OPERATOR)
    # HTA's attribution: start->x to the start's op, end->end to the outer op, end->start to their parent.
    attr = np.where(prev_start, prev_row, np.where(~tok_start, tok_row, parent[np.maximum(prev_row, 0)]))
    return (
        tok_node,
        np.where(same, weight, -1),
        np.where(same, kind, -1).astype(np.int8),
        np.where(same & ~dependency, attr, -1).astype(np.int32),
    )


def _parents(tok_start: np.ndarray, depth_after: np.ndarray, tok_row: np.ndarray) -> np.ndarray:
    """Row of each op's enclosing op (-1 at the top), indexed by row, from the call-stack tokens."""
    out = np.full(int(tok_row.max()) + 1 if len(tok_row) else 1, -1, dtype=np.int64)
    starts = np.flatnonzero(tok_start)
    for level in range(2, int(depth_after.max()) + 1 if len(depth_after) else 0):
        child = starts[depth_after[starts] == level]
        outer = starts[depth_after[starts] == level - 1]
        if len(child) == 0 or len(outer) == 0:
            continue
        j = np.searchsorted(outer, child) - 1
        ok = j >= 0
        out[tok_row[child[ok]]] = tok_row[outer[j[ok]]]
    return out


def _record_source(
    trace: Trace, keep: np.ndarray, corr: np.ndarray, launch: np.ndarray, waits: np.ndarray
) -> np.ndarray:
    """For each Stream Wait Event / Event Sync row, the GPU row of the kernel launched last, on the
    recorded stream, before the cudaEventRecord it waits on; -1 where unknown."""
    out = np.full(len(waits), -1, dtype=np.int64)
    records = np.flatnonzero(trace.name_mask(lambda s: s == "cudaEventRecord") & (trace.stream == -1) & keep)
    known = np.flatnonzero((trace.wait_stream > -1) & keep)
    if len(records) == 0 or len(known) == 0:
        return out
    # The stream (and GPU) each recorded event was recorded on, from any wait on it.
    j = intervals.lookup(trace.wait_record[known], trace.correlation[records])
    records, j = records[j >= 0], j[j >= 0]
    rec_stream, rec_pid = trace.wait_stream[known[j]], trace.pid[known[j]]
    src = _previous_launch(trace, corr, launch, records, rec_stream, rec_pid, None, after=False)
    r = intervals.lookup(trace.correlation[records], trace.wait_record[waits])
    ok = r >= 0
    out[ok] = src[r[ok]]
    return out


def _cpu_syncs(
    trace: Trace,
    syncs: np.ndarray,
    name_of: np.ndarray,
    position: np.ndarray,
    ks: np.ndarray,
    first_on_stream: np.ndarray,
    corr: np.ndarray,
    slot: np.ndarray,
    event_sync: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """GPU->CPU edges: from the last kernel before a Stream Sync on its stream, before a Context
    Sync on every stream, of an Event Sync's recorded kernel, to the end of the synchronising call."""
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    calls = corr[syncs]
    has_end = slot[calls] >= 0
    kstream = trace.stream[ks]
    bounds = np.flatnonzero(np.concatenate([first_on_stream, [True]]))
    for a, b in zip(bounds[:-1], bounds[1:]):
        stream_k = ks[a:b]
        kpos = position[stream_k]
        want = has_end & (
            (name_of[syncs] == "Context Sync")
            | ((name_of[syncs] == "Stream Sync") & (trace.stream[syncs] == kstream[a]))
        )
        s = syncs[want]
        j = np.searchsorted(kpos, position[s]) - 1
        ok = j >= 0
        src.append(2 * slot[stream_k[j[ok]]] + 1)
        dst.append(2 * slot[calls[want][ok]] + 1)
    rows, kernels = event_sync
    src.append(np.where(slot[kernels] >= 0, 2 * slot[kernels] + 1, -1))
    dst.append(np.where(slot[corr[rows]] >= 0, 2 * slot[corr[rows]] + 1, -1))
    if not src:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    s, d = np.concatenate(src), np.concatenate(dst)
    ok = (s >= 0) & (d >= 0)
    return s[ok], d[ok]


def _longest(
    node_ts: np.ndarray,
    seq: np.ndarray,
    in_w: np.ndarray,
    in_kind: np.ndarray,
    in_attr: np.ndarray,
    xs: np.ndarray,
    xd: np.ndarray,
    xw: np.ndarray,
    xk: np.ndarray,
    trace: Trace,
    comm: CommKernels,
) -> CriticalPath:
    m = len(node_ts)
    # A break in a chain weighs less than any path can gain after it (paths are at most the span long).
    big = 2 * int(node_ts.max() - node_ts.min()) + 1 if m else 1
    breaks = in_w < 0
    breaks[:1] = True
    prefix = np.cumsum(np.where(breaks, -big, in_w))
    del in_w
    dist = np.zeros(m, dtype=np.int64)
    best = np.zeros(m, dtype=np.int64)
    rounds = 0
    while True:
        rounds += 1
        best.fill(0)
        np.maximum.at(best, xd, dist[xs] + xw)
        along_chain = best[seq]
        along_chain -= prefix
        np.maximum.accumulate(along_chain, out=along_chain)
        along_chain += prefix
        if np.array_equal(along_chain, dist[seq]) or rounds > len(xs) + 1:
            break
        dist[seq] = along_chain
    del along_chain
    # Where the path into each chain position comes from: along the chain (ties go to it) or across.
    along = np.zeros(len(seq), bool)
    gain = dist[seq[:-1]]
    gain += prefix[1:]
    gain -= prefix[:-1]
    along[1:] = gain >= best[seq[1:]]
    along &= ~breaks
    del best, gain, breaks
    taken = (dist[xs] + xw == dist[xd]) & (dist[xd] > 0)
    cross_of = np.full(m, -1, dtype=np.int32)
    hits = np.flatnonzero(taken)[::-1].astype(np.int32)
    cross_of[xd[hits]] = hits  # the first cross edge giving each node its distance
    place = np.full(m, -1, dtype=np.int32)
    place[seq] = np.arange(len(seq), dtype=np.int32)
    # The start of the run along the chain that each position belongs to.
    run_start = np.arange(len(seq), dtype=np.int32)
    run_start[along] = 0
    np.maximum.accumulate(run_start, out=run_start)
    del along
    end_nodes = np.flatnonzero(dist == dist.max())
    node = int(end_nodes[np.argmin(node_ts[end_nodes])])
    del dist, taken, hits, end_nodes
    pieces: list[tuple[np.ndarray, ...]] = []
    while True:
        p = int(place[node])
        if p < 0:
            break
        r = int(run_start[p])
        if p > r:  # chain edges into positions r+1..p
            pos = np.arange(r + 1, p + 1)
            pieces.append(
                (node_ts[seq[pos - 1]], node_ts[seq[pos]], prefix[pos] - prefix[pos - 1], in_kind[pos], in_attr[pos])
            )
        e = int(cross_of[seq[r]])
        if e < 0:
            break
        pieces.append((node_ts[xs[e : e + 1]], node_ts[xd[e : e + 1]], xw[e : e + 1], xk[e : e + 1], np.array([-1])))
        node = int(xs[e])
    del place, run_start, cross_of, prefix
    if not pieces:
        empty = np.empty(0, np.int64)
        return CriticalPath(empty, empty, empty, empty, empty, empty, rounds)
    parts = [np.concatenate(x) for x in zip(*pieces)]
    del pieces
    order = np.lexsort((parts[1], parts[0]))
    src_ts, dst_ts, weight, kind, row = (x[order] for x in parts)
    del parts, order
    return CriticalPath(
        src_ts,
        dst_ts,
        weight.astype(np.int64),
        kind.astype(np.int64),
        row.astype(np.int64),
        _bounds(trace, kind, row, comm),
        rounds,
    )


def _bounds(trace: Trace, kind: np.ndarray, row: np.ndarray, comm: CommKernels) -> np.ndarray:
    """HTA's bound_by of each edge."""
    on_gpu = (row >= 0) & (trace.stream[np.maximum(row, 0)] != -1)
    is_comm = trace.name_mask(lambda s: comm.library(s) is not None, np.maximum(row, 0))
    out = np.where(
        kind == KERNEL_KERNEL,
        KERNEL_OVERHEAD,
        np.where(
            kind == LAUNCH_DELAY,
            LAUNCH_OVERHEAD,
            np.where(
                (kind == DEPENDENCY) | (kind == SYNC),
                NO_BOUND,
                np.where(~on_gpu, CPU_BOUND, np.where(is_comm, GPU_COMM, GPU_COMPUTE)),
            ),
        ),
    )
    return out.astype(np.int64)


# A span's name in the summary is cut here (kernel names run to thousands of characters).
_SPAN_NAME_CHARS = 300
# What the path's edges without an op of their own are called in its top contributors.
_GAP_NAMES = {KERNEL_OVERHEAD: "gap between kernels on a stream", LAUNCH_OVERHEAD: "kernel launch delay"}


def path_summary(trace: Trace, path: CriticalPath, top: int = 15, spans: int = 200) -> CriticalPathSummary:
    """The path's total, its time by bound, the ops and kernels of most time on it, and its longest
    edges (for the merged trace)."""
    weight = path.weight.astype(np.float64)
    # Each edge's label: its op's name code, or past the names one per bound for the gaps.
    label = np.where(path.row >= 0, trace.name[np.maximum(path.row, 0)], len(trace.names) + path.bound)
    labels = trace.names + [_GAP_NAMES.get(b, BOUNDS[b]) for b in range(len(BOUNDS))]
    keep = (weight > 0) & (path.bound != NO_BOUND)
    keys = path.bound[keep] * len(labels) + label[keep]
    uniq, inverse = np.unique(keys, return_inverse=True)
    sums = np.bincount(inverse, weights=weight[keep], minlength=len(uniq))
    order = np.argsort(-sums, kind="stable")[:top]
    shares = [
        PathShare(
            name=labels[int(uniq[i]) % len(labels)], boundBy=BOUNDS[int(uniq[i]) // len(labels)], us=float(sums[i])
        )
        for i in order
    ]
    kept_rows = np.flatnonzero(keep)
    longest = kept_rows[np.argsort(-weight[kept_rows], kind="stable")[:spans]]
    longest = longest[np.argsort(path.src_ts[longest], kind="stable")]
    span_labels, name_of = np.unique(label[longest], return_inverse=True)
    return CriticalPathSummary(
        totalUs=float(weight.sum()),
        startUs=float(path.src_ts.min()) if len(weight) else 0.0,
        endUs=float(path.dst_ts.max()) if len(weight) else 0.0,
        byBound=dict(sorted(path.breakdown().items())),
        top=shares,
        spans=[
            (float(a), float(b), int(c), BOUNDS[d])
            for a, b, c, d in zip(
                path.src_ts[longest].tolist(), weight[longest].tolist(), name_of.tolist(), path.bound[longest].tolist()
            )
        ],
        spanNames=[labels[int(i)][:_SPAN_NAME_CHARS] for i in span_labels],
    )
