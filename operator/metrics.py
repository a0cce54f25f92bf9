"""Prometheus metrics of the operator in the text exposition format, served on /metrics.

A few counters and one gauge do not justify a client library dependency; the format is small."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self._value = 0.0
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value += amount

    @property
    def value(self) -> float:
        return self._value

    def render(self) -> str:
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} counter\n{self.name} {self._value:g}\n"


class PhaseGauge:
    """Sessions by phase: each session counts in exactly one phase, the last one it was seen in."""

    PHASES = ("Pending", "Capturing", "Analyzing", "Succeeded", "Failed")

    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self._phase_of: dict[str, str] = {}
        self._lock = threading.Lock()

    def set(self, session: str, phase: str | None) -> None:
        with self._lock:
            if phase is None:
                self._phase_of.pop(session, None)
            else:
                self._phase_of[session] = phase

    def count(self, phase: str) -> int:
        with self._lock:
            return sum(1 for p in self._phase_of.values() if p == phase)

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge"]
        lines += [f'{self.name}{{phase="{p}"}} {self.count(p)}' for p in self.PHASES]
        return "\n".join(lines) + "\n"


SESSIONS = PhaseGauge("stepscope_sessions", "ProfileSessions known to this operator, by phase")
TRIGGERS = Counter("stepscope_sidecar_triggers_total", "sidecars that accepted a session trigger")
SIDECAR_ERRORS = Counter("stepscope_sidecar_errors_total", "failed requests to sidecars (each attempt)")
STATUS_WRITES = Counter("stepscope_status_writes_total", "ProfileSession status patches written")
ANALYSIS_JOBS = Counter("stepscope_analysis_jobs_total", "analysis Jobs created")
PODS_NOT_INJECTED = Counter("stepscope_pods_not_injected_total", "pods labelled stepscope.io/inject=true that started without the sidecar")
REGISTRY = (SESSIONS, TRIGGERS, SIDECAR_ERRORS, STATUS_WRITES, ANALYSIS_JOBS, PODS_NOT_INJECTED)


def render() -> str:
    return "".join(m.render() for m in REGISTRY)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404)
            return
        body = render().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # scrapes every few seconds would flood the log
        pass


def serve(host: str, port: int) -> ThreadingHTTPServer:
    """Serve /metrics from a daemon thread; returns the server (its port when 0 was asked)."""
    server = ThreadingHTTPServer((host, port), _Handler)
    threading.Thread(target=server.serve_forever, name="stepscope-metrics", daemon=True).start()
    return server
