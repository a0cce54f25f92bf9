"""`stepscope operator`: run the kopf operator: standalone (one replica), or with `--peering`
several replicas of which one handles sessions (kopf's peering: the highest priority runs, the
others pause) while all of them serve the injection webhook."""

from __future__ import annotations

import argparse
import os
import secrets
import sys

import kopf

from stepscope.operator import master_key, metrics, registry
from stepscope.operator.settings import OperatorSettings, master_key_secret_named, peering
from stepscope.settings import KEY_ENV, KEY_FILE_ENV, hmac_key, hmac_key_file
from stepscope.signing import KeyLoadError, load_key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL (default %(default)s)"
    )
    parser.add_argument("--metrics-address", default="0.0.0.0", help="address of the Prometheus /metrics endpoint")
    parser.add_argument(
        "--metrics-port", type=int, default=9090, help="port of /metrics; 0 disables it (default %(default)s)"
    )
    parser.add_argument(
        "--key-file",
        default=None,
        help=f"the sidecars' HMAC key file, when ${{STEPSCOPE_HMAC_KEY}} is not set (env {KEY_FILE_ENV})",
    )
    parser.add_argument(
        "--webhook",
        action="store_true",
        help="also serve the sidecar injection webhook (STEPSCOPE_WEBHOOK_* env tune it)",
    )
    parser.add_argument(
        "--peering",
        default=peering(),
        help=(
            "name of the KopfPeering objects that elect one replica to handle sessions (default: standalone, one "
            "replica)"
        ),
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help=(
            "this replica's peering priority (default: random, so that replicas never tie; the highest handles "
            "sessions)"
        ),
    )


def run(args: argparse.Namespace) -> int:
    if args.key_file:
        os.environ[KEY_FILE_ENV] = args.key_file  # what the startup handler reads (handlers.configure)
    try:
        if not hmac_key() and not hmac_key_file() and master_key_secret_named():
            # In the chart: the master key Secret of the operator's namespace, created when absent.
            settings = OperatorSettings()
            os.environ[KEY_ENV] = master_key.ensure(
                settings.own_namespace, settings.hmac_secret, settings.hmac_secret_key
            ).decode()
        load_key(hmac_key_file())  # fail here in one line, not in a kopf startup handler retried for ever
    except KeyLoadError as exc:
        print(f"stepscope operator: {exc}", file=sys.stderr)
        return 2
    # Injection covers the watched namespaces (stepscope.operator.settings reads it from here).
    os.environ.setdefault("STEPSCOPE_NAMESPACES", ",".join(args.namespace))
    if args.metrics_port:
        metrics.serve(args.metrics_address, args.metrics_port)
    # Replicas of the same priority would all pause; random ones elect whichever is highest.
    priority = args.priority if args.priority is not None else secrets.randbelow(2**31 - 1) + 1
    kopf.run(
        registry=registry.build(with_webhook=args.webhook),
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=priority if args.peering else None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
    )
    return 0
