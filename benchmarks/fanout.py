"""Fan-out of one ProfileSession to N pods (10,240 for the fleet goals): time from creating the
session until every sidecar accepted the signed trigger (goal <= 10 s), the time of each poll
round of the capture (goal <= 5 s), status writes per second (goal <= 1) and the final status size
(goal < 32 KiB).

The real operator (kopf) runs against the test API server (stepscope/testing/kube, in a process of its own, as
an API server is), with moto's S3 server over HTTP as the session's store; N pods are marked Running with addresses
127.0.<i/250>.<i%250+1>, all served by
one simulated sidecar process (aiohttp) that verifies every signature (stepscope.signing.Verifier,
the namespace's key, the dialled address as the target) and answers GET /v1/telemetry and
PUT/GET /v1/sessions/<id> per pod with the wire API's bodies: Capturing for CAPTURE_S after the
PUT, then Succeeded. It does not capture, upload, summarise or run a training; it runs no
per-pod process (one event loop answers every address) and the loopback has no network latency.
The reference in the same run is the same session with one request open at a time (sequential).

    .venv/bin/python benchmarks/fanout.py [--pods 10240] [--reference-pods 1024]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KEY = b"fanout-benchmark-key"
CAPTURE_S = 8.0  # how long each simulated sidecar reports Capturing before Succeeded
BUCKET = "fanout"
CREDENTIALS = {"accessKeyId": "fanout-key-id", "secretAccessKey": "fanout-secret"}


def pod_ip(i: int) -> str:
    return f"127.0.{i // 250}.{i % 250 + 1}"


def simulated_sidecars(port: int, ready: Event) -> None:
    """One aiohttp server for every pod: it tells pods apart by the address they dialled, and
    keeps one Verifier (nonces, window) per pod, as each pod's sidecar does."""
    from aiohttp import web

    from stepscope.operator.namespace_keys import namespace_key
    from stepscope.signing import SignatureError, Verifier, target

    key = namespace_key(KEY, "default")  # the key of the pods' namespace, as injected
    verifiers: dict[str, Verifier] = {}
    accepted: dict[tuple[str, str], float] = {}
    puts: dict[str, int] = {}  # "pod session" -> PUTs received
    requests = {"telemetry": 0, "put": 0, "get": 0}

    def refused(request: web.Request, body: bytes) -> web.Response | None:
        host, _, dialled = request.host.rpartition(":")
        verifier = verifiers.get(host) or verifiers.setdefault(host, Verifier(key))
        try:
            verifier.verify(request.method, request.path, body, request.headers, targets={target(host, int(dialled))})
        except SignatureError as exc:
            return web.json_response({"error": str(exc)}, status=401)
        return None

    async def telemetry(request: web.Request) -> web.Response:
        requests["telemetry"] += 1
        if (denied := refused(request, b"")) is not None:
            return denied
        return web.json_response(
            {
                "pod": request.host,
                "node": "node",
                "time": time.time(),
                "ranks": [{"rank": 0, "localRank": 0, "worldSize": 1, "pid": 1, "alive": True, "steps": 41}],
            }
        )

    async def session(request: web.Request) -> web.Response:
        body = await request.read()
        if (denied := refused(request, body)) is not None:
            return denied
        pod, sid = request.host.rsplit(":", 1)[0], request.match_info["id"]
        if request.method == "PUT":
            requests["put"] += 1
            puts[f"{pod} {sid}"] = puts.get(f"{pod} {sid}", 0) + 1
            first = (pod, sid) not in accepted
            accepted.setdefault((pod, sid), time.time())
            return web.json_response({"session": sid, "phase": "Pending"}, status=201 if first else 200)
        requests["get"] += 1
        if (pod, sid) not in accepted:
            return web.json_response({"error": "unknown session"}, status=404)
        done = time.time() - accepted[(pod, sid)] > CAPTURE_S
        workers = {
            "total": 1,
            "triggered": 1,
            "capturing": 0 if done else 1,
            "captured": int(done),
            "uploaded": int(done),
            "failed": 0,
        }
        return web.json_response(
            {
                "session": sid,
                "phase": "Succeeded" if done else "Capturing",
                "workers": workers,
                "ranks": [{"rank": 0, "state": "done" if done else "capturing"}],
            }
        )

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"accepted": [t for t in accepted.values()], "puts": puts, "requests": requests})

    app = web.Application()
    app.add_routes(
        [
            web.get("/v1/telemetry", telemetry),
            web.put("/v1/sessions/{id}", session),
            web.get("/v1/sessions/{id}", session),
            web.get("/_stats", stats),
        ]
    )
    ready.set()
    web.run_app(app, host="0.0.0.0", port=port, print=None, access_log=None, handle_signals=True, backlog=4096)


