"""Prometheus metrics of the operator, served on /metrics by prometheus_client (as the sidecar's
step telemetry is): a few counters and the sessions by phase, in a registry of their own."""
from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stepscope.contracts.states import SessionPhase

REGISTRY = CollectorRegistry()


class PhaseGauge(Collector):
    """Sessions by phase: each session counts in exactly one phase, the last one it was seen in;
    every phase is exposed, at 0 when no session is in it."""

    PHASES = tuple(SessionPhase)

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

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self.help, labels=("phase",))
        for phase in self.PHASES:
            family.add_metric([phase], self.count(phase))
        yield family


def _counter(name: str, help_text: str) -> Counter:
    # prometheus_client appends `_total` to a counter's samples itself
    return Counter(name.removesuffix("_total"), help_text, registry=REGISTRY)


SESSIONS = PhaseGauge("stepscope_sessions", "ProfileSessions known to this operator, by phase")
REGISTRY.register(SESSIONS)
TRIGGERS = _counter("stepscope_sidecar_triggers_total", "sidecars that accepted a session trigger")
SIDECAR_ERRORS = _counter("stepscope_sidecar_errors_total", "failed requests to sidecars (each attempt)")
STATUS_WRITES = _counter("stepscope_status_writes_total", "ProfileSession status patches written")
ANALYSIS_JOBS = _counter("stepscope_analysis_jobs_total", "analysis Jobs created")
PODS_NOT_INJECTED = _counter("stepscope_pods_not_injected_total", "pods labelled stepscope.io/inject=true that started without the sidecar")


def value(sample: str) -> float:
    """A sample's current value, by its exposed name (`stepscope_sidecar_triggers_total`)."""
    return REGISTRY.get_sample_value(sample) or 0.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds would flood the log
        pass


_exposition = make_wsgi_app(REGISTRY)


def _app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    if environ.get("PATH_INFO") != "/metrics":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: the metrics are at /metrics\n"]
    return _exposition(environ, start_response)


def serve(host: str, port: int) -> WSGIServer:
    """Serve /metrics from a daemon thread; returns the server (its port when 0 was asked)."""
    server = make_server(host, port, _app, server_class=_Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="stepscope-metrics", daemon=True).start()
    return server
