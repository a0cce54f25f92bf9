"""Fan-out of one ProfileSession to N pods (10,240 for the fleet goals): time from creating the
session until every sidecar accepted the signed trigger (goal <= 10 s), the time of each poll
round of the capture (goal <= 5 s), status writes per second (goal <= 1) and the final status size
(goal < 32 KiB).

The real operator (kopf) runs against the test API server (stepscope/testing/kube, in a process of its own, as
an API server is), with moto's S3 server over HTTP as the session's store (a thread of the operator's process);
N pods are marked Running with addresses 127.0.<i/250>.<i%250+1>, all served by one simulated sidecar process.

What the simulation does: for every request it checks the signature with that pod's own
stepscope.signing.Verifier (the namespace's key, the dialled address as the target, nonces and
window), and answers GET /v1/telemetry and PUT/GET /v1/sessions/<id> with the wire API's bodies:
Capturing for CAPTURE_S after the PUT, then Succeeded. What it does not do: capture, upload,
summarise or run a training; run a process or an HTTP server per pod (one bare socket loop reads
the request line, the headers and a Content-Length body, answers and closes); the real sidecar
server's connection caps and deadlines. The loopback has no latency or loss, and the kernel's
work for both ends of a connection (handshake, delivery, close) is charged to the process that
makes the call, so the operator's CPU here includes work a cluster does on the sidecars' nodes.
Nothing is niced: the simulation and the API server are on the path of every request, so a lower
priority would only move the wait; on this 2-core machine they, and anyone else's processes,
compete with the operator, which on a cluster has the sidecars on other nodes. The CPU of each is
reported beside the operator's. The reference in the same run is the same session with one
request open at a time (sequential).

    .venv/bin/python benchmarks/fanout.py [--pods 10240] [--concurrency 64]
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
    """One process for every pod: it tells pods apart by the address they dialled (the Host
    header), and keeps one Verifier (nonces, window) per pod, as each pod's sidecar does. A bare
    socket loop rather than an HTTP server, so that the simulation's CPU (it runs on the same two
    cores as the operator) is mostly the signature checks and the kernel's, not request objects."""
    import selectors
    import socket

    from stepscope.operator.namespace_keys import namespace_key
    from stepscope.signing import SignatureError, Verifier, target

    key = namespace_key(KEY, "default")  # the key of the pods' namespace, as injected
    verifiers: dict[str, Verifier] = {}
    accepted: dict[tuple[str, str], float] = {}
    puts: dict[str, int] = {}  # "pod session" -> PUTs received
    requests = {"telemetry": 0, "put": 0, "get": 0}

    def answer(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        if path == "/_stats":
            return 200, {"accepted": list(accepted.values()), "puts": puts, "requests": requests}
        host, _, dialled = headers.get("host", "").rpartition(":")
        verifier = verifiers.get(host) or verifiers.setdefault(host, Verifier(key))
        try:
            verifier.verify(method, path, body, headers, targets={target(host, int(dialled))})
        except (SignatureError, ValueError) as exc:
            return 401, {"error": str(exc)}
        if method == "GET" and path == "/v1/telemetry":
            requests["telemetry"] += 1
            alive = [{"rank": 0, "localRank": 0, "worldSize": 1, "pid": 1, "alive": True, "steps": 41}]
            return 200, {"pod": host, "node": "node", "time": time.time(), "ranks": alive}
        if not path.startswith("/v1/sessions/") or method not in ("PUT", "GET"):
            return 404, {"error": "no such endpoint"}
        sid = path.removeprefix("/v1/sessions/")
        if method == "PUT":
            requests["put"] += 1
            puts[f"{host} {sid}"] = puts.get(f"{host} {sid}", 0) + 1
            first = (host, sid) not in accepted
            accepted.setdefault((host, sid), time.time())
            return (201 if first else 200), {"session": sid, "phase": "Pending"}
        requests["get"] += 1
        if (host, sid) not in accepted:
            return 404, {"error": "unknown session"}
        done = time.time() - accepted[(host, sid)] > CAPTURE_S
        workers = {
            "total": 1,
            "triggered": 1,
            "capturing": 0 if done else 1,
            "captured": int(done),
            "uploaded": int(done),
            "failed": 0,
        }
        ranks: list[dict[str, Any]] = [{"rank": 0, "state": "done" if done else "capturing"}]
        return 200, {"session": sid, "phase": "Succeeded" if done else "Capturing", "workers": workers, "ranks": ranks}

    def respond(conn: socket.socket, received: bytes) -> bool:
        """Answer `conn` once `received` holds its whole request; False while more is to come."""
        end = received.find(b"\r\n\r\n")
        if end < 0:
            return False
        request, *lines = received[:end].decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        length = int(headers.get("content-length") or 0)
        if len(received) < end + 4 + length:
            return False
        method, path, _ = request.split(" ", 2)
        status, payload = answer(method, path, headers, received[end + 4 : end + 4 + length])
        data = json.dumps(payload).encode()
        conn.settimeout(10)
        conn.sendall(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + data
        )
        return True

    def serve(conn: socket.socket) -> None:
        """Read what `conn` has sent; answer and close it once its request is whole, else wait
        for more (a connection in `waiting` is registered with the selector)."""
        try:
            chunk = conn.recv(1 << 16)
            received = waiting.get(conn, b"") + chunk
            if chunk and not respond(conn, received):
                if conn not in waiting:
                    selector.register(conn, selectors.EVENT_READ)
                waiting[conn] = received
                return
        except BlockingIOError:
            if conn not in waiting:
                selector.register(conn, selectors.EVENT_READ)
                waiting[conn] = b""
            return
        except OSError:
            pass
        if conn in waiting:
            selector.unregister(conn)
            del waiting[conn]
        conn.close()

    # A bare accept loop: the request is usually there by the time its connection is accepted
    # (the operator sends at once), so most connections are answered without ever being polled.
    listener = socket.create_server(("0.0.0.0", port), backlog=4096)
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    waiting: dict[socket.socket, bytes] = {}
    ready.set()
    while True:
        for ready_key, _ in selector.select():
            if ready_key.fileobj is not listener:
                conn = ready_key.fileobj
                assert isinstance(conn, socket.socket)
                serve(conn)
                continue
            while True:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    break
                conn.setblocking(False)
                serve(conn)


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


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of process `pid` so far (Linux /proc), NaN where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_session(
    api_client: Any, name: str, concurrency: int, port: int, s3_endpoint: str, others: dict[str, int | None]
) -> dict[str, Any]:
    """One session from creation to its end; `others` the pids of the simulation and the API
    server, whose CPU over the session is reported beside the operator's."""
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
            others_cpu = {what: cpu_seconds(pid) for what, pid in others.items()}
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
            others_cpu = {what: cpu_seconds(pid) - others_cpu[what] for what, pid in others.items()}
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
        "session_cpu": time.process_time() - cpu0,
        "others_cpu": others_cpu,
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
        others = {"simulated sidecars": sidecars.pid, "API server": server.pid}
        results = [
            ("reference (1 at a time)", run_session(api_client, "sequential", 1, port, endpoint, others)),
            (
                f"operator ({args.concurrency} at a time)",
                run_session(api_client, "pooled", args.concurrency, port, endpoint, others),
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
            f"({r['status_bytes'] / 32768:.2f} of the 32 KiB budget); CPU over the session: operator "
            f"{r['session_cpu']:.1f} s, {', '.join(f'{what} {cpu:.1f} s' for what, cpu in r['others_cpu'].items())}"
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
