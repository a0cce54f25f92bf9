"""Operator settings, read once from the environment so that the Helm chart, the tests and the
benchmark tune the same knobs without code changes: the one module of the operator that reads the
environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from stepscope.contracts import session as session_contract

GROUP, VERSION, PLURAL, KIND = (
    session_contract.GROUP,
    session_contract.VERSION,
    session_contract.PLURAL,
    session_contract.KIND,
)
# The image's USER (Dockerfile), which the sidecar and the analysis Job run as; named here so that
# runAsNonRoot can be checked before the image is pulled.
IMAGE_UID = 10001
FINALIZER = "stepscope.io/finalizer"
INJECT_LABEL = "stepscope.io/inject"
SESSION_LABEL = "stepscope.io/session"
# Set by the webhook on every pod it gave a sidecar: a labelled pod without it was admitted without one.
INJECTED_ANNOTATION = "stepscope.io/injected"
# What the webhook warned about when it injected a pod (its client may be a controller nobody reads).
INJECTION_WARNING_ANNOTATION = "stepscope.io/injection-warning"
# Never injected, whatever operator.namespaces says (the operator's own namespace is excluded too).
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
# The chart names the master key's Secret here (stepscope.operator.master_key).
SECRET_ENV = "STEPSCOPE_HMAC_SECRET"


def _float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _names(name: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in os.environ.get(name, "").split(",") if n.strip())


@dataclass(frozen=True)
class OperatorSettings:
    # How long a selector may match no ready pod before the session fails: pods of a freshly
    # started job take a moment to reach Running, so failing at once would race the scheduler.
    selection_grace_s: float = field(default_factory=lambda: _float("STEPSCOPE_SELECTION_GRACE_S", 30.0))
    poll_interval_s: float = field(default_factory=lambda: _float("STEPSCOPE_POLL_INTERVAL_S", 1.0))
    # The floor between two status writes of one session (docs/design.md: at most one per second).
    status_interval_s: float = field(default_factory=lambda: _float("STEPSCOPE_STATUS_INTERVAL_S", 1.0))
    fanout_concurrency: int = field(default_factory=lambda: _int("STEPSCOPE_FANOUT_CONCURRENCY", 64))
    sidecar_timeout_s: float = field(default_factory=lambda: _float("STEPSCOPE_SIDECAR_TIMEOUT_S", 5.0))
    trigger_attempts: int = field(default_factory=lambda: _int("STEPSCOPE_TRIGGER_ATTEMPTS", 3))
    # Consecutive failed polls of a sidecar whose pod still exists before its worker counts as lost.
    unreachable_polls: int = field(default_factory=lambda: _int("STEPSCOPE_UNREACHABLE_POLLS", 5))
    # How often a ProfileTrigger reads its pods' telemetry: detection's delay is its sustained
    # window plus up to one interval (benchmarks/watch_cost.py measures the cost per pod).
    trigger_poll_interval_s: float = field(default_factory=lambda: _float("STEPSCOPE_TRIGGER_POLL_INTERVAL_S", 10.0))
    # The Alertmanager webhook endpoint (stepscope.operator.triggers.alerts); 0 serves none.
    alerts_port: int = field(default_factory=lambda: _int("STEPSCOPE_ALERTS_PORT", 0))
    image: str = field(default_factory=lambda: os.environ.get("STEPSCOPE_IMAGE", "ghcr.io/stepscope/stepscope:0.1.0"))
    image_pull_policy: str = field(
        default_factory=lambda: os.environ.get("STEPSCOPE_IMAGE_PULL_POLICY", "IfNotPresent")
    )
    hmac_secret: str = field(default_factory=lambda: os.environ.get(SECRET_ENV, "stepscope-hmac"))
    hmac_secret_key: str = field(default_factory=lambda: os.environ.get("STEPSCOPE_HMAC_SECRET_KEY", "key"))
    # The analysis Jobs' ServiceAccount, which the chart creates in every namespace it serves.
    analysis_account: str = field(
        default_factory=lambda: os.environ.get("STEPSCOPE_ANALYSIS_SERVICE_ACCOUNT", "stepscope-analysis")
    )
    # How long the Job controller may fail to create the analysis pod (Pod Security, quota, a
    # ServiceAccount not there yet) before the session fails with its reason: long enough for what
    # passes by itself, far below spec.timeoutSeconds.
    analysis_start_grace_s: float = field(default_factory=lambda: _float("STEPSCOPE_ANALYSIS_START_GRACE_S", 60.0))
    analysis_cpu: str = field(default_factory=lambda: os.environ.get("STEPSCOPE_ANALYSIS_CPU", "2"))
    analysis_memory: str = field(default_factory=lambda: os.environ.get("STEPSCOPE_ANALYSIS_MEMORY", "2Gi"))
    # The most pods of one session's shard Job at once, whatever its spec.analysis.parallelism asks.
    analysis_max_parallelism: int = field(default_factory=lambda: _int("STEPSCOPE_ANALYSIS_MAX_PARALLELISM", 16))
    # Where injection applies (the chart passes operator.namespaces; empty: every namespace) and
    # the operator's own namespace, which never gets a sidecar.
    namespaces: tuple[str, ...] = field(default_factory=lambda: _names("STEPSCOPE_NAMESPACES"))
    own_namespace: str = field(default_factory=lambda: os.environ.get("POD_NAMESPACE", ""))
    # kopf's watch requests end after this long and resume from where they were.
    watch_timeout_s: int = field(default_factory=lambda: _int("STEPSCOPE_WATCH_TIMEOUT_S", 300))
    # How often the injector re-reads the namespaces' key Secrets and looks for pods admitted without a sidecar.
    injection_resync_s: float = field(default_factory=lambda: _float("STEPSCOPE_INJECTION_RESYNC_S", 15.0))

    def injects_into(self, namespace: str) -> bool:
        """Whether pods of `namespace` get the sidecar: the chart's webhook namespaceSelector, in code."""
        if namespace in SYSTEM_NAMESPACES or namespace == self.own_namespace:
            return False
        return not self.namespaces or namespace in self.namespaces


