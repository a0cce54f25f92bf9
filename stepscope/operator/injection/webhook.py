"""The mutating webhook that adds the sidecar (stepscope.operator.injection.injection says what) to pods
labelled `stepscope.io/inject: "true"`, served by kopf over HTTPS with the operator's own
certificate; on an update of a pod it injected, it only puts the injected env back (a pod's env
cannot change, and `kubectl apply` of the original manifest would revert it). Importing this module registers nothing; `stepscope operator --webhook` does.

The Helm chart owns the MutatingWebhookConfiguration, every field of it (failurePolicy Ignore,
timeout, selectors, the Service); the operator only keeps `clientConfig.caBundle` current (and
the URL, when it is reached by one), by name, and never creates or deletes it. So a stop, a crash
or a `helm upgrade` never removes or reshapes injection, and kopf's managed mode (which also
wants a validating configuration and empties the webhook list on exit) stays off. Under the chart
the API server holds the operator to that: the chart's ValidatingAdmissionPolicy refuses any
change of its to the configuration but caBundle (the URL is for a local operator without it).

Admission only computes a patch: nothing there calls the API server, so nothing there can fail a
pod. The namespaces' key Secrets are written beside it (stepscope.operator.namespace_keys), and a
labelled pod that got no sidecar is found by a periodic scan that posts an Event on it."""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import kopf
from kubernetes.client.rest import ApiException

from stepscope.bounded_http import ConnectionSlots, RateLimitedLog
from stepscope.operator import kube, metrics
from stepscope.operator.injection import certs, injection
from stepscope.operator.injection.injection import InjectionSettings, inject
from stepscope.operator.namespace_keys import MANAGED_LABEL, NamespaceKeys
from stepscope.operator.sessions.selection import started_without_sidecar
from stepscope.operator.settings import INJECT_LABEL, INJECTED_ANNOTATION, INJECTION_WARNING_ANNOTATION, OperatorSettings, WebhookSettings

HANDLER_ID = "inject-sidecar"
log = logging.getLogger(__name__)


def inject_sidecar(spec: kopf.Spec, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, warnings: list[str],
                   operation: str | None = None, old: kopf.Body | None = None, **_: Any) -> None:
    """Admit every pod: with the sidecar where its namespace is ready, else as it is, saying why.
    An update of a pod that was injected gets its injected env and mount back (see reinject)."""
    namespace = meta.get("namespace") or ""
    try:
        if operation == "UPDATE":
            _restore_injected(dict(spec), old, patch)
            return
        skipped = memo.injector.keys.problem(namespace) if namespace else "the pod's namespace is unknown at admission"
        if skipped:
            warnings.append(f"stepscope: pod admitted WITHOUT the profiling sidecar: {skipped}")
            return
        fields = inject(dict(spec), InjectionSettings.from_operator(memo.ctx.settings))
        if fields is None:
            return
        problems = injection.warnings(dict(spec))
        warnings.extend(problems)
        for name, value in fields.items():
            patch.spec[name] = value
        patch.metadata.annotations[INJECTED_ANNOTATION] = "true"
        if problems:
            patch.metadata.annotations[INJECTION_WARNING_ANNOTATION] = "; ".join(problems)[:1024]
    except Exception as exc:  # never deny: failurePolicy covers an unreachable webhook only
        log.exception("injection failed for a pod in namespace %s", namespace)
        patch.clear()
        what = "update admitted as sent (the injected env is not put back)" if operation == "UPDATE" else "pod admitted WITHOUT the profiling sidecar"
        warnings.append(f"stepscope: {what}: the webhook failed ({exc.__class__.__name__})")


def _restore_injected(spec: dict[str, Any], old: kopf.Body | None, patch: kopf.Patch) -> None:
    """An update of a pod that was injected: its injected env and mount put back where the update
    reverts them. A pod that was not injected is left as it is (the chart's matchConditions do
    not even send it)."""
    if old is None or INJECTED_ANNOTATION not in (old.get("metadata", {}).get("annotations") or {}):
        return
    for name, value in (injection.reinject(spec) or {}).items():
        patch.spec[name] = value


def post_warning(pod: Any, reason: str, message: str) -> bool:
    """A Warning Event on a pod, once per pod and reason whichever replica posts it (the name says
    which); False when it was there already. From the upkeep's thread: kopf's posting needs a
    handler's context."""
    now = dt.datetime.now(dt.UTC)
    name = f"{pod.metadata.name}.{reason.lower()}.{pod.metadata.uid[:8]}"
    try:
        kube.core().create_namespaced_event(pod.metadata.namespace, _event(pod, name, reason, message, now))
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


