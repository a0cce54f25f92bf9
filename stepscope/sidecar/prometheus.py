"""The step telemetry as Prometheus metrics (GET /metrics on the sidecar's port, unsigned like
/healthz: step times only, nothing a session carries). Collected at scrape time from
stepscope.sidecar.telemetry; a rank whose process is gone (no heartbeat) is left out."""
from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from stepscope.sidecar.telemetry import BUCKETS, StepTelemetry

LABELS = ("rank", "local_rank")


class StepCollector(Collector):
    def __init__(self, telemetry: StepTelemetry) -> None:
        self._telemetry = telemetry

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        ranks = [r for r, alive in self._telemetry.refresh() if alive]
        now_mono = time.monotonic()
        histogram = HistogramMetricFamily("stepscope_step_duration_seconds", "Training step time (from one optimizer step to the next)",
                                          labels=LABELS)
        last = GaugeMetricFamily("stepscope_last_step_duration_seconds", "Time of the latest training step", labels=LABELS)
        total = CounterMetricFamily("stepscope_steps", "Training steps completed by the process", labels=LABELS)
        since = GaugeMetricFamily("stepscope_seconds_since_last_step", "Seconds since the latest step ended (grows in a hang)",
                                  labels=LABELS)
        wait = GaugeMetricFamily("stepscope_collective_wait_share",
                                 "Share of a step spent in DDP's gradient all-reduce (its latest sampled iteration over the median step)",
                                 labels=LABELS)
        for r in ranks:
            labels = [str(r.rank), str(r.local_rank)]
            cumulative, buckets = 0, []
            for bound, count in zip(BUCKETS, r.bucket_counts):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            histogram.add_metric(labels, buckets, r.duration_sum)
            total.add_metric(labels, r.steps)
            if r.last_duration is not None:
                last.add_metric(labels, r.last_duration)
            seconds = r.seconds_since_step(now_mono)
            if seconds is not None:
                since.add_metric(labels, seconds)
            share = r.wait_share()
            if share is not None:
                wait.add_metric(labels, share)
        yield from (histogram, last, total, since, wait)


def exposition(telemetry: StepTelemetry) -> tuple[bytes, str]:
    """The text exposition of `telemetry` and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StepCollector(telemetry))
    return generate_latest(registry), CONTENT_TYPE_LATEST
