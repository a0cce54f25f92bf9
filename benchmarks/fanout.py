"""Fan-out of one ProfileSession to 1,000 pods: time from creating the session until every
sidecar accepted the signed trigger (goal <= 5 s), and status writes per second (goal <= 1).

The real operator (kopf) runs against the test API server; 1,000 pods are marked Running with
addresses 127.0.<i/250>.<i%250+1>, all served by one simulated sidecar in a child process that
verifies every signature (stepscope.signing.Verifier) and answers the wire API per pod. The
reference in the same run is the same fan-out with a pool of 1 (sequential triggering).

    .venv/bin/python benchmarks/fanout.py [--pods 1000]
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
CAPTURE_S = 3.0  # how long each simulated sidecar reports Capturing before Succeeded


def pod_ip(i: int) -> str:
    return f"127.0.{i // 250}.{i % 250 + 1}"


def simulated_sidecars(port: int, ready: Event) -> None:
    """One aiohttp server for every pod (it tells pods apart by the address they dialled)."""
    from aiohttp import web

    from stepscope.operator.namespace_keys import namespace_key
    from stepscope.signing import SignatureError, Verifier, target

    verifier = Verifier(namespace_key(KEY, "default"))  # the key of the pods' namespace, as injected
    accepted: dict[tuple[str, str], float] = {}
    puts: dict[str, int] = {}  # "pod session" -> PUTs received

    async def session(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            verifier.verify(request.method, request.path, body, request.headers, targets={target(request.host.rsplit(':', 1)[0], int(request.host.rsplit(':', 1)[1]))})
        except SignatureError as exc:
            return web.json_response({"error": str(exc)}, status=401)
        pod, sid = request.host.rsplit(":", 1)[0], request.match_info["id"]
        if request.method == "PUT":
            puts[f"{pod} {sid}"] = puts.get(f"{pod} {sid}", 0) + 1
            first = (pod, sid) not in accepted
            accepted.setdefault((pod, sid), time.time())
            return web.json_response({"session": sid, "phase": "Pending"}, status=201 if first else 200)
        if (pod, sid) not in accepted:
            return web.json_response({"error": "unknown session"}, status=404)
        done = time.time() - accepted[(pod, sid)] > CAPTURE_S
        workers = {"total": 1, "triggered": 1, "capturing": 0 if done else 1, "captured": int(done), "uploaded": int(done), "failed": 0}
        return web.json_response({"session": sid, "phase": "Succeeded" if done else "Capturing", "workers": workers,
                                  "ranks": [{"rank": 0, "state": "done" if done else "capturing"}]})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"accepted": [t for t in accepted.values()], "puts": puts})

    app = web.Application()
    app.add_routes([web.put("/v1/sessions/{id}", session), web.get("/v1/sessions/{id}", session), web.get("/_stats", stats)])
    ready.set()
    web.run_app(app, host="0.0.0.0", port=port, print=None, access_log=None, handle_signals=True)



def create_pods(api_client, n: int, port: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import kubernetes

    core = kubernetes.client.CoreV1Api(api_client)

    def one(i: int) -> None:
        name = f"train-{i}"
        core.create_namespaced_pod("default", {"metadata": {"name": name, "labels": {"job": "big"}}, "spec": {
            "initContainers": [{"name": "stepscope-sidecar", "image": "s", "restartPolicy": "Always", "ports": [{"name": "stepscope", "containerPort": port}]}],
            "containers": [{"name": "train", "image": "t"}]}})
        core.patch_namespaced_pod_status(name, "default", {"status": {"phase": "Running", "podIP": pod_ip(i)}})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


def run_session(api_client, name: str, concurrency: int, port: int) -> dict[str, float]:
    import urllib.request

    import kubernetes
    from kopf.testing import KopfRunner

    from stepscope.operator import kube, metrics, registry

    os.environ["STEPSCOPE_FANOUT_CONCURRENCY"] = str(concurrency)
    api = kubernetes.client.CustomObjectsApi(api_client)
    writes_before = metrics.value("stepscope_status_writes_total")
    write_times: list[float] = []
    patch = kube.patch_session_status

    def timed_patch(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        result = patch(namespace, name, status)
        write_times.append(time.monotonic())
        return result
    kube.patch_session_status = timed_patch  # every status write of the operator goes through here
    with KopfRunner(["run", "--standalone", "--all-namespaces"], registry=registry.build(), timeout=300):
        time.sleep(1.0)  # let kopf list the (empty) resource before the clock starts
        spec = {"selector": {"matchLabels": {"job": "big"}}, "capture": {"steps": 2}, "hangTimeoutSeconds": 60,
                "storage": {"uri": f"file://{tempfile.mkdtemp(prefix='fanout-')}"}, "analysis": {"enabled": False}, "timeoutSeconds": 300}
        t0 = time.time()
        api.create_namespaced_custom_object("stepscope.io", "v1alpha1", "default", "profilesessions",
                                            {"apiVersion": "stepscope.io/v1alpha1", "kind": "ProfileSession", "metadata": {"name": name}, "spec": spec})
        while (status := api.get_namespaced_custom_object("stepscope.io", "v1alpha1", "default", "profilesessions", name).get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            time.sleep(0.2)
        t_end = time.time()
    kube.patch_session_status = patch
    stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/_stats").read())
    mine = [t for t in stats["accepted"] if t >= t0]
    uid = api_uid(api_client, name)
    puts = [count for key, count in stats["puts"].items() if key.endswith(uid)]
    return {"phase": status["phase"], "triggered": len(mine), "all_triggered_s": max(mine) - t0, "session_s": t_end - t0,
            "status_writes": metrics.value("stepscope_status_writes_total") - writes_before,
            "max_puts_per_pod": max(puts), "min_gap_s": min(b - a for a, b in zip(write_times, write_times[1:])),
            "status_bytes": len(json.dumps(status).encode())}


def api_uid(api_client, name: str) -> str:
    import kubernetes
    return kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object("stepscope.io", "v1alpha1", "default", "profilesessions", name)["metadata"]["uid"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1000)
    args = parser.parse_args()

    import kubernetes

    from stepscope.testing.kube.server import KubeTestServer

    os.environ.update({"STEPSCOPE_HMAC_KEY": KEY.decode(), "STEPSCOPE_POLL_INTERVAL_S": "1.0", "STEPSCOPE_SELECTION_GRACE_S": "5"})
    from stepscope.local.launch import free_port

    port = free_port()
    ready = multiprocessing.get_context("spawn").Event()
    sidecars = multiprocessing.get_context("spawn").Process(target=simulated_sidecars, args=(port, ready), daemon=True)
    sidecars.start()
    ready.wait(30)
    import yaml
    with KubeTestServer() as server, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = server.write_kubeconfig(Path(tmp) / "kubeconfig")
        os.environ["KUBECONFIG"] = str(kubeconfig)
        api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        kubernetes.client.ApiextensionsV1Api(api_client).create_custom_resource_definition(yaml.safe_load((REPO / "crds" / "profilesession.yaml").read_text()))
        t = time.time()
        create_pods(api_client, args.pods, port)
        print(f"setup: {args.pods} Running pods created in {time.time() - t:.1f} s")
        reference = run_session(api_client, "sequential", 1, port)
        measured = run_session(api_client, "pooled", 64, port)
    sidecars.terminate()
    for label, r in (("reference (pool of 1)", reference), ("operator (pool of 64)", measured)):
        print(f"{label:24s} {r['phase']}: {r['triggered']} sidecars triggered, all within {r['all_triggered_s']:.2f} s of creation; "
              f"session {r['session_s']:.1f} s, {r['status_writes']:.0f} status writes, at least {r['min_gap_s']:.2f} s apart; max PUTs per pod {r['max_puts_per_pod']}; "
              f"final status {r['status_bytes']} bytes ({r['status_bytes'] / 32768:.2f} of the 32 KiB budget)")
    print(f"fan-out speedup vs sequential: {reference['all_triggered_s'] / measured['all_triggered_s']:.1f}x; "
          f"goal <= 5 s: {measured['all_triggered_s']:.2f} s ({measured['all_triggered_s'] / 5.0:.2f} of the goal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