def _event(pod: Any, name: str, reason: str, message: str, now: dt.datetime) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": pod.metadata.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "namespace": pod.metadata.namespace, "uid": pod.metadata.uid},
        "type": "Warning", "reason": reason, "message": message[:1024], "count": 1,
        "firstTimestamp": now, "lastTimestamp": now, "source": {"component": "stepscope-operator"}, "reportingComponent": "stepscope-operator"}


# Bounds of the admission server (as stepscope.bounded_http's for the other endpoints): any pod can
# reach its port. An AdmissionReview of a pod update carries the pod twice, each at most etcd's
# 1.5 MiB. The API server's replicas are its only clients and send admissions concurrently, so the
# cap per address is high; a connection lives CONNECTION_S, then closes after its current request
# (keep-alive reconnects), and is cut CONNECTION_GRACE_S later whatever it is doing.
MAX_REVIEW_BYTES = 4 << 20
MAX_CONNECTIONS = 64
MAX_PER_PEER = 32
CONNECTION_S = 30.0
CONNECTION_GRACE_S = 10.0


class InjectionServer(kopf.WebhookServer):
    """kopf's admission handling over an HTTPS server of our own: a TLS context built from a
    certificate kept in memory (kopf's own server would want certificate files, or generate one),
    and the bounds above, which kopf's server has none of."""

    def __init__(self, cert: certs.ServingCert, *, max_connections: int = MAX_CONNECTIONS, max_per_peer: int = MAX_PER_PEER,
                 connection_s: float = CONNECTION_S, grace_s: float = CONNECTION_GRACE_S, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cert = cert
        self.slots = ConnectionSlots(max_connections, max_per_peer)
        self.connection_s, self.grace_s = connection_s, grace_s
        self.refusals = RateLimitedLog(log)

    def _build_ssl(self) -> tuple[bytes | None, ssl.SSLContext | None]:
        return self.cert.ca_pem, self.cert.server_context()

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async def serve(request: aiohttp.web.Request) -> aiohttp.web.Response:
            return await self._serve(fn, request)

        cadata, context = self._build_ssl()
        app = aiohttp.web.Application(client_max_size=MAX_REVIEW_BYTES)
        app.add_routes([aiohttp.web.post(f"{(self.path or '').rstrip('/')}/{{id:.*}}", serve)])
        runner = aiohttp.web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        handlers = runner.server
        assert handlers is not None  # setup() made it
        port = self.port or self._allocate_free_port()
        listener = await asyncio.get_running_loop().create_server(lambda: _Bounded(handlers(), self), self.addr or None, port,
                                                                  ssl=context, backlog=128, reuse_address=True)
        try:
            url = self._build_url("https", self.host or self._get_accessible_addr(self.addr), port, self.path or "")
            config = kopf.WebhookClientConfig(url=url)
            if cadata is not None:
                config["caBundle"] = base64.b64encode(cadata).decode("ascii")
            yield config
            await asyncio.Event().wait()
        finally:
            listener.close()
            await runner.cleanup()


class _Bounded(asyncio.Protocol):
    """aiohttp's protocol for one connection (it has __slots__, so it is wrapped, not patched):
    admitted only under the server's caps, and given a lifetime."""

    def __init__(self, inner: Any, server: InjectionServer) -> None:
        self.inner, self.server = inner, server
        self.peer: str | None = None
        self.timers: list[asyncio.TimerHandle] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a stream server's, TLS or not
        peer = str((transport.get_extra_info("peername") or ("?",))[0])
        if not self.server.slots.admit(peer):
            self.server.refusals.warning("webhook: refused a connection from %s: %s", peer, self.server.slots.refusal())
            transport.abort()
            return
        self.peer = peer
        loop = asyncio.get_running_loop()
        self.timers = [loop.call_later(self.server.connection_s, self.inner.close),
                       loop.call_later(self.server.connection_s + self.server.grace_s, transport.abort)]
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is None:
            return
        for timer in self.timers:
            timer.cancel()
        self.server.slots.release(self.peer)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.peer is not None else None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


@dataclass(frozen=True)
class Endpoint:
    """Where the API server reaches the webhook: the chart's Service, or a URL (a local operator)."""
    config: str
    tls_secret: str
    service: str | None
    namespace: str
    url: str | None
    addr: str
    port: int

    @classmethod
    def from_env(cls) -> Endpoint:
        return cls(**dataclasses.asdict(WebhookSettings()))

    @property
    def hook_name(self) -> str:
        return f"{HANDLER_ID}.{self.config}"

    def names(self) -> list[str]:
        """The names the serving certificate is for: the Service's DNS names, the URL's host, the address."""
        names = [f"{self.service}.{self.namespace}.svc", f"{self.service}.{self.namespace}.svc.cluster.local", self.service] if self.service else []
        if self.url:
            names.append(self.url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]"))
        names += [self.addr, "localhost", "127.0.0.1"]
        return list(dict.fromkeys(n for n in names if n and n not in ("0.0.0.0", "::")))

    def client_config_ops(self, config: dict[str, Any], ca_bundle: str) -> list[dict[str, Any]] | None:
        """JSON patch operations that put our CA (and URL) into our webhook; [] when current, None
        when the configuration has no webhook of ours."""
        for i, hook in enumerate(config.get("webhooks") or []):
            if hook.get("name") != self.hook_name:
                continue
            client = hook.get("clientConfig") or {}
            guard = {"op": "test", "path": f"/webhooks/{i}/name", "value": self.hook_name}
            if self.url:
                wanted = {"url": f"{self.url.rstrip('/')}/{HANDLER_ID}", "caBundle": ca_bundle}
                return [] if client == wanted else [guard, {"op": "add", "path": f"/webhooks/{i}/clientConfig", "value": wanted}]
            return [] if client.get("caBundle") == ca_bundle else [guard, {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca_bundle}]
        return None


class Injector:
    """What runs beside admission: the CA in the webhook configuration, the namespaces' key
    Secrets, and the scan for labelled pods admitted without the sidecar."""

    def __init__(self, settings: OperatorSettings, key: bytes, endpoint: Endpoint, ca_pem: bytes) -> None:
        self.settings, self.endpoint = settings, endpoint
        self.keys = NamespaceKeys(settings, key)
        self.ca_bundle = base64.b64encode(ca_pem).decode()
        self.interval_s = settings.injection_resync_s
        self.namespaces: set[str] = set(n for n in settings.namespaces if settings.injects_into(n))
        self.reported: set[str] = set()  # uids of labelled pods already looked at (and given their Event)
        self._config_state = ""
        self._logged: dict[str, str | None] = {}
        self.owner: dict[str, Any] | None = None  # the webhook configuration, once read

    # -- the webhook configuration ----------------------------------------------------------
    def keep_ca_bundle(self) -> None:
        admission = kube.admission()
        try:
            config = kube.api_client().sanitize_for_serialization(admission.read_mutating_webhook_configuration(self.endpoint.config))
            # Cluster-scoped, so it may own the key Secrets in every namespace: `helm uninstall`
            # deletes it and the garbage collector the Secrets (no blockOwnerDeletion: no finalizer rights needed).
            self.owner = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                          "name": config["metadata"]["name"], "uid": config["metadata"]["uid"]}
            ops = self.endpoint.client_config_ops(config, self.ca_bundle)
            if ops is None:
                state = f"MutatingWebhookConfiguration {self.endpoint.config} has no webhook {self.endpoint.hook_name}: install the chart's webhook.yaml"
            else:
                if ops:
                    admission.patch_mutating_webhook_configuration(self.endpoint.config, ops)
                state = "current"
        except ApiException as exc:
            if exc.status == 404:
                self.owner = None
            state = (f"MutatingWebhookConfiguration {self.endpoint.config} not found: install the chart's webhook.yaml" if exc.status == 404
                     else f"cannot update MutatingWebhookConfiguration {self.endpoint.config}: {kube.describe(exc)}")
        if state != self._config_state:
            (log.info if state == "current" else log.warning)("webhook configuration: %s", "caBundle current" if state == "current" else state)
            self._config_state = state

    # -- the namespaces' keys ---------------------------------------------------------------
    def list_namespaces(self) -> None:
        """Every namespace, for an operator run without --namespace (the chart always names them)."""
        if self.settings.namespaces:
            return
        names = {ns.metadata.name for ns in kube.core().list_namespace().items if (ns.status and ns.status.phase) != "Terminating"}
        self.namespaces = {n for n in names if self.settings.injects_into(n)}

    def reconcile_keys(self, everything: bool) -> None:
        for namespace in sorted(self.namespaces):
            if everything or self.keys.problem(namespace):
                self.keys.reconcile(namespace, self.owner)
            problem = self.keys.problem(namespace)
            if problem != self._logged.get(namespace):  # once per change, not every round
                (log.warning if problem else log.info)("%s", problem or f"namespace {namespace}: key Secret ready")
                self._logged[namespace] = problem

    # -- labelled pods without a sidecar ----------------------------------------------------
    def report_uninjected(self) -> None:
        # Labelled pods only, from the API server's cache (resourceVersion 0): at thousands of
        # training pods this list is the upkeep's biggest read, hence every fourth round only.
        selector = f"{INJECT_LABEL}=true"
        core = kube.core()
        if self.settings.namespaces:
            pods = [p for ns in self.settings.namespaces for p in core.list_namespaced_pod(ns, label_selector=selector, resource_version="0").items]
        else:
            pods = core.list_pod_for_all_namespaces(label_selector=selector, resource_version="0").items
        live = set()
        for pod in pods:
            live.add(pod.metadata.uid)
            if pod.metadata.uid in self.reported:
                continue
            if started_without_sidecar(pod):
                why = self.keys.problem(pod.metadata.namespace) or "the injection webhook was not reached when it was created (operator stopped, starting or too slow; failurePolicy Ignore let it through)"
                if post_warning(pod, "SidecarNotInjected", f"labelled {INJECT_LABEL}=true but started without the stepscope sidecar: {why}; recreate the pod to profile it"):
                    metrics.PODS_NOT_INJECTED.inc()
            elif warning := (pod.metadata.annotations or {}).get(INJECTION_WARNING_ANNOTATION):
                post_warning(pod, "SidecarInjectionWarning", warning)
            self.reported.add(pod.metadata.uid)
        self.reported &= live

    def resync(self, rounds: int) -> None:
        """One round of everything, each part on its own: one failing does not stop the others."""
        full = rounds % 4 == 0  # the costly parts: every Secret rewritten, every labelled pod read
        parts = [self.keep_ca_bundle, self.list_namespaces, lambda: self.reconcile_keys(everything=full)]
        for part in parts + ([self.report_uninjected] if full else []):
            try:
                part()
            except Exception as exc:  # noqa: BLE001 - one upkeep part's failure must not stop the others
                log.warning("injection upkeep: %s", kube.describe(exc))

    async def run(self) -> None:
        rounds = 0
        while True:
            await asyncio.to_thread(self.resync, rounds)
            rounds += 1
            await asyncio.sleep(self.interval_s)


