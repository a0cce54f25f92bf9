"""Collectives by type: communication kernels on GPU traces (NCCL/RCCL, and those gpu_scope's
CommKernels recognises: DeepEP, NVSHMEM, all-to-alls), gloo (or other CPU backend) calls on CPU-only traces.

Algorithm and protocol come from NCCL kernel names (ncclKernel_AllReduce_RING_LL_Sum_float); other
communication kernels take their kind from what their name says they do, their library as algorithm;
message sizes from the collective arguments PyTorch records ("In msg nelems", "dtype",
"Group size"), on the kernel itself or on the CPU op that launched it (same External id).
"""
from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from stepscope.analysis.loading.trace import Trace

from ..model import CollectiveStat
from . import intervals
from .gpu_scope import COMM, DEFAULT_COMM_KERNELS, CommKernels, name_types

_PROTOCOLS = ("LL128", "LL", "SIMPLE")
_KINDS = {
    "allreduce": "AllReduce", "allgather": "AllGather", "allgatherbase": "AllGather",
    "allgatherintocoalesced": "AllGather", "reducescatter": "ReduceScatter", "reducescatterbase": "ReduceScatter",
    "reducescattertensorcoalesced": "ReduceScatter", "broadcast": "Broadcast", "reduce": "Reduce",
    "alltoall": "AllToAll", "alltoallbase": "AllToAll", "alltoallv": "AllToAll", "send": "SendRecv",
    "recv": "SendRecv", "sendrecv": "SendRecv", "barrier": "Barrier", "gather": "Gather", "scatter": "Scatter",
    "allreducecoalesced": "AllReduce",
}
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "byte": 1,
    "int8": 1, "uint8": 1, "bool": 1,
}
# Bus bandwidth factors (NCCL's performance notes) for groups of n ranks.
_BUS_FACTOR = {"AllReduce": lambda n: 2 * (n - 1) / n, "AllGather": lambda n: (n - 1) / n,
               "ReduceScatter": lambda n: (n - 1) / n, "AllToAll": lambda n: (n - 1) / n}
_CPU_COLLECTIVE_RE = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):([a-z_]+)")
# What a communication kernel outside NCCL does, from its own name (the part before its template
# and parameter lists), first match wins: DeepEP's notify_dispatch exchanges counts before a dispatch.
_PATTERN_KINDS = tuple((re.compile(p), kind) for p, kind in (
    (r"notify", "Notify"), (r"dispatch", "Dispatch"), (r"combine", "Combine"),
    (r"all_?to_?all|(?<![a-z0-9])a2a(?![a-z0-9])", "AllToAll"), (r"all_?reduce|cross_device_reduce", "AllReduce"),
    (r"all_?gather", "AllGather"), (r"reduce_?scatter", "ReduceScatter"), (r"barrier", "Barrier"),
    (r"broadcast", "Broadcast"), (r"(?<![a-z])(put|get|send|recv)", "SendRecv")))


def normalise_kind(raw: str) -> str:
    key = re.sub(r"[^a-z]", "", raw.lower())
    return _KINDS.get(key, raw[:1].upper() + raw[1:] if raw else "Unknown")


def parse_nccl_name(name: str) -> tuple[str, str, str]:
    """(kind, algorithm, protocol) of an NCCL kernel name; empty strings where the name says nothing."""
    tokens = name.split("(")[0].split("_")
    if len(tokens) < 2:
        return "Unknown", "", ""
    kind = normalise_kind(tokens[1])
    protocol = next((t for t in tokens[2:] if t in _PROTOCOLS), "")
    algorithm = "_".join(t for t in tokens[2:tokens.index(protocol) if protocol else len(tokens)] if t.isupper())
    return kind, algorithm, protocol


def comm_kernel_label(name: str, library: str) -> tuple[str, str, str]:
    """(kind, algorithm, protocol) of a communication kernel of `library` (CommKernels.library)."""
    if library == "NCCL":
        return parse_nccl_name(name)
    base = name.removeprefix("void ").split("<")[0].split("(")[0].lower()
    kind = next((k for pattern, k in _PATTERN_KINDS if pattern.search(base)), "Other")
    return kind, library, ""


def dtype_bytes(dtype: str) -> int:
    return _DTYPE_BYTES.get(dtype.lower().replace("torch.", "").replace("c10::", ""), 0)


def _per_distinct(values: list[str], fn: Callable[[str], object], dtype: type) -> np.ndarray:
    """fn of each value, called once per distinct value: a trace repeats a few collective names
    and dtypes on thousands of events."""
    distinct, inverse = np.unique(np.asarray(values, dtype=str), return_inverse=True)
    return np.array([fn(str(v)) for v in distinct], dtype=dtype)[inverse.reshape(-1)]


