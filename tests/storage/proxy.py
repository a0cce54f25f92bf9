"""A small real HTTP proxy in front of moto's server, for what moto cannot show by itself: it
records the Host header and path of every request (virtual-hosted addressing) and can fail the
first N requests with a 503 or a reset connection (retries)."""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "expect", "te", "upgrade"}


class Proxy(ThreadingHTTPServer):
    """Forwards every request to `upstream` ("host:port"), keeping the client's Host header.
    Works as a reverse proxy (boto3's endpoint_url) and as a forward proxy (botocore proxies)."""

    daemon_threads = True

    def __init__(self, upstream: str, *, fail_first: int = 0, failure: str = "503") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self.fail_left = fail_first
        self.failure = failure  # "503", "reset" or "mixed" (alternating)
        self.injected: list[str] = []
        self.seen: list[tuple[str, str, str]] = []  # (method, Host header, path)
        self.headers: list[dict[str, str]] = []  # lower-cased names
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

    def next_failure(self) -> str | None:
        with self.lock:
            if self.fail_left <= 0:
                return None
            self.fail_left -= 1
            kind = self.failure if self.failure != "mixed" else ("503", "reset")[len(self.injected) % 2]
            self.injected.append(kind)
            return kind


class _Handler(BaseHTTPRequestHandler):
    server: Proxy
    protocol_version = "HTTP/1.1"  # so that boto3's Expect: 100-continue is answered at once

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _forward(self) -> None:
        target = urlsplit(self.path)
        path = target.path + (f"?{target.query}" if target.query else "")
        host = self.headers.get("Host", "")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with self.server.lock:
            self.server.seen.append((self.command, host, target.path))
            self.server.headers.append({k.lower(): v for k, v in self.headers.items()})
        failure = self.server.next_failure()
        if failure == "reset":
            # SO_LINGER 0: close sends a TCP RST, the harshest way a connection can end.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if failure == "503":
            self._send(
                503,
                [("Content-Type", "application/xml")],
                b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>",
            )
            return
        upstream = http.client.HTTPConnection(self.server.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream.request(
            self.command, path, body=body if body or self.command in ("PUT", "POST") else None, headers=headers
        )
        response = upstream.getresponse()
        data = response.read()
        # A HEAD answer has no body but must keep the object's Content-Length.
        dropped = HOP_BY_HOP if self.command == "HEAD" else HOP_BY_HOP | {"content-length"}
        self._send(response.status, [(k, v) for k, v in response.getheaders() if k.lower() not in dropped], data)
        upstream.close()

    def _send(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward
