"""The in-process agent: counts training steps and captures the steps a sidecar asks for.

This package is copied whole into the pod's shared directory as `bootstrap/stepscope_agent/` and
loaded by the bootstrap `sitecustomize` of every Python process in the pod, so it imports only the
standard library (and the wire vocabulary the bootstrap writes beside it, vocabulary.py) at start,
and touches torch only once the program has imported torch itself (an import hook on `torch`,
torch_hooks.py). docs/wire.md fixes the files it reads and writes. Its modules import each other
relatively, so the package works under either name.

Its parts: process.py (the process's one agent, start, fork re-arm, step()), agent.py (step
boundary, requests, watchdog), capture.py (the profiler of one session), decisions.py (the
capture's decisions, pure), session.py (one request), rank.py (identity and the files a rank
writes), step_ring.py, stacks.py, budget.py, torch_hooks.py, files.py (atomic writes),
schedstat.py (the scheduler's counters at each captured step boundary, with the stop watch of
stop_watch.c, a native library `make` builds beside it) and environment.py (the one reader of
the environment).

Each step boundary also records the step's time in the rank's step ring
(`telemetry/rank-<r>.steps`, docs/wire.md "Step telemetry"), which the sidecar serves as
metrics: two struct writes into a memory map, always on. Every 2 s a boundary also reads the
timing DistributedDataParallel keeps of its own gradient all-reduce, which the heartbeat carries
(`collectiveWait`) and the sidecar turns into the rank's wait share.

Steps are the calls of torch's global optimizer step post-hook (one optimizer leads, so several
optimizers still count one step), or `step()` calls for loops without an optimizer; the first
`step()` switches the hook off. Step indices are zero-based: a capture from startStep to endStep
records steps startStep..endStep-1, annotated ProfilerStep#startStep..#endStep-1.

What torch.profiler records depends on the thread that starts it: by default its state is
thread-local, so operator (aten) events come only from that thread (and threads that inherit its
profiling state, such as autograd's), Python function events (withStack) from every thread, and
a stop from any other thread is ignored (torch only warns). So captures start and stop at step
boundaries, on the training thread. A durationSeconds capture must also end when its time is up
while the loop makes no step (it blocks in data loading, or sits between epochs), so it uses
torch's profile_all_threads instead: process-wide state that records every thread's operators
and that any thread may stop (torch's own distributed debug handler profiles that way from a
server thread). The watchdog thread stops it, under the agent's lock so never during the
training thread's profiler step, once the duration is over and no step boundary came for 1 s
(STEPLESS_AFTER_SECONDS; a loop that still steps gets that long to end it on a boundary). Its
trace then ends inside the step in progress: ProfilerStep#endStep holds the part recorded, and
the state message says so. A durationSeconds capture in a process that reaches no step boundary
at all (none for 1 s, or 10 s before a first step, STEPSCOPE_FIRST_STEP_GRACE_SECONDS) is
started and stopped by the watchdog thread. A torch without profile_all_threads keeps the
thread-local profiler: its duration captures end at the next step boundary (or hang), and a
stepless one holds every thread's Python functions but none of the training thread's operators,
as its state message says.

The agent answers requests only in processes known to train (a step seen, torch.distributed
initialized, or RANK set in a process that is no multiprocessing child), so a launcher that
imports torch (torchrun) and data loader workers stay quiet. A forked child (os.fork, or
multiprocessing's fork start method) inherits the agent without its threads, so it re-arms an
agent of its own: its own step count, pid and rank (RANK from its environment, else its
torch.distributed rank); as a forked data loader worker shares its parent's RANK and process
group, a forked child registers and answers only from its first step, which also starts its
watchdog. It never raises into the training loop: a failure is logged ("stepscope.agent") and
written to the session's state file.
"""

from __future__ import annotations

from .process import current, start, step

__all__ = ["current", "start", "step"]