def serving_cert(endpoint: Endpoint) -> certs.ServingCert:
    """The certificate every replica serves with, so that one caBundle fits them all: the first
    one to start writes it into a Secret of its namespace, the others read it."""
    fresh = certs.generate(endpoint.names())
    core = kube.core()
    body = {"metadata": {"name": endpoint.tls_secret, "labels": MANAGED_LABEL}, "type": "kubernetes.io/tls", "data": fresh.secret_data()}
    try:
        stored = kube.create_or_get(core.create_namespaced_secret, core.read_namespaced_secret, endpoint.namespace, body)
        return certs.ServingCert.from_secret_data(stored.data)
    except (ApiException, KeyError, ValueError) as exc:  # e.g. a local run without that namespace
        log.warning("webhook certificate not shared through Secret %s/%s (%s): this process serves its own; "
                    "more than one replica would fight over caBundle", endpoint.namespace, endpoint.tls_secret, kube.describe(exc))
        return fresh


async def configure_webhook(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    endpoint = Endpoint.from_env()
    cert = await asyncio.to_thread(serving_cert, endpoint)
    settings.admission.server = InjectionServer(cert, addr=endpoint.addr, port=endpoint.port, host=endpoint.names()[0])
    settings.admission.managed = None  # the chart owns the configuration (see the module's doc)
    injector = Injector(memo.ctx.settings, memo.ctx.key, endpoint, cert.ca_pem)
    memo.injector = injector
    # The first round before the server starts: namespaces that are ready get sidecars at once.
    await asyncio.to_thread(injector.resync, 0)
    memo.injector_task = asyncio.create_task(injector.run())


async def stop_upkeep(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "injector_task", None)
    if task is not None:
        task.cancel()


def register(registry: kopf.OperatorRegistry) -> None:
    """Put the injection webhook and its upkeep into `registry`, beside the session handlers."""
    kopf.on.mutate("v1", "pods", labels={INJECT_LABEL: "true"}, operations=["CREATE", "UPDATE"], id=HANDLER_ID, registry=registry)(inject_sidecar)
    kopf.on.startup(registry=registry)(configure_webhook)
    kopf.on.cleanup(registry=registry)(stop_upkeep)