def api_server(kubeconfig: str, ready: Event, stop: Event) -> None:
    from stepscope.testing.kube.server import KubeTestServer

    with KubeTestServer() as server:
        server.write_kubeconfig(Path(kubeconfig))
        ready.set()
        stop.wait()


def create_pods(api_client: Any, n: int, port: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import kubernetes

    core = kubernetes.client.CoreV1Api(api_client)

    def one(i: int) -> None:
        name = f"train-{i}"
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": name, "labels": {"job": "big"}},
                "spec": {
                    "initContainers": [
                        {
                            "name": "stepscope-sidecar",
                            "image": "s",
                            "restartPolicy": "Always",
                            "ports": [{"name": "stepscope", "containerPort": port}],
                        }
                    ],
                    "containers": [{"name": "train", "image": "t"}],
                },
            },
        )
        core.patch_namespaced_pod_status(name, "default", {"status": {"phase": "Running", "podIP": pod_ip(i)}})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


def run_session(api_client: Any, name: str, concurrency: int, port: int, s3_endpoint: str) -> dict[str, Any]:
    import urllib.request

    import kubernetes
    from kopf.testing import KopfRunner

    from stepscope.operator import kube, metrics, registry
    from stepscope.operator.sessions import lifecycle

    os.environ["STEPSCOPE_FANOUT_CONCURRENCY"] = str(concurrency)
    api = kubernetes.client.CustomObjectsApi(api_client)
    writes_before = metrics.value("stepscope_status_writes_total")
    write_times: list[float] = []
    rounds: list[float] = []
    round_cpu: list[float] = []  # this process's CPU (the operator's threads and loop) during each round
    patch, poll = kube.patch_session_status, lifecycle.SessionRunner._poll

    trigger_cpus: list[float] = []

    def timed_patch(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        if status.get("phase") == "Capturing":
            trigger_cpus.append(time.process_time())
        result = patch(namespace, name, status)
        write_times.append(time.monotonic())
        return result

    async def timed_poll(self: Any, *args: Any) -> None:
        t, cpu = time.monotonic(), time.process_time()
        await poll(self, *args)
        rounds.append(time.monotonic() - t)
        round_cpu.append(time.process_time() - cpu)

    kube.patch_session_status = timed_patch  # every status write of the operator goes through here
    lifecycle.SessionRunner._poll = timed_poll  # type: ignore[method-assign,assignment]
    try:
        with KopfRunner(["run", "--standalone", "--all-namespaces"], registry=registry.build(), timeout=600):
            time.sleep(1.0)  # let kopf list the (empty) resource before the clock starts
            spec = {
                "selector": {"matchLabels": {"job": "big"}},
                "capture": {"steps": 2},
                "hangTimeoutSeconds": 60,
                "storage": {
                    "uri": f"s3://{BUCKET}/sessions",
                    "endpoint": s3_endpoint,
                    "region": "us-east-1",
                    "credentialsSecret": "s3",
                },
                "analysis": {"enabled": False},
                "timeoutSeconds": 900,
            }
            t0, cpu0 = time.time(), time.process_time()
            api.create_namespaced_custom_object(
                "stepscope.io",
                "v1alpha1",
                "default",
                "profilesessions",
                {
                    "apiVersion": "stepscope.io/v1alpha1",
                    "kind": "ProfileSession",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )
            while (
                status := api.get_namespaced_custom_object(
                    "stepscope.io", "v1alpha1", "default", "profilesessions", name
                ).get("status")
                or {}
            ).get("phase") not in ("Succeeded", "Failed"):
                time.sleep(0.5)
            t_end = time.time()
    finally:
        kube.patch_session_status = patch
        lifecycle.SessionRunner._poll = poll  # type: ignore[method-assign]
    stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/_stats").read())
    mine = [t for t in stats["accepted"] if t >= t0]
    trigger_cpu = trigger_cpus[0] - cpu0 if trigger_cpus else float("nan")
    uid = api_uid(api_client, name)
    puts = [count for key, count in stats["puts"].items() if key.endswith(uid)]
    return {
        "phase": status["phase"],
        "message": status.get("message", ""),
        "triggered": len(mine),
        "all_triggered_s": max(mine) - t0,
        "session_s": t_end - t0,
        "rounds": rounds,
        "round_cpu": round_cpu,
        "trigger_cpu": trigger_cpu,
        "status_writes": metrics.value("stepscope_status_writes_total") - writes_before,
        "max_puts_per_pod": max(puts),
        "min_gap_s": min(b - a for a, b in zip(write_times, write_times[1:])),
        "status_bytes": len(json.dumps(status).encode()),
    }


def api_uid(api_client: Any, name: str) -> str:
    import kubernetes

    return kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "stepscope.io", "v1alpha1", "default", "profilesessions", name
    )["metadata"]["uid"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=10240)
    parser.add_argument(
        "--concurrency", type=int, default=64, help="the operator's STEPSCOPE_FANOUT_CONCURRENCY (the chart's default)"
    )
    args = parser.parse_args()

    import logging

    import kubernetes
    import yaml

    from stepscope.local.launch import free_port
    from stepscope.testing.s3 import moto_s3

    os.environ.update(
        {"STEPSCOPE_HMAC_KEY": KEY.decode(), "STEPSCOPE_POLL_INTERVAL_S": "1.0", "STEPSCOPE_SELECTION_GRACE_S": "5"}
    )
    port = free_port()
    ready = multiprocessing.get_context("spawn").Event()
    sidecars = multiprocessing.get_context("spawn").Process(target=simulated_sidecars, args=(port, ready), daemon=True)
    sidecars.start()
    ready.wait(30)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    spawn = multiprocessing.get_context("spawn")
    with moto_s3(BUCKET, CREDENTIALS) as endpoint, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        up, stop = spawn.Event(), spawn.Event()
        server = spawn.Process(target=api_server, args=(str(kubeconfig), up, stop), daemon=True)
        server.start()
        up.wait(60)
        os.environ["KUBECONFIG"] = str(kubeconfig)
        api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        kubernetes.client.ApiextensionsV1Api(api_client).create_custom_resource_definition(
            yaml.safe_load((REPO / "crds" / "profilesession.yaml").read_text())
        )
        kubernetes.client.CoreV1Api(api_client).create_namespaced_secret(
            "default", {"metadata": {"name": "s3"}, "stringData": CREDENTIALS}
        )
        t = time.time()
        create_pods(api_client, args.pods, port)
        print(
            f"setup: {args.pods} Running pods created in {time.time() - t:.1f} s; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        results = [
            ("reference (1 at a time)", run_session(api_client, "sequential", 1, port, endpoint)),
            (
                f"operator ({args.concurrency} at a time)",
                run_session(api_client, "pooled", args.concurrency, port, endpoint),
            ),
        ]
        stop.set()
        server.join(30)
    sidecars.terminate()
    print(
        f"load average at the end (1, 5, 15 min): {', '.join(f'{v:.1f}' for v in os.getloadavg())} on "
        f"{os.cpu_count()} cores"
    )
    for label, r in results:
        rounds = r["rounds"]
        print(
            f"{label:24s} {r['phase']}: {r['triggered']} sidecars triggered, all within {r['all_triggered_s']:.2f} s "
            "of creation "
            f"(operator CPU {r['trigger_cpu']:.2f} s); {len(rounds)} poll rounds, longest {max(rounds):.2f} s, median "
            f"{sorted(rounds)[len(rounds) // 2]:.2f} s (operator CPU a round: "
            f"{', '.join(f'{c:.2f}' for c in r['round_cpu'])} s); "
            f"session {r['session_s']:.1f} s, {r['status_writes']:.0f} status writes, at least {r['min_gap_s']:.2f} s "
            f"apart; max PUTs per pod {r['max_puts_per_pod']}; final status {r['status_bytes']} bytes "
            f"({r['status_bytes'] / 32768:.2f} of the 32 KiB budget)"
        )
    (_, reference), (_, measured) = results
    print(
        f"trigger vs sequential: {reference['all_triggered_s'] / measured['all_triggered_s']:.1f}x faster; "
        f"goal <= 10 s: {measured['all_triggered_s']:.2f} s ({measured['all_triggered_s'] / 10.0:.2f} of the goal)"
    )
    print(
        f"longest poll round vs sequential: {max(reference['rounds']) / max(measured['rounds']):.1f}x faster; "
        f"goal <= 5 s: {max(measured['rounds']):.2f} s ({max(measured['rounds']) / 5.0:.2f} of the goal)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
