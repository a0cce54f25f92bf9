"""`stepscope sidecar`: the daemon beside each training container. It installs the agent's
bootstrap into the shared directory, serves the signed control endpoint, follows the local ranks,
samples NVML during the capture window and uploads every rank's artifacts."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from stepscope.contracts.wire import DEFAULT_PORT
from stepscope.retry import RetryPolicy
from stepscope.sidecar import settings
from stepscope.sidecar.control import ControlServer
from stepscope.sidecar.sessions import EXPORT_GRACE_S, LEFTOVER_TTL_S, MAX_LOCAL_MB, STALE_AFTER_S, SessionManager
from stepscope.sidecar.telemetry import StepTelemetry
from stepscope.sidecar.uploads import Uploader
from stepscope.signing import DEFAULT_KEY_FILE, KeyLoadError, Verifier, load_key

log = logging.getLogger(__name__)

TELEMETRY_FOLD_S = 1.0


class Sidecar:
    """The running parts of one sidecar; `run` adds signal handling around it."""

    def __init__(self, stepscope_dir: Path, key: bytes, *, host: str = "0.0.0.0", port: int = DEFAULT_PORT, pod: str = "",
                 node: str = "", pod_ip: str = "", nvml_backend: Any = None, poll_interval_s: float = 0.5, upload_attempts: int = 6,
                 upload_base_delay_s: float = 2.0, keep_local: bool = False, stale_after_s: float = STALE_AFTER_S,
                 export_grace_s: float = EXPORT_GRACE_S, leftover_ttl_s: float = LEFTOVER_TTL_S, max_local_mb: float = MAX_LOCAL_MB,
                 own_every_gpu: bool = False) -> None:
        self.dir = stepscope_dir
        self.uploader = Uploader()
        self.manager = SessionManager(stepscope_dir, pod=pod or socket.gethostname(), node=node, uploader=self.uploader,
                                      retry=RetryPolicy(attempts=upload_attempts, base_delay_s=upload_base_delay_s, max_delay_s=60.0),
                                      nvml_backend=nvml_backend, poll_interval_s=poll_interval_s, keep_local=keep_local,
                                      stale_after_s=stale_after_s, export_grace_s=export_grace_s, leftover_ttl_s=leftover_ttl_s,
                                      max_local_mb=max_local_mb, own_every_gpu=own_every_gpu)
        self.telemetry = StepTelemetry(stepscope_dir, stale_after_s=stale_after_s)
        self.server = ControlServer((host, port), self.manager, Verifier(key), self.telemetry, pod_ip=pod_ip)
        self._serving = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, name="stepscope-control", daemon=True)
        self._stop_telemetry = threading.Event()
        self._telemetry_thread = threading.Thread(target=self._fold_telemetry, name="stepscope-telemetry", daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> Sidecar:
        self.manager.start()
        self._serving.start()
        self._telemetry_thread.start()
        return self

    def _fold_telemetry(self) -> None:
        # Between scrapes too, so that the histogram holds every step while a ring (4096 slots)
        # turns over more slowly than this.
        while not self._stop_telemetry.wait(TELEMETRY_FOLD_S):
            try:
                self.telemetry.refresh()
            except Exception:
                log.exception("cannot read the step telemetry; trying again in %s s", TELEMETRY_FOLD_S)

    def shutdown(self, grace_s: float = 20.0) -> bool:
        """Stop taking requests, then give queued uploads `grace_s` to finish; True when they did.
        Whatever is left stays in the shared directory."""
        self._stop_telemetry.set()
        self.server.shutdown()
        self.server.server_close()
        self.manager.stop()
        finished = self.uploader.close(grace_s)
        if not finished:
            log.warning("shut down with uploads outstanding; their files stay in %s", self.dir)
        return finished


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=settings.shared_dir(),
                        help="shared directory with the training processes (env STEPSCOPE_DIR, default %(default)s)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=settings.port(),
                        help="control port; 0 picks a free one (default %(default)s)")
    parser.add_argument("--key-file", default=None, help=f"HMAC key file (default $STEPSCOPE_HMAC_KEY, else {DEFAULT_KEY_FILE})")
    parser.add_argument("--pod", default=settings.pod_name(), help="this pod's name (env POD_NAME)")
    parser.add_argument("--node", default=settings.node_name(), help="this node's name (env NODE_NAME)")
    parser.add_argument("--pod-ip", default=settings.pod_ip(),
                        help="this pod's IP (env POD_IP): requests from other pods must be signed for it and the port")
    parser.add_argument("--poll-interval", type=float, default=0.5, help="seconds between reads of the ranks' state files")
    parser.add_argument("--upload-attempts", type=int, default=6, help="tries per store request that failed for a transient reason (a permanent one fails at once)")
    parser.add_argument("--keep-local", action="store_true", help="keep traces in the shared directory after their upload")
    parser.add_argument("--leftover-ttl", type=float, default=LEFTOVER_TTL_S,
                        help="seconds after their last change that files no session needs are removed (default %(default)s)")
    parser.add_argument("--max-local-mb", type=float, default=MAX_LOCAL_MB,
                        help="bound on sessions' files in the shared directory; the oldest unneeded go first (default %(default)s)")
    parser.add_argument("--shutdown-grace", type=float, default=20.0, help="seconds given to outstanding uploads on SIGTERM")
    parser.add_argument("--bootstrap-only", action="store_true",
                        help="install the agent's bootstrap into --dir and exit 0 whatever happens (the injected sidecar's "
                             "postStart hook: the training containers start once it is there, never held by a broken sidecar)")


# The postStart hook's bound: the kubelet gives an exec hook no deadline of its own, and the
# training containers wait for it.
BOOTSTRAP_ONLY_DEADLINE_S = 20


def bootstrap_only(stepscope_dir: Path) -> int:
    """Install the bootstrap, or say why not; always 0, within BOOTSTRAP_ONLY_DEADLINE_S: a failing
    postStart hook would have the kubelet restart the sidecar, and hold the training meanwhile."""
    from stepscope.sidecar.bootstrap import install_bootstrap

    signal.signal(signal.SIGALRM, lambda *_: os._exit(0))
    signal.alarm(BOOTSTRAP_ONLY_DEADLINE_S)
    try:
        install_bootstrap(stepscope_dir)
    except Exception as exc:  # noqa: BLE001 - the training starts without the agent rather than not at all
        print(f"stepscope sidecar: no bootstrap installed in {stepscope_dir}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.bootstrap_only:
        return bootstrap_only(args.dir)
    try:
        key = load_key(args.key_file)
    except KeyLoadError as exc:
        print(f"stepscope sidecar: {exc}", file=sys.stderr)
        return 2
    from stepscope.sidecar.bootstrap import install_bootstrap
    from stepscope.sidecar.nvml import default_backend

    stepscope_dir: Path = args.dir
    try:
        stepscope_dir.mkdir(parents=True, exist_ok=True)
        install_bootstrap(stepscope_dir)
        sidecar = Sidecar(stepscope_dir, key, host=args.host, port=args.port, pod=args.pod, node=args.node, pod_ip=args.pod_ip,
                          nvml_backend=default_backend(), poll_interval_s=args.poll_interval,
                          upload_attempts=args.upload_attempts, keep_local=args.keep_local,
                          leftover_ttl_s=args.leftover_ttl, max_local_mb=args.max_local_mb)
    except OSError as exc:
        print(f"stepscope sidecar: cannot start: {exc}", file=sys.stderr)
        return 1
    if not args.pod_ip and args.host in ("0.0.0.0", "::"):
        log.warning("no pod IP (env POD_IP, --pod-ip): only requests signed for a loopback address from this host are accepted")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    sidecar.start()
    # Tests and scripts started with --port 0 read the port from this line.
    print(f"stepscope sidecar listening on {sidecar.url} (shared directory {stepscope_dir}, pod {sidecar.manager.pod})", flush=True)
    stop.wait()
    log.info("stopping: no new requests, %.0f s for outstanding uploads", args.shutdown_grace)
    return 0 if sidecar.shutdown(args.shutdown_grace) else 1
