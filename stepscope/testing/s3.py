"""moto's S3 server over real HTTP, as the operator's tests and the fan-out benchmark use it for a
session's object store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import boto3
from moto.server import ThreadedMotoServer


@contextlib.contextmanager
def moto_s3(bucket: str, credentials: dict[str, str]) -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1, with `bucket`; yields its endpoint."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=credentials["accessKeyId"],
            aws_secret_access_key=credentials["secretAccessKey"],
        ).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()
