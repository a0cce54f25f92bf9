"""oss:// goes through OSS's S3-compatible API with virtual-hosted addressing: the bucket is in the
Host header (<bucket>.oss-<region>.aliyuncs.com), never in the path. boto3 sends its requests
through a recording HTTP proxy that forwards them to moto, which reads the bucket from the Host."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.storage import StoreError, open_store
from tests.storage.conftest import CREDENTIALS
from tests.storage.proxy import Proxy

ENDPOINT_HOST = "oss-cn-hangzhou.aliyuncs.com"


def test_oss_requests_are_virtual_hosted(moto_endpoint: str, s3, tmp_path: Path) -> None:
    s3.create_bucket(Bucket="oss-traces")
    local = tmp_path / "summary.json"
    local.write_bytes(b'{"rank": 3}')
    with Proxy(moto_endpoint.removeprefix("http://")) as proxy:
        store = open_store(
            "oss://oss-traces/team/default/run-1a2b3c4d",
            region="oss-cn-hangzhou",
            endpoint=f"http://{ENDPOINT_HOST}",
            credentials=CREDENTIALS,
            proxies={"http": proxy.url},
        )
        store.put_file("ranks/rank-3.summary.json", local)
        assert store.get_bytes("ranks/rank-3.summary.json") == b'{"rank": 3}'
        assert store.list("ranks/") == ["ranks/rank-3.summary.json"]
        assert store.exists("ranks/rank-3.summary.json")

    assert len(proxy.seen) >= 4
    for method, host, path in proxy.seen:
        assert host == f"oss-traces.{ENDPOINT_HOST}", (method, host, path)
        assert not path.startswith("/oss-traces"), (method, path)
    assert ("PUT", f"oss-traces.{ENDPOINT_HOST}", "/team/default/run-1a2b3c4d/ranks/rank-3.summary.json") in proxy.seen
    assert all("/cn-hangzhou/s3/aws4_request" in h["authorization"] for h in proxy.headers)
    # moto stored it in the bucket named by the Host header.
    assert (
        s3.get_object(Bucket="oss-traces", Key="team/default/run-1a2b3c4d/ranks/rank-3.summary.json")["Body"].read()
        == b'{"rank": 3}'
    )
    # OSS refuses the CRC checksum headers newer boto3 versions add by default.
    assert not [
        h
        for headers in proxy.headers
        for h in headers
        if h.startswith("x-amz-checksum") or h == "x-amz-sdk-checksum-algorithm"
    ]
    assert store.uri_for("x") == "oss://oss-traces/team/default/run-1a2b3c4d/x"


def test_oss_default_endpoint_and_credentials_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("STEPSCOPE_CREDENTIALS_DIR", raising=False)
    monkeypatch.delenv("OSS_ACCESS_KEY_ID", raising=False)
    with pytest.raises(StoreError, match="no credentials for oss://"):
        open_store("oss://bucket/p", region="cn-beijing")
    monkeypatch.setenv("OSS_ACCESS_KEY_ID", "LTAIEXAMPLE")
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", "oss-secret-do-not-print")
    store = open_store("oss://bucket/p", region="cn-beijing")
    assert store.endpoint == "https://oss-cn-beijing.aliyuncs.com"
    assert "oss-secret-do-not-print" not in repr(store)
