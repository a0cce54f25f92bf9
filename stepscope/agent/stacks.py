"""Python stacks: every thread's stack at one moment (the stacks file of a hung rank), and the
sampler that stands in for torch's Python tracer where the capture budget dropped it."""
from __future__ import annotations

import sys
import threading
import time

from .vocabulary import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any


def thread_stacks() -> list[dict[str, Any]]:
    """Every thread's Python stack, outermost frame first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads: list[dict[str, Any]] = []
    for ident, top in sys._current_frames().items():
        frames: list[dict[str, Any]] = []
        frame: FrameType | None = top
        while frame is not None:
            frames.append({"file": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name})
            frame = frame.f_back
        frames.reverse()
        threads.append({"id": ident, "name": names.get(ident, f"thread-{ident}"), "main": ident == main, "frames": frames})
    return threads



def sample_spans(times: list[float], interval: float) -> list[tuple[float, float]]:
    """The span of time each sample of a thread's stack (taken at `times`, in order) stands for.

    The sampler needs the GIL to take a sample: while a thread runs pure Python, the sampler waits
    for it until the interpreter's switch interval makes that thread let go, and a sample comes
    late. The time it waited beyond its interval was spent in what that late sample shows (the
    thread that held the GIL ran it until then), not in what the sample before showed, which
    lasts one interval. Each sample so stands for the time from the end of its predecessor's
    interval (or its own time, if sooner) to the next sample's start; the last one for an interval."""
    starts = [times[0]] + [min(t, before + interval) for before, t in zip(times, times[1:])]
    return list(zip(starts, starts[1:] + [times[-1] + interval]))


# While the sampler samples, the interpreter asks a thread that runs Python to let go of the GIL
# after this long (rather than its default 5 ms), so that samples come no later than this: the
# switch costs microseconds and happens only when another thread (the sampler) waits for the GIL.
SAMPLING_SWITCH_SECONDS = wire.STACK_SAMPLE_SECONDS / 4


class StackSampler:
    """Samples every thread's Python stack every wire.STACK_SAMPLE_SECONDS while a capture whose
    stacks the budget dropped records: a few hundred samples where the tracer would have recorded
    millions of events. At export they become the trace's python_function events (each sample
    stands for the span sample_spans gives it; a frame on consecutive samples is one event), named
    as torch's tracer names them, so the analysis can still name the function the time goes to, on
    the training thread (`thread_id`, whose events go on the steps' thread) and on any other
    thread of the process (a logging thread that holds the GIL). Samples stop once they hold
    maxStackEvents frames."""

    def __init__(self, thread_id: int, max_frames: int) -> None:
        self.thread_id = thread_id
        self.max_frames = max_frames
        self.samples: list[tuple[float, int, tuple[tuple[int, Any], ...]]] = []
        self.anchors: list[tuple[int, float]] = []  # (ProfilerStep number, monotonic time it began)
        # The frames running when sampling starts: the tracer names them by their current line
        # (later calls by their first line); held so that their ids are not reused meanwhile.
        self.running: dict[int, tuple[Any, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, step: int) -> None:
        """On the training thread, right after the profiler started its first step."""
        frame: Any = sys._getframe(1)
        while frame is not None:
            self.running[id(frame)] = (frame, f"{frame.f_code.co_filename}({frame.f_lineno}): {frame.f_code.co_name}")
            frame = frame.f_back
        self.anchor(step)
        self._thread = threading.Thread(target=self._run, name="stepscope-sampler", daemon=True)
        self._thread.start()

    def anchor(self, step: int) -> None:
        self.anchors.append((step, time.monotonic()))

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SAMPLING_SWITCH_SECONDS))
        try:
            self._sample()
        finally:
            sys.setswitchinterval(switch)

    def _sample(self) -> None:
        frames = 0
        me = threading.get_ident()
        while not self._stop.wait(wire.STACK_SAMPLE_SECONDS) and frames < self.max_frames:
            now = time.monotonic()
            for ident, top in sys._current_frames().items():
                if ident == me:
                    continue
                frame: Any = top
                stack: list[tuple[int, Any]] = []
                while frame is not None:
                    stack.append((id(frame), frame.f_code))
                    frame = frame.f_back
                stack.reverse()
                self.samples.append((now, ident, tuple(stack)))
                frames += len(stack)

    def events(self, trace_events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The samples as python_function events in the clock of `trace_events`, placed by the
        ProfilerStep spans (whose starts the agent timed too) on the training thread's tid."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        steps = {e["name"]: e for e in trace_events if str(e.get("name", "")).startswith("ProfilerStep#")}
        offsets = sorted(steps[f"ProfilerStep#{n}"]["ts"] - t * 1e6 for n, t in self.anchors if f"ProfilerStep#{n}" in steps)
        if not offsets:
            return []
        offset = offsets[len(offsets) // 2]
        first = steps[f"ProfilerStep#{self.anchors[0][0]}"]
        prefixes = trace_prefixes()
        names: dict[int, str] = {}

        def name(key: int, code: Any) -> str:
            if key in self.running and self.running[key][0].f_code is code:
                return trimmed(self.running[key][1], prefixes)
            if id(code) not in names:
                names[id(code)] = trimmed(f"{code.co_filename}({code.co_firstlineno}): {code.co_name}", prefixes)
            return names[id(code)]

        out: list[dict[str, Any]] = []
        by_thread: dict[int, list[tuple[float, tuple[tuple[int, Any], ...]]]] = {}
        for t, ident, stack in self.samples:
            by_thread.setdefault(ident, []).append((t, stack))
        for ident, samples in by_thread.items():
            # The training thread's events go on the steps' thread; another thread's on its own.
            tid = first.get("tid") if ident == self.thread_id else ident
            open_: list[tuple[int, Any, dict[str, Any]]] = []
            spans = sample_spans([t for t, _ in samples], wire.STACK_SAMPLE_SECONDS)
            for (_, stack), (begin, end) in zip(samples, spans):
                ts = begin * 1e6 + offset
                same = 0
                while same < min(len(open_), len(stack)) and open_[same][0] == stack[same][0] and open_[same][1] is stack[same][1]:
                    same += 1
                del open_[same:]
                for key, code in stack[same:]:
                    event = {"ph": "X", "cat": "python_function", "name": name(key, code), "pid": first.get("pid"), "tid": tid,
                             "ts": ts, "dur": 0.0, "args": {"Python parent id": open_[-1][2]["args"]["Python id"] if open_ else None,
                                                            "Python id": len(out) + 1, "Sampled": True}}
                    out.append(event)
                    open_.append((key, code, event))
                for _, _, event in open_:
                    event["dur"] = end * 1e6 + offset - event["ts"]
        self.running.clear()
        return out


def trace_prefixes() -> list[str]:
    """The folders torch's tracer cuts from a file name (sys.path and site-packages)."""
    try:
        from torch.profiler.python_tracer import _prefix_regex

        return list(_prefix_regex())
    except Exception:  # noqa: BLE001 - a private torch helper: whatever it raises, names stay untrimmed
        return []


def trimmed(name: str, prefixes: list[str]) -> str:
    return next((name[len(p):] for p in prefixes if name.startswith(p)), name)

