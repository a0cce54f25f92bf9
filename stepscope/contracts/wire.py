"""The words of the wire (docs/wire.md): rank states and their sets, shared-directory file names,
versions, id rules, defaults and the control port. The one home of each: the sidecar, operator,
CLI and tests import it, and the sidecar's bootstrap copies the contracts next to the agent (as
`stepscope_contracts`), which imports them from there. Standard library only, and cheap to import:
every Python process of a training pod loads it at start.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays unimported at run time (see above)
    from collections.abc import Sequence
    from typing import TypeGuard

WIRE_VERSION = 1  # of request.json and the agent's state and stacks files

DEFAULT_DIR = "/var/run/stepscope"
DIR_ENV = "STEPSCOPE_DIR"
DEFAULT_PORT = 7470
PORT_NAME = "stepscope"

# Shared-directory layout.
REQUEST_FILE = "request.json"
AGENTS_FOLDER = "agents"
BOOTSTRAP_FOLDER = "bootstrap"
SIDECAR_FOLDER = "sidecar"  # the sidecar's own files (GPU metrics, session records)
TELEMETRY_FOLDER = "telemetry"  # each rank's step ring (below)
AGENT_MODULE = "stepscope_agent"
CONTRACTS_MODULE = "stepscope_contracts"  # the bootstrap's copy of stepscope.contracts

# A rank's states in its state file. `hung` is not final: a rank whose steps resume goes back to
# `waiting` or `capturing` and may still end `done` with a trace.
WAITING, CAPTURING, WRITING, HUNG = "waiting", "capturing", "writing", "hung"
DONE, FAILED, CANCELLED, REFUSED = "done", "failed", "cancelled", "refused"
ACTIVE_STATES = frozenset({WAITING, CAPTURING, WRITING, HUNG})
FINAL_STATES = frozenset({DONE, FAILED, CANCELLED, REFUSED})
FAILED_STATES = frozenset({FAILED, HUNG, REFUSED})  # the rank counts as failed (a hung one, until it resumes)
STARTED_STATES = frozenset({CAPTURING, WRITING, DONE})
STATES = ACTIVE_STATES | FINAL_STATES

# The capture budget's defaults (spec.capture.limits): what a production job can afford without
# asking. Python function events cost the training thread about 40-170 us each when the profiler
# stops (measured on 2 shared cores, benchmarks/capture_cost.py), so 100 000 of them bound that
# pause to a few seconds; the memory bound covers what the profiler holds while it records.
# Together they keep a capture's peak under 1 GB: up to 512 MB recorded, and the stop's
# expansion of at most 100 000 Python events (~3 KB each, measured) on top.
DEFAULT_MAX_STACK_EVENTS = 100_000
# How a rank's state (and so its summary's warnings) begins the sentence that says the budget
# dropped its Python stacks: the diagnosis then says its function figures are sampled (below), or,
# without samples, that it cannot name a function and why.
STACKS_DROPPED = "Python stacks dropped"
# Where the budget dropped them, the agent samples every thread's stack this often instead
# (python_function events with args "Sampled": true): +4 % CPU time a captured step on 2 loaded
# cores (benchmarks/stack_sampler_cost.py), against several times the step for the tracer's calls
# it replaces, and enough samples over a few steps to name a function that takes a few ms a step.
STACK_SAMPLE_SECONDS = 0.002
DEFAULT_MAX_MEMORY_MB = 512
# The capture's defaults, which the spec's fields (stepscope.contracts.session, and so the CRDs)
# take, kept here beside the agent's other words: the agent fills them into what a hand-written
# request.json leaves out. Eight steps: on a loaded machine four cannot tell a modest straggler (10 % of the step)
# from a healthy rank that the load held back as long (benchmarks/diagnosis_accuracy.py,
# docs/benchmarks.md); eight can, for 4 more profiled steps (0.2-0.6 s, twice the trace).
DEFAULT_WAIT_STEPS = 5
DEFAULT_CAPTURE_STEPS = 8
DEFAULT_ACTIVITIES = ("CPU", "CUDA")
# Operators' input shapes: the diagnosis tells a slower rank with the same shapes (a slow host or
# device) from one with larger inputs (uneven shards) by them. Recorded for operators only, not for
# Python events, so the stack budget above bounds them too (benchmarks/capture_cost.py).
DEFAULT_RECORD_SHAPES = True
DEFAULT_HANG_TIMEOUT_SECONDS = 300


def aligned_start_step(completed: Sequence[int], wait_steps: int) -> int | None:
    """The absolute step every rank starts capturing at (request.json's startStep): waitSteps after
    the most steps any live rank has completed (DDP ranks step in lockstep, so their counters
    agree to a step). The operator takes the counts of every selected pod, a sidecar without a
    startStep those of its own ranks; None when no live rank has counted a step."""
    return max(completed) + wait_steps if completed else None


# Step telemetry: every training process keeps its latest steps in `telemetry/rank-<r>.steps`, a
# ring that the agent writes at each step boundary and the sidecar reads, with no lock (one writer;
# the reader validates each slot by its step number). struct formats, little-endian:
# header (magic, capacity, rank, local rank, world size, pid, wall-clock minus CLOCK_MONOTONIC
# seconds at creation, the process's run id: random, as a restarted container's process has the
# pid of the one before; 0 from agents older than it), then at TELEMETRY_COUNT_AT the steps written so far, then from
# TELEMETRY_SLOTS_AT `capacity` slots; the slot of step n (1-based, the steps completed) is
# n % capacity and holds (n, CLOCK_MONOTONIC seconds when step n ended, seconds since step n-1
# ended). Writing the slot before the count lets a reader take slots up to the count it read.
TELEMETRY_MAGIC = "SSTEPS01"  # ASCII
TELEMETRY_HEADER = "<8sqqqqqdq"
TELEMETRY_COUNT = "<q"
TELEMETRY_COUNT_AT = 64
TELEMETRY_SLOT = "<qdd"
TELEMETRY_SLOTS_AT = 128
TELEMETRY_CAPACITY = 4096  # a power of two: ~4 s of 1 ms steps between two reads, 96 KiB a rank

_ID_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_ID_REST = _ID_FIRST | frozenset("._-")
MAX_SESSION_ID = 128


def valid_session_id(value: object) -> TypeGuard[str]:
    """Session ids become folder names: a letter or digit, then letters, digits, '.', '_', '-'."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_SESSION_ID
        and value[0] in _ID_FIRST
        and all(c in _ID_REST for c in value)
    )


