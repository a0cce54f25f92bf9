"""moto's standalone S3 server over real HTTP, shared by the storage tests of one module."""

from __future__ import annotations

import re
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

CREDENTIALS = {"accessKeyId": "AKIDTESTTESTTEST", "secretAccessKey": "test-secret-do-not-print", "sessionToken": None}


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture()
def s3(moto_endpoint: str):
    return boto3.session.Session().client(
        "s3", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )


@pytest.fixture()
def bucket(s3, request: pytest.FixtureRequest) -> str:
    name = "stepscope-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:50].strip("-")
    s3.create_bucket(Bucket=name)
    return name
