"""Upload throughput and memory of stepscope.storage against moto's S3 server (its own process,
over HTTP), next to a single-request boto3 put_object of the same file measured in the same run.

    .venv/bin/python benchmarks/storage_upload.py [--size-mb 256] [--repeat 2]

What it shows: the sidecar's streaming multipart upload (16 MiB parts, 4 in flight) against the
simplest upload a client could do, and that its memory stays bounded by parts in flight, not the
file size (the reference reads the whole file into memory)."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import boto3

from stepscope.local.launch import free_port
from stepscope.storage import MAX_CONCURRENCY, MULTIPART_CHUNK, open_store


def _start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("moto_server did not start")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRss:
    """Peak resident memory of this process above its level at start, sampled every 10 ms."""

    def __init__(self) -> None:
        self._base = _rss()
        self.peak = self._base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def above_start_mib(self) -> float:
        return (self.peak - self._base) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2, help="best of N")
    args = parser.parse_args()
    server, endpoint = _start_moto()
    credentials = {"accessKeyId": "bench", "secretAccessKey": "bench"}
    try:
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        client.create_bucket(Bucket="bench")
        store = open_store("s3://bench/store", endpoint=endpoint, credentials=credentials)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json.gz"
            with path.open("wb") as out:
                for _ in range(args.size_mb):
                    out.write(os.urandom(2**20))
            results: dict[str, tuple[float, float]] = {}
            for name, upload in (
                ("stepscope put_file (multipart)", lambda: store.put_file("t.json.gz", path)),
                (
                    "reference: one put_object",
                    lambda: client.put_object(Bucket="bench", Key="ref/t.json.gz", Body=path.read_bytes()),
                ),
            ):
                best, memory = float("inf"), 0.0
                for _ in range(args.repeat):
                    with _PeakRss() as rss:
                        start = time.perf_counter()
                        upload()
                        best = min(best, time.perf_counter() - start)
                    memory = max(memory, rss.above_start_mib)
                results[name] = (best, memory)
        size = args.size_mb
        print(
            f"{size} MiB file, moto_server at {endpoint}, parts of {MULTIPART_CHUNK >> 20} MiB x {MAX_CONCURRENCY} "
            f"in flight, best of {args.repeat}"
        )
        print(f"{'upload':<34} {'seconds':>8} {'MiB/s':>8} {'peak RSS above start (MiB)':>28}")
        for name, (seconds, memory) in results.items():
            print(f"{name:<34} {seconds:8.2f} {size / seconds:8.1f} {memory:28.0f}")
        ours, ref = results["stepscope put_file (multipart)"], results["reference: one put_object"]
        print(f"time ratio stepscope / reference: {ours[0] / ref[0]:.2f}; memory ratio: {ours[1] / max(ref[1], 1):.2f}")
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
