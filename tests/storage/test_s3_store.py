"""stepscope.storage against moto's S3 server over HTTP: round trips, multipart uploads of large
files, retries through injected failures, errors a user can act on, and secrets kept out of reprs."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from stepscope import storage
from stepscope.analysis.gathering.session_files import find_files, read_ranks
from stepscope.analysis.model import encode_summary, table_summaries
from stepscope.contracts import layout
from stepscope.storage import ObjectNotFound, RetryPolicy, StoreError, open_store
from stepscope.testing.synthetic_ranks import make_summaries
from tests.storage.conftest import CREDENTIALS
from tests.storage.proxy import Proxy

FAST_RETRY = RetryPolicy(attempts=6, base_delay_s=0.05, max_delay_s=0.2)


def _write_large(path: Path, size: int) -> str:
    """`size` bytes that differ from part to part (a repeated block would hide misordered parts)."""
    block = os.urandom(1024 * 1024)
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for i in range(size // len(block)):
            chunk = i.to_bytes(8, "big") + block[8:]
            out.write(chunk)
            digest.update(chunk)
        tail = block[: size % len(block)]
        out.write(tail)
        digest.update(tail)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


def test_round_trip_list_exists_and_uri(moto_endpoint: str, bucket: str, tmp_path: Path) -> None:
    store = open_store(f"s3://{bucket}/team/default/run-1a2b3c4d", endpoint=moto_endpoint, credentials=CREDENTIALS)
    store.put_bytes("ranks/rank-0.summary.json", b'{"rank": 0}')
    local = tmp_path / "trace.json.gz"
    local.write_bytes(b"trace bytes")
    store.put_file("ranks/rank-0.trace.json.gz", local)

    assert store.get_bytes("ranks/rank-0.summary.json") == b'{"rank": 0}'
    assert store.list() == ["ranks/rank-0.summary.json", "ranks/rank-0.trace.json.gz"]
    assert store.list("ranks/rank-0.t") == ["ranks/rank-0.trace.json.gz"]
    assert store.exists("ranks/rank-0.trace.json.gz") and not store.exists("ranks/rank-1.trace.json.gz")
    assert store.download("ranks/rank-0.trace.json.gz", tmp_path / "back" / "t.gz").read_bytes() == b"trace bytes"
    assert store.uri_for("report/index.html") == f"s3://{bucket}/team/default/run-1a2b3c4d/report/index.html"
    with pytest.raises(ObjectNotFound):
        store.get_bytes("ranks/rank-9.summary.json")


def test_list_pages_through_many_keys(moto_endpoint: str, bucket: str, s3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "LIST_PAGE_SIZE", 10)
    for i in range(25):
        s3.put_object(Bucket=bucket, Key=f"p/ranks/rank-{i}.summary.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key="p/report/index.html", Body=b"")
    with Proxy(moto_endpoint.removeprefix("http://")) as proxy:
        keys = open_store(f"s3://{bucket}/p", endpoint=proxy.url, credentials=CREDENTIALS).list("ranks/")
    assert keys == sorted(f"ranks/rank-{i}.summary.json" for i in range(25))
    assert sum(method == "GET" for method, _, _ in proxy.seen) == 3


def test_large_file_goes_multipart_and_comes_back_identical(
    moto_endpoint: str, bucket: str, s3, tmp_path: Path
) -> None:
    size = 65 * 1024 * 1024 + 12345
    source = tmp_path / "big.trace.json.gz"
    checksum = _write_large(source, size)
    store = open_store(f"s3://{bucket}/big", endpoint=moto_endpoint, credentials=CREDENTIALS)
    store.put_file("ranks/rank-0.trace.json.gz", source)

    head = s3.head_object(Bucket=bucket, Key="big/ranks/rank-0.trace.json.gz")
    # A multipart object's ETag is "<md5 of part md5s>-<parts>": 16 MiB parts make five.
    assert head["ETag"].strip('"').endswith("-5")
    assert head["ContentLength"] == size
    back = store.download("ranks/rank-0.trace.json.gz", tmp_path / "back.gz")
    assert _sha256(back) == checksum


@pytest.mark.parametrize("failure", ["503", "mixed"])
def test_uploads_survive_injected_failures(moto_endpoint: str, bucket: str, s3, tmp_path: Path, failure: str) -> None:
    source = tmp_path / "trace.json.gz"
    checksum = _write_large(source, 34 * 1024 * 1024)  # three parts, so part uploads fail too
    # botocore does not retry (one layer): the store's own retry takes every failure.
    with Proxy(moto_endpoint.removeprefix("http://"), fail_first=5, failure=failure) as proxy:
        store = open_store(f"s3://{bucket}/retry", endpoint=proxy.url, credentials=CREDENTIALS, retry=FAST_RETRY)
        store.put_file("ranks/rank-1.trace.json.gz", source)
        proxy.fail_left = 3
        store.put_bytes("ranks/rank-1.summary.json", b'{"rank": 1}')
        proxy.fail_left = 3
        assert store.get_bytes("ranks/rank-1.summary.json") == b'{"rank": 1}'
    assert len(proxy.injected) == 11
    assert source.exists(), "the local copy must survive the upload"
    s3.download_file(bucket, "retry/ranks/rank-1.trace.json.gz", str(tmp_path / "back.gz"))
    assert _sha256(tmp_path / "back.gz") == checksum


def test_a_read_capped_in_size_is_refused_before_its_body_is_read(
    moto_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    for store in (
        open_store(f"s3://{bucket}/cap", endpoint=moto_endpoint, credentials=CREDENTIALS),
        open_store(str(tmp_path)),
    ):
        store.put_bytes("ranks/rank-0.summary.arrow", b"x" * (2 << 20))
        assert len(store.get_bytes("ranks/rank-0.summary.arrow", max_bytes=2 << 20)) == 2 << 20
        with pytest.raises(StoreError, match=r"rank-0.summary.arrow holds 2 MB, more than the 1 MiB such a file may"):
            store.get_bytes("ranks/rank-0.summary.arrow", max_bytes=1 << 20)


def test_the_analysis_reads_a_sessions_summaries_through_failures_of_the_store(
    moto_endpoint: str, bucket: str, s3
) -> None:
    """Summaries are read several at a time, each read retried on its own: 503s and dropped
    connections along the way cost nothing."""
    summaries = make_summaries(40, slow_rank=5, kernel_factor=1.3, seed=4, kernels=8)
    for s in summaries:
        s3.put_object(Bucket=bucket, Key=f"fleet/{layout.rank_summary(s.rank)}", Body=encode_summary(s))
    with Proxy(moto_endpoint.removeprefix("http://"), failure="mixed") as proxy:
        store = open_store(f"s3://{bucket}/fleet", endpoint=proxy.url, credentials=CREDENTIALS, retry=FAST_RETRY)
        files = find_files(store)
        proxy.fail_left = 8  # on the reads
        read = read_ranks(files)
    assert len(proxy.injected) == 8 and not read.problems
    assert table_summaries(read.table) == summaries


def test_failures_beyond_every_retry_raise_a_store_error(moto_endpoint: str, bucket: str) -> None:
    with Proxy(moto_endpoint.removeprefix("http://"), fail_first=100, failure="503") as proxy:
        store = open_store(f"s3://{bucket}/down", endpoint=proxy.url, credentials=CREDENTIALS, retry=FAST_RETRY)
        with pytest.raises(StoreError, match="ServiceUnavailable|503"):
            store.put_bytes("k", b"x")
    assert len(proxy.injected) == FAST_RETRY.attempts, "one retry layer: no botocore retries on top"


def test_missing_bucket_and_bad_uris_are_named(moto_endpoint: str) -> None:
    with Proxy(moto_endpoint.removeprefix("http://")) as proxy:
        store = open_store("s3://no-such-bucket/p", endpoint=proxy.url, credentials=CREDENTIALS, retry=FAST_RETRY)
        with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist") as raised:
            store.put_bytes("k", b"x")
    assert not raised.value.transient and len(proxy.seen) == 1, "a permanent error is not retried"
    with pytest.raises(StoreError, match="scheme must be"):
        open_store("gs://bucket/p")
    with pytest.raises(StoreError, match="no bucket"):
        open_store("s3:///prefix")
    with pytest.raises(StoreError, match="needs a region"):
        open_store("oss://bucket/p", credentials=CREDENTIALS)
    with pytest.raises(StoreError, match="invalid store key"):
        store.put_bytes("../escape", b"x")


def test_credentials_never_appear_in_repr_errors_or_logs(
    moto_endpoint: str, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with Proxy(moto_endpoint.removeprefix("http://"), fail_first=100, failure="503") as proxy:
        store = open_store(f"s3://{bucket}/p", endpoint=proxy.url, credentials=CREDENTIALS, retry=FAST_RETRY)
        with pytest.raises(StoreError) as raised:
            store.put_bytes("k", b"x")
    secret = CREDENTIALS["secretAccessKey"]
    assert secret not in repr(store) and secret not in str(raised.value)
    assert secret not in caplog.text


def test_credentials_from_a_mounted_secret_folder(
    moto_endpoint: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "accessKeyId").write_text("AKIDFROMFILE\n")
    (tmp_path / "secretAccessKey").write_text("from-file\n")
    monkeypatch.setenv("STEPSCOPE_CREDENTIALS_DIR", str(tmp_path))
    with Proxy(moto_endpoint.removeprefix("http://")) as proxy:
        store = open_store(f"s3://{bucket}/p", endpoint=proxy.url)
        store.put_bytes("k", b"x")
    assert proxy.headers and all("Credential=AKIDFROMFILE/" in h["authorization"] for h in proxy.headers)
    (tmp_path / "secretAccessKey").unlink()
    with pytest.raises(StoreError, match="accessKeyId and secretAccessKey"):
        open_store(f"s3://{bucket}/p", endpoint=moto_endpoint)


def test_bad_credentials_are_named_and_not_retried(
    moto_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto import settings

    # moto checks signatures against its IAM users only once this count of unauthenticated calls is reached.
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    with Proxy(moto_endpoint.removeprefix("http://")) as proxy:
        store = open_store(f"s3://{bucket}/p", endpoint=proxy.url, credentials=CREDENTIALS, retry=FAST_RETRY)
        with pytest.raises(StoreError, match=r"access denied \(InvalidAccessKeyId\); check the credentials"):
            store.put_bytes("k", b"x")
    assert len(proxy.seen) == 1


def test_without_ambient_credentials_only_the_given_ones_are_used(
    moto_endpoint: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster part (operator, sidecar, analysis Job) runs with an identity of its own (env keys,
    a mounted folder, IRSA or the node role through boto3's chain): none of it reaches the store of
    a session, only the session's own credentials do."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDAMBIENTPROCESS")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ambient")
    (tmp_path / "accessKeyId").write_text("AKIDAMBIENTFOLDER")
    (tmp_path / "secretAccessKey").write_text("ambient")
    monkeypatch.setenv("STEPSCOPE_CREDENTIALS_DIR", str(tmp_path))
    with Proxy(moto_endpoint.removeprefix("http://")) as proxy:
        for scheme in ("s3", "oss"):
            with pytest.raises(StoreError, match=f"no credentials for {scheme}:// from spec.storage.credentialsSecret"):
                open_store(f"{scheme}://{bucket}/p", endpoint=proxy.url, ambient_credentials=False)
        open_store(
            f"s3://{bucket}/p", endpoint=proxy.url, credentials=CREDENTIALS, ambient_credentials=False
        ).put_bytes("k", b"x")
        open_store(f"s3://{bucket}/p", endpoint=proxy.url).put_bytes(
            "k", b"x"
        )  # the local CLI: the user's own identity
    keys = [h["authorization"].split("Credential=")[1].split("/")[0] for h in proxy.headers]
    assert keys == [CREDENTIALS["accessKeyId"], "AKIDAMBIENTFOLDER"]


def test_the_analysis_of_a_cluster_session_reads_its_store_with_the_sessions_credentials_only(
    moto_endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the analysis Job runs (ambient_credentials=False): its pod's own identity reads nothing."""
    from stepscope import analysis

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDJOBPOD")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pod-secret")
    with pytest.raises(ValueError, match="no credentials for s3:// from spec.storage.credentialsSecret"):
        analysis.report(f"s3://{bucket}/session", endpoint=moto_endpoint, progress=False, ambient_credentials=False)
