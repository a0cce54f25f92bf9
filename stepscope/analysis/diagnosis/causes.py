"""Where one rank spends the time its peers spend waiting: the Python frame (function, operator
call or phase) on the training thread whose inclusive time per step exceeds its peers' by the
most, named as a user would: the outermost function of the program's own that carries most of
that excess and that its peers spend little time in (run_evaluation, not the helper it calls, nor
the training loop every rank runs), with the deepest frame that still carries most of it as its
detail (the helper the time is spent in).

Inputs are the `functions` table of rank_tables (exclusive time per call stack, stepscope's own
frames already left out). A frame's inclusive time is the exclusive time of every stack it is on,
counted once per stack (recursion does not double it). Time a rank spends waiting for its peers
(in a collective, in backward for the gradient all-reduce, on a lock) is never a cause: it is
excess on the waiting ranks, not on the one they wait for, and such frames are not candidates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepscope.analysis.diagnosis.rank_tables import MAIN_THREAD, RankTables
from stepscope.analysis.diagnosis.wording import function_text, ms

# Frames where a rank waits for its peers (a collective, its Work, torch.distributed's wrappers):
# their time, and their callers' time through them, is never a cause.
PEER_WAIT = (
    r"<built-in method "
    r"(?:wait|allreduce|barrier|broadcast|allgather|reduce_scatter|_allgather_base|_reduce_scatter_base|"
    r"alltoall_base|send|recv) of pybind11|distributed_c10d\.py\(\d+\): |c10d_logger\.py\(\d+\): wrapper"
)
# Frames where a thread blocks locally (a lock, a condition, a queue): not a cause themselves, but
# the user function that blocks there is one (a rank slowed by its own lock or loader queue).
LOCAL_WAIT = r"threading\.py\(\d+\): wait|acquire of _thread"
WAITING = re.compile(f"{PEER_WAIT}|{LOCAL_WAIT}")
# Backward holds both the backward work and, on DDP's ranks, the wait for the gradient all-reduce:
# a cause on a rank its peers wait for (its work), never on the ranks that wait there.
BACKWARD = re.compile(r"<built-in method run_backward")
# What torch's Python tracer adds to each profiled Python call (with_stack): 1.0 µs measured
# with torch 2.13 on a loaded 2-core machine (0.4 µs calls took 1.5 µs profiled).
PROFILED_CALL_US = 1.0
# The deepest frame that still holds this share of the top frame's excess is the one named.
CARRIES = 0.7
# The function named spends no more than this share of its excess on the peers: the training loop
# (every rank runs it; its excess is a fraction of its time) is where the cause is called from.
OWN_SHARE = 0.1
# torch's and the interpreter's own frames, not the program's: never the function named.
LIBRARY = re.compile(r"(?:^|[\\/])torch[\\/]|^nn\.Module: |^<(?:built-in|method|frozen) ")
# A cause takes at least this many times its peers' time there: a frame every rank spends most
# of its step in (the training loop) is a few per cent slower on a busy machine, not a cause.
CAUSE_RATIO = 1.5
# Phases, by a frame on the cause's call path (first match wins, the deepest frame first).
_PHASES = (
    (re.compile(r"dataloader\.py|[\\/]utils[\\/]data[\\/]"), "data loading"),
    (re.compile(r"comm_hook|register_comm_hook|_hook\b"), "communication hook"),
    (re.compile(r"optimizer\.py|[\\/]optim[\\/]"), "optimizer step"),
    (re.compile(r"run_backward|_engine_run_backward|_tensor\.py\(\d+\): backward"), "backward"),
    (re.compile(r"nn\.Module: |module\.py\(\d+\): _call_impl|\): forward$"), "forward"),
)
_BUILTIN = re.compile(r"^<(?:built-in|method) ")
_ANONYMOUS = re.compile(r"\): <(?:genexpr|listcomp|dictcomp|setcomp|lambda|module)>$")


@dataclass(frozen=True)
class Cause:
    """The frame named as the cause, with the figures behind it (per step)."""

    frame: str  # the user-facing frame (Kineto's raw name)
    inner: str  # the built-in it spends the time in ('' when none, or the same frame)
    phase: str  # data loading | forward | backward | optimizer step | communication hook | ''
    excessUsPerStep: float  # this rank's inclusive time there minus its peers' median
    usPerStep: float
    peersUsPerStep: float
    callsPerStep: float  # profiled Python calls under the frame
    kind: str = "function"  # function | operators | thread
    detail: str = ""  # how an operators or thread cause reads (a function's is built from the frame)
    pattern: str = ""  # an intermittent cause's steps: "every 4th step", "in 2 of 8 steps"
    helper: str = ""  # the function's callee (of the program's own) that carries most of its excess

    def text(self) -> str:
        if self.detail:
            return self.detail
        where = function_text(self.frame)
        if self.helper:
            where += f", mostly in its helper {function_text(self.helper)}"
        if self.inner and self.inner != self.frame:
            where += f", in {function_text(self.inner)}"
        return where + (f" ({self.phase})" if self.phase and self.phase not in where else "")


def frames(tables: RankTables) -> pd.DataFrame:
    """Per rank and frame name on the training thread: inclusive µs per step, calls per step, and
    (for the cause's path) the stacks it is on. Columns: rank, frame, depth, stack, usPerStep,
    calls, index (the stack's row in tables.functions)."""
    f = tables.functions
    if f.empty:
        return pd.DataFrame(columns=["rank", "frame", "depth", "stack", "usPerStep", "calls"])
    f = f[(f["thread"] == MAIN_THREAD) & ~f["stack"].str.contains(PEER_WAIT)]
    steps = tables.step_counts(f["rank"].to_numpy())
    exploded = pd.DataFrame(
        {
            "rank": f["rank"].to_numpy(),
            "stack": f["stack"].to_numpy(),
            "us": f["exclusiveUs"].to_numpy() / steps,
            "calls": f["count"].to_numpy() / steps,
            "frame": f["stack"].str.split(" > ").to_numpy(),
        },
        index=f.index,
    ).explode("frame")
    exploded["depth"] = exploded.groupby(level=0).cumcount()
    exploded["frame"] = exploded["frame"].str.replace(r" at 0x[0-9a-fA-F]+", "", regex=True)
    # Once per stack: a recursive frame is on its stack more than once.
    exploded = exploded.reset_index().drop_duplicates(["index", "frame"]).rename(columns={"us": "usPerStep"})
    return exploded[["rank", "frame", "depth", "stack", "usPerStep", "calls", "index"]]


def excess_by_frame(
    exploded: pd.DataFrame, rank: int, ranks: list[int], sampled: frozenset[int] = frozenset()
) -> pd.DataFrame:
    """Frames of `rank` with its inclusive µs per step, its peers' median and the excess.

    `sampled`: ranks whose stacks the agent sampled (the budget dropped their traced stacks). Where
    some ranks are sampled and others traced, the two are not compared as if both were exact: C
    functions (built-ins) are left out, as samples cannot see them, and a traced rank's frames lose
    the tracer's own cost of the calls under them, which the sampled rank does not pay."""
    mixed = bool(sampled) and not set(ranks) <= set(sampled)
    if mixed:
        exploded = exploded[~exploded["frame"].str.match(_BUILTIN)]
        traced = ~exploded["rank"].isin(sampled)
        exploded = exploded.assign(
            usPerStep=np.where(
                traced,
                np.maximum(exploded["usPerStep"] - PROFILED_CALL_US * exploded["calls"], 0.0),
                exploded["usPerStep"],
            )
        )
    per = exploded.groupby(["frame", "rank"])["usPerStep"].sum().unstack("rank").reindex(columns=ranks).fillna(0.0)
    if rank not in per.columns:
        return pd.DataFrame(columns=["mine", "peers", "excess"])
    peers = per.drop(columns=[rank]).median(axis=1) if len(ranks) > 1 else pd.Series(0.0, index=per.index)
    out = pd.DataFrame({"mine": per[rank], "peers": peers})
    out["excess"] = out["mine"] - out["peers"]
    return out[~out.index.str.contains(WAITING)]


def find_cause(
    tables: RankTables, rank: int, exploded: pd.DataFrame | None = None, sampled: frozenset[int] = frozenset()
) -> Cause | None:
    """The cause of `rank`'s extra time: None when no frame of it exceeds its peers'."""
    exploded = frames(tables) if exploded is None else exploded
    ranks = sorted(int(r) for r in tables.ranks["rank"])
    if exploded.empty or rank not in ranks:
        return None
    excess = excess_by_frame(exploded, rank, ranks, sampled)
    excess = excess[(excess["excess"] > 0) & (excess["mine"] >= CAUSE_RATIO * excess["peers"])]
    if excess.empty:
        return None
    top = str(excess["excess"].idxmax())
    floor = CARRIES * float(excess.loc[top, "excess"])
    mine = exploded[exploded["rank"] == rank]
    # The frames around the top one (its callers and callees) that carry most of its excess.
    on_path = mine[mine["index"].isin(mine.loc[mine["frame"] == top, "index"])]
    carrying = on_path[on_path["frame"].isin(excess.index[excess["excess"] >= floor])]
    deepest = carrying.groupby("frame")["depth"].max().sort_values(kind="stable")
    inner = str(deepest.index[-1])
    # A generator expression, comprehension or lambda is part of the function that holds it.
    user = [
        str(n)
        for n in deepest.index
        if not _BUILTIN.match(str(n)) and not str(n).startswith("nn.Module: ") and not _ANONYMOUS.search(str(n))
    ]
    own = [
        n
        for n in user
        if not LIBRARY.search(n) and float(excess.loc[n, "peers"]) <= OWN_SHARE * float(excess.loc[n, "excess"])
    ]
    frame = own[0] if own else user[-1] if user else inner
    helper = user[-1] if own and user[-1] != frame and not LIBRARY.search(user[-1]) else ""
    path = on_path[on_path["frame"] == inner]["stack"].iloc[0].split(" > ")
    phase = next((label for pattern, label in _PHASES for f in reversed(path) if pattern.search(f)), "")
    # Every profiled call under the cause (each stack's calls once), for the profiler's cost in it.
    under = mine.drop_duplicates("index").set_index("index")["calls"]
    calls = float(under.loc[mine.loc[mine["frame"] == frame, "index"].unique()].sum())
    row = excess.loc[frame]
    return Cause(
        frame=frame,
        inner=inner if _BUILTIN.match(inner) else "",
        phase=phase,
        excessUsPerStep=float(row["excess"]),
        usPerStep=float(row["mine"]),
        peersUsPerStep=float(row["peers"]),
        callsPerStep=calls,
        helper=helper,
    )


def frame_per_step(tables: RankTables, exploded: pd.DataFrame, frame: str, steps: pd.Index) -> pd.DataFrame | None:
    """Inclusive µs of `frame` in each of `steps` (rows) by rank (columns); None when the summaries
    carry no per-step function times (older ones)."""
    f = tables.functions
    if "stepsUs" not in f or f.empty or not f["stepsUs"].map(len).any():
        return None
    rows = exploded.loc[exploded["frame"] == frame, "index"].drop_duplicates()
    return tables.per_step_of(f.loc[rows], steps)


def _thread_python(tables: RankTables) -> pd.DataFrame:
    """The Python frames of threads other than the training thread (not the built-ins, which mostly
    release the GIL: sleeps, waits, I/O): time the training thread cannot run Python in."""
    f = tables.functions
    return f[(f["thread"] != MAIN_THREAD) & ~f["name"].str.match(_BUILTIN) & ~f["stack"].str.contains(WAITING)]


def thread_per_step(tables: RankTables, thread: str, steps: pd.Index) -> pd.DataFrame | None:
    """The Python µs of background thread `thread` in each of `steps` (rows) by rank (columns);
    None without per-step function times."""
    f = tables.functions
    if "stepsUs" not in f or f.empty or not f["stepsUs"].map(len).any():
        return None
    python = _thread_python(tables)
    return tables.per_step_of(python[python["thread"] == thread], steps)


def thread_cause(tables: RankTables, rank: int) -> Cause | None:
    """The background thread of `rank` that runs the most pure Python beyond its peers' threads of
    the same function (_thread_python). None without one."""
    f = tables.functions
    if f.empty or rank not in set(f["rank"]):
        return None
    f = _thread_python(tables)
    steps = tables.step_counts(f["rank"].to_numpy())
    ranks = sorted(int(r) for r in tables.ranks["rank"])
    per = (
        (f["exclusiveUs"] / steps)
        .groupby([f["thread"], f["rank"]])
        .sum()
        .unstack("rank")
        .reindex(columns=ranks)
        .fillna(0.0)
    )
    if per.empty or len(ranks) < 2:
        return None
    excess = per[rank] - per.drop(columns=[rank]).median(axis=1)
    thread = str(excess.idxmax())
    if float(excess[thread]) <= 0:
        return None
    mine, peers = float(per.loc[thread, rank]), float(per.loc[thread].drop(rank).median())
    return Cause(
        frame=thread,
        inner="",
        phase="",
        excessUsPerStep=float(excess[thread]),
        usPerStep=mine,
        peersUsPerStep=peers,
        callsPerStep=0.0,
        kind="thread",
        detail=f"a background thread in {function_text(thread)} holds the GIL about {ms(float(excess[thread]))} a step "
        f"({ms(mine)} vs {ms(peers)} on its peers), while its training thread needs it",
    )