@dataclass(frozen=True)
class WebhookSettings:
    """Where the API server reaches the injection webhook: the chart's Service, or a URL (a local operator)."""

    config: str = field(
        default_factory=lambda: os.environ.get("STEPSCOPE_WEBHOOK_CONFIG", "stepscope-injector.stepscope.io")
    )
    tls_secret: str = field(
        default_factory=lambda: os.environ.get("STEPSCOPE_WEBHOOK_TLS_SECRET", "stepscope-webhook-tls")
    )
    service: str | None = field(default_factory=lambda: os.environ.get("STEPSCOPE_WEBHOOK_SERVICE") or None)
    namespace: str = field(
        default_factory=lambda: (
            os.environ.get("STEPSCOPE_WEBHOOK_NAMESPACE") or os.environ.get("POD_NAMESPACE", "stepscope")
        )
    )
    url: str | None = field(default_factory=lambda: os.environ.get("STEPSCOPE_WEBHOOK_URL") or None)
    addr: str = field(default_factory=lambda: os.environ.get("STEPSCOPE_WEBHOOK_ADDR", "0.0.0.0"))
    port: int = field(default_factory=lambda: _int("STEPSCOPE_WEBHOOK_PORT", 9443))


def kubeconfig() -> str | None:
    """$KUBECONFIG, read when a client is configured, not when the kubernetes package was imported (its default)."""
    return os.environ.get("KUBECONFIG")


def peering() -> str | None:
    """The KopfPeering name that elects one replica to handle sessions; None: standalone."""
    return os.environ.get("STEPSCOPE_PEERING") or None


def master_key_secret_named() -> bool:
    """Whether the chart named a master key Secret for the operator to create or read."""
    return bool(os.environ.get(SECRET_ENV))
