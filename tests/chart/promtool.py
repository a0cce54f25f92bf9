"""The chart's PrometheusRule as a real Prometheus evaluates it: rule groups rendered by the real
helm, written as a rules file, and training jobs' series as the sidecar exports them (GET /metrics,
docs/wire.md), simulated step by step for `promtool test rules`. Without promtool (Debian's and
Ubuntu's `prometheus` package, or a Prometheus release) the tests that need it skip and say so."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.chart.conftest import render_templates

TRAINING_NAMESPACE = "train"


def binary(name: str) -> str:
    """The path of a Prometheus binary (promtool, prometheus); skips the calling test without it."""
    found = shutil.which(name)
    if found is None:
        pytest.skip(
            f"no {name} on PATH: install Prometheus (Debian: apt-get install prometheus; .ci/run does it where it can)"
        )
    return found


def rule_groups(**prometheus: Any) -> list[dict[str, Any]]:
    """The PrometheusRule's groups at the chart's defaults plus `prometheus` values."""
    docs = render_templates("prometheus.yaml", prometheus={"enabled": True, **prometheus})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def write_rules(folder: Path, groups: list[dict[str, Any]]) -> Path:
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


@dataclass
class Rank:
    """One rank's steps: back to back from `start` (seconds into the test), each phase (until,
    step seconds) lasting until its time; `pauses` are single steps (at, seconds) that start at
    their time. Step times vary by `jitter` (a fixed seed: every run sees the same steps)."""

    rank: int
    phases: Sequence[tuple[float, float]]
    pauses: Sequence[tuple[float, float]] = ()
    start: float = 0.0
    jitter: float = 0.02
    wait_share: Sequence[tuple[float, float]] = ()  # (from, share): the gauge from each time on; none without it
    pod: str = ""
    job: str = "llm"
    restarts: Sequence[
        tuple[float, float]
    ] = ()  # (gone at, back at): the process dies, a new one (its counters from 0) starts
    seed: int = field(default=0)

    def step_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """Each step's end time and duration."""
        rng = np.random.default_rng(self.seed + self.rank)
        ends, durations = [], []
        t = self.start
        pauses = sorted(self.pauses)
        for until, seconds in self.phases:
            while t < until:
                if pauses and t >= pauses[0][0]:
                    seconds_now = pauses.pop(0)[1]
                else:
                    seconds_now = seconds * (1 + self.jitter * rng.uniform(-1, 1))
                t += seconds_now
                ends.append(t)
                durations.append(seconds_now)
        return np.array(ends), np.array(durations)

    def labels(self) -> str:
        pod = self.pod or f"{self.job}-{self.rank}"
        return (
            f'namespace="{TRAINING_NAMESPACE}",job="{self.job}",pod="{pod}",instance="{pod}:9400",'
            f'rank="{self.rank}",local_rank="0"'
        )


def _values(samples: Sequence[float | None]) -> str:
    return " ".join("_" if v is None else "stale" if v != v else repr(round(float(v), 6)) for v in samples)


def input_series(ranks: Sequence[Rank], scrape_s: float, duration_s: float) -> list[dict[str, str]]:
    """promtool input_series: each rank's scrapes every `scrape_s` from 0 to `duration_s`, as the
    sidecar serves them; absent (a stale marker, then nothing) while a restarted rank is gone."""
    times = np.arange(0.0, duration_s + scrape_s / 2, scrape_s)
    series = []
    for r in ranks:
        ends, durations = r.step_ends()
        since_restart = np.zeros_like(times)
        gone = np.zeros(len(times), dtype=bool)
        for down, up in r.restarts:
            gone |= (times >= down) & (times < up)
            since_restart = np.where(times >= up, up, since_restart)
        count, total, since = [], [], []
        for i, t in enumerate(times):
            if gone[i]:
                first_gone = i == 0 or not gone[i - 1]
                count.append(float("nan") if first_gone else None)
                total.append(count[-1])
                since.append(count[-1])
                continue
            done = (ends <= t) & (ends > since_restart[i])
            n = int(done.sum())
            count.append(n)
            total.append(float(durations[done].sum()))
            since.append(t - float(ends[done].max()) if n else None)
        name = r.labels()
        series += [
            {"series": f"stepscope_step_duration_seconds_count{{{name}}}", "values": _values(count)},
            {"series": f"stepscope_step_duration_seconds_sum{{{name}}}", "values": _values(total)},
            {"series": f"stepscope_seconds_since_last_step{{{name}}}", "values": _values(since)},
        ]
        if r.wait_share:
            share: list[float | None] = []
            for i, t in enumerate(times):
                current = [value for start, value in r.wait_share if start <= t]
                share.append(None if gone[i] or not current else current[-1])
            series.append({"series": f"stepscope_collective_wait_share{{{name}}}", "values": _values(share)})
    return series


def firing(at: float, alerts: dict[str, int], by: str = "alertname") -> dict[str, Any]:
    """A promql_expr_test: at `at` seconds, exactly `alerts` fire ({labels by `by`, as in a
    series selector: count of alerts})."""
    return {
        "expr": f'count by ({by}) (ALERTS{{alertstate="firing"}})',
        "eval_time": f"{int(at)}s",
        "exp_samples": [{"labels": f"{{{labels}}}", "value": n} for labels, n in sorted(alerts.items())],
    }


def ever_fired(until: float, alerts: dict[str, int], by: str = "alertname") -> dict[str, Any]:
    """A promql_expr_test: from the start to `until` seconds, exactly `alerts` ever fired."""
    return {
        "expr": f'count by ({by}) (last_over_time(ALERTS{{alertstate="firing"}}[{int(until)}s]))',
        "eval_time": f"{int(until)}s",
        "exp_samples": [{"labels": f"{{{labels}}}", "value": n} for labels, n in sorted(alerts.items())],
    }


def run_test(
    folder: Path,
    groups: list[dict[str, Any]],
    series: list[dict[str, str]],
    *,
    scrape_s: float,
    evaluation_s: float,
    expr_tests: Sequence[dict[str, Any]] = (),
    alert_tests: Sequence[dict[str, Any]] = (),
) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` of `groups` over `series`; its exit code is 0 when every test passed."""
    write_rules(folder, groups)
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": f"{evaluation_s:g}s",
        "tests": [
            {
                "interval": f"{scrape_s:g}s",
                "input_series": series,
                "promql_expr_test": list(expr_tests),
                "alert_rule_test": list(alert_tests),
            }
        ],
    }
    (folder / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run(
        [binary("promtool"), "test", "rules", "test.yaml"], cwd=folder, capture_output=True, text=True, timeout=300
    )