def _collective_args(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Index into trace.collectives of the arguments of each row (on it, else on the op that
    launched it, by External id), -1 where there are none."""
    coll = trace.collectives
    j = intervals.lookup(coll.row, rows)
    ext = trace.external_id[rows]
    return np.where((j < 0) & (ext >= 0), intervals.lookup(trace.external_id[coll.row], ext), j)


def _args_in_order(trace: Trace, rows: np.ndarray, kinds: list[str]) -> np.ndarray:
    """CPU-side collectives (gloo:all_reduce on a backend thread) are not linked to the op that
    recorded their arguments; the i-th of a kind is the i-th recorded of that kind."""
    coll = trace.collectives
    args = np.full(len(rows), -1)
    recorded = _per_distinct(coll.name, normalise_kind, object)
    by_time = np.argsort(trace.ts[coll.row], kind="stable")
    row_kinds = np.array(kinds, dtype=object)
    for kind in set(kinds):
        mine = np.flatnonzero(row_kinds == kind)
        theirs = by_time[recorded[by_time] == kind]
        n = min(len(mine), len(theirs))
        args[mine[:n]] = theirs[:n]
    return args


def _message_bytes(trace: Trace, args: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bytes moved and group size of each collective, from its arguments (0 without)."""
    coll = trace.collectives
    if len(coll.row) == 0:
        return np.zeros(len(args)), np.zeros(len(args), dtype=np.int64)
    elem = _per_distinct(coll.dtype, dtype_bytes, np.float64)
    gathers = _per_distinct(coll.name, normalise_kind, object) == "AllGather"
    msg_bytes = np.maximum(np.where(gathers, coll.out_nelems, coll.in_nelems), 0) * elem
    return np.where(args >= 0, msg_bytes[args], 0.0), np.where(args >= 0, coll.group_size[args], 0)


def cpu_time_in(trace: Trace, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Time of each [start, end) inside at least one CPU-side collective call (gloo:all_reduce, ...):
    the union of the calls, since gloo runs several of them at once on its threads."""
    rows = np.flatnonzero(trace.name_mask(lambda n: _CPU_COLLECTIVE_RE.match(n) is not None))
    return intervals.covered(intervals.merge(trace.ts[rows], trace.end[rows]), starts, ends)


def collectives(trace: Trace, compute: tuple[np.ndarray, np.ndarray], captured_us: float,
                keep_durations: int = 2000, comm: CommKernels = DEFAULT_COMM_KERNELS) -> list[CollectiveStat]:
    """Per collective kind: count, time, median, bus bandwidth, bottleneck ratio and per-instance durations.

    The per-instance durations (in issue order, at most `keep_durations`) let the diagnosis line up
    the i-th collective across ranks: the rank that arrives last waits least.
    """
    rows = trace.device_rows()
    rows = rows[name_types(trace, comm)[trace.name[rows]] == COMM]
    on_gpu = len(rows) > 0
    if on_gpu:
        label_of = {int(c): comm_kernel_label(trace.names[int(c)], comm.library(trace.names[int(c)]) or "")
                    for c in np.unique(trace.name[rows])}
    else:
        label_of = {i: (normalise_kind(m.group(2)), "", "") for i, n in enumerate(trace.names)
                    if (m := _CPU_COLLECTIVE_RE.match(n))}
    labels = sorted(set(label_of.values()))
    label_idx = np.full(len(trace.names), -1)
    for code, label in label_of.items():
        label_idx[code] = labels.index(label)
    if not len(rows):
        rows = np.flatnonzero(label_idx[trace.name] >= 0)
    if len(rows) == 0:
        return []
    rows = rows[np.argsort(trace.ts[rows], kind="stable")]
    lab = label_idx[trace.name[rows]]
    args = _collective_args(trace, rows) if on_gpu else _args_in_order(trace, rows, [labels[k][0] for k in lab])
    # RCCL names its kernels ncclDevKernel_Generic_N: the recorded collective name says what ran.
    names = np.asarray(trace.collectives.name, dtype=str)
    kinds = _per_distinct(trace.collectives.name, normalise_kind, object)
    recorded = sorted(set(kinds[names != ""]))
    entry_kind = np.append(np.where(names != "", np.searchsorted(np.array(recorded, dtype=object), kinds), -1), -1)
    row_kind = entry_kind[args]  # args == -1 picks the trailing -1
    for old, new in {(int(a), int(b)) for a, b in zip(lab[row_kind >= 0], row_kind[row_kind >= 0])}:
        kind, algorithm, protocol = labels[old]
        if recorded[new] != kind:
            label = (recorded[new], algorithm, protocol)
            if label not in labels:
                labels.append(label)
            lab[(lab == old) & (row_kind == new)] = labels.index(label)
    dur, exposed = intervals.outside(compute, trace.ts[rows], trace.dur[rows])
    size, group = _message_bytes(trace, args)
    group = np.where(group > 0, group, max(trace.world_size, 1)).astype(np.float64)
    out = []
    for k, (kind, algorithm, protocol) in enumerate(labels):
        sel = lab == k
        if not sel.any():
            continue
        d = dur[sel]
        factor = _BUS_FACTOR.get(kind, lambda n: np.ones_like(n))(group[sel])
        sized = size[sel] > 0
        sized_us = d[sized].sum()
        bus_bytes = (size[sel] * factor)[sized].sum()
        out.append(CollectiveStat(
            kind=kind, count=int(sel.sum()), sumUs=float(d.sum()), medianUs=float(np.median(d)),
            algorithm=algorithm, protocol=protocol, bytes=int(size[sel].sum()),
            busBandwidthGBs=float(bus_bytes / sized_us / 1e3) if sized_us > 0 else 0.0,
            bottleneckRatio=float(exposed[sel].sum() / captured_us) if captured_us > 0 else 0.0,
            durationsUs=d[:keep_durations].tolist()))
    return sorted(out, key=lambda c: -c.sumUs)