def valid_file_name(value: object) -> bool:
    """A plain file name (what an agent may name in its state file), nothing that leaves the folder."""
    return (
        isinstance(value, str) and 0 < len(value) <= 255 and value[0] in _ID_FIRST and all(c in _ID_REST for c in value)
    )


def agent_file(rank: int) -> str:
    return f"rank-{rank}.json"


def state_file(rank: int) -> str:
    return f"rank-{rank}.state.json"


def trace_file(rank: int) -> str:
    return f"rank-{rank}.trace.json.gz"


def stacks_file(rank: int) -> str:
    return f"rank-{rank}.stacks.json"


def telemetry_file(rank: int) -> str:
    return f"rank-{rank}.steps"


# The trace's top-level key (torch.profiler's add_metadata_json) under which the agent writes its
# training thread's scheduler times at each captured step boundary, from Linux's
# /proc/<pid>/task/<tid>/schedstat: {"steps": [[step, cpu_ns, run_delay_ns], ...]}, the counters
# as the step began (the last entry: as the capture ended). The diagnosis tells by them a host that
# stops or throttles a rank (time neither on a CPU nor waiting for one) from a machine whose ranks
# share its CPUs (time waiting in the run queue).
SCHEDSTAT_KEY = "stepscopeSchedstat"
# At most this many boundaries are kept (a duration capture may make many steps), here and below.
MAX_SCHEDSTAT_STEPS = 10_000
# ... and, where the process's cgroup has a CPU controller, the time the cgroup's CPU limit
# (cpu.max, cpu.cfs_quota_us: a Kubernetes CPU limit) held it throttled, from its cpu.stat:
# {"steps": [[step, throttled_ns], ...]} at the same boundaries. A throttled thread waits in the
# run queue, so the scheduler's run-queue time holds it; this tells it from CPUs other work takes.
THROTTLED_KEY = "stepscopeThrottled"
# ... and how long its process was stopped (SIGSTOP, a frozen cgroup, a paused container): a thread
# of the agent's that sleeps in 2-ms slices while the capture runs wakes late by a stop whatever the
# training thread was doing, and its own run-queue time is the part of that lateness the busy CPUs
# explain: {"steps": [[step, late_ns, run_delay_ns], ...]}, at the same boundaries. The training
# thread's counters alone cannot tell a stop that falls into its sleeps or its wait for its peers.
STOPPED_KEY = "stepscopeStopped"
# The trace's top-level key under which the agent writes the GPU its process computes on, as the
# agent's state has it: {"index": gpu, "uuid": gpuUuid}. Ranks with the same UUID share one device
# whatever index each process sees it under (CUDA_VISIBLE_DEVICES), which the diagnosis tells.
GPU_KEY = "stepscopeGpu"
