"""`stepscope get` (ProfileSessions as `kubectl get` lists them) and `stepscope report NAME`
(download the session's report from the object store, print the diagnosis, optionally open it)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from stepscope.contracts import layout
from stepscope.contracts.session import SessionSpec
from stepscope.contracts.states import SessionPhase
from stepscope.operator import credentials, kube
from stepscope.operator.sessions.record import destination, open_destination
from stepscope.operator.settings import GROUP, PLURAL, VERSION, kubeconfig

COLUMNS = ("NAME", "PHASE", "WORKERS", "SLOWEST RANK", "SUMMARY", "AGE")  # kubectl get's header for the CRD
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def current_namespace() -> str:
    """The namespace kubectl would use: the kubeconfig context's, or the pod's own in a cluster."""
    if SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    try:
        _, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig())
    except kubernetes.config.ConfigException:
        return "default"
    return (active or {}).get("context", {}).get("namespace") or "default"


def age(created: str, now: dt.datetime | None = None) -> str:
    """kubectl's short age: 45s, 12m, 5h, 3d."""
    now = now or dt.datetime.now(dt.UTC)
    seconds = max(0, int((now - dt.datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def row(obj: dict[str, Any], now: dt.datetime | None = None) -> tuple[str, ...]:
    status = obj.get("status") or {}
    diagnosis = status.get("diagnosis") or {}
    slow = diagnosis.get("slowWorkers") or []
    summary = diagnosis.get("summary") or status.get("message") or ""
    return (obj["metadata"]["name"], status.get("phase") or SessionPhase.PENDING, status.get("workersReady") or "-",
            str(slow[0]["rank"]) if slow else "-", summary[:80], age(obj["metadata"]["creationTimestamp"], now))


def format_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [COLUMNS, *rows])


def add_get_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="list sessions of every namespace")


def _cluster_errors(command: str, body: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run `body`, turning what a missing or unreachable cluster raises into one line and exit 1."""
    try:
        return body(args)
    except kubernetes.config.ConfigException as exc:
        reason = f"no Kubernetes configuration ({exc}); set KUBECONFIG or run it in a cluster"
    except urllib3.exceptions.HTTPError as exc:
        reason = f"the API server is unreachable ({exc.__class__.__name__}); check KUBECONFIG and the network"
    except kubernetes.client.ApiException as exc:
        reason = f"the API server answered {exc.status} {exc.reason}"
    print(f"stepscope {command}: {reason}", file=sys.stderr)
    return 1


def run_get(args: argparse.Namespace) -> int:
    return _cluster_errors("get", _get, args)


def run_report(args: argparse.Namespace) -> int:
    return _cluster_errors("report", _report, args)


def _get(args: argparse.Namespace) -> int:
    api = kube.custom()
    if args.all_namespaces:
        items = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    else:
        items = api.list_namespaced_custom_object(GROUP, VERSION, args.namespace or current_namespace(), PLURAL)["items"]
    if not items:
        print("No ProfileSessions found.", file=sys.stderr)
        return 0
    print(format_table([row(o) for o in sorted(items, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))]))
    return 0


def describe(diagnosis: dict[str, Any]) -> str:
    """The diagnosis as a person reads it in a terminal."""
    lines = [diagnosis.get("summary", "")]
    step = diagnosis.get("stepTimeMs")
    if step:
        lines.append(f"step time: min {step['min']:.1f} ms, median {step['median']:.1f} ms, max {step['max']:.1f} ms")
    for w in diagnosis.get("slowWorkers") or []:
        where = " on ".join(x for x in (w.get("pod"), w.get("node")) if x)
        lines.append(f"slow worker: rank {w['rank']}{f' ({where})' if where else ''}, {w['stepTimeMs']:.1f} ms/step, {w['slowdown']:.2f}x the median")
    b = diagnosis.get("breakdown")
    if b:
        lines.append(f"breakdown: compute {b['computePct']:.1f}%, communication not overlapped {b['commNotOverlappedPct']:.1f}%, "
                     f"overlapped {b['overlappedPct']:.1f}%, memory {b['memoryPct']:.1f}%, idle {b['idlePct']:.1f}%")
    for f in diagnosis.get("findings") or []:
        ranks = ",".join(map(str, f.get("ranks") or [])) or "all"
        lines.append(f"[{f['severity']}] {f['category']} (ranks {ranks}): {f['message']}")
    return "\n".join(lines)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="ProfileSession name")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="folder for the downloaded report (default ./stepscope-report/NAME)")
    parser.add_argument("--open", action="store_true", help="open report/index.html in a browser")


def missing_report_reason(status: dict[str, Any]) -> str:
    """Why a session has no report to fetch, or "" when it has one."""
    phase = status.get("phase") or SessionPhase.PENDING
    artifacts = status.get("artifacts") or {}
    if phase == SessionPhase.FAILED:
        return f"failed: {status.get('message', '')}" + (f"; its captures are in {artifacts['prefix']}" if artifacts.get("prefix") else "")
    if phase != SessionPhase.SUCCEEDED:
        return f"is {phase}; its report comes when it has Succeeded (watch: kubectl get profilesessions -w)"
    if not artifacts.get("report"):
        return f"has no report (spec.analysis.enabled is false); its captures are in {artifacts.get('prefix', 'the store')}"
    return ""


def _report(args: argparse.Namespace) -> int:
    namespace = args.namespace or current_namespace()
    try:
        obj = kube.get_session(namespace, args.name)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            print(f"stepscope report: ProfileSession {args.name} not found in namespace {namespace}", file=sys.stderr)
            return 1
        raise
    status = obj.get("status") or {}
    problem = missing_report_reason(status)
    if problem:
        print(f"stepscope report: {namespace}/{args.name} {problem}", file=sys.stderr)
        return 1
    spec = SessionSpec.from_dict(obj.get("spec") or {})
    creds = credentials.from_secret(namespace, spec.storage.credentialsSecret) if spec.storage.credentialsSecret else credentials.from_env()
    # The user's own command: their identity may reach the store where the Secret is not theirs to read.
    store = open_destination(spec, destination(spec, namespace, args.name, obj["metadata"]["uid"]), creds, ambient_credentials=True)
    out = args.output or Path("stepscope-report") / args.name
    html = store.download(layout.REPORT_HTML, out / "index.html")
    diagnosis_file = store.download(layout.REPORT_DIAGNOSIS, out / "diagnosis.json")
    diagnosis = json.loads(Path(diagnosis_file).read_text())
    print(describe(status.get("diagnosis") or diagnosis))
    print(f"\nreport: {Path(html).resolve()}")
    if args.open:
        webbrowser.open(Path(html).resolve().as_uri())
    return 0
