"""Object stores behind one small interface: file:// for a single machine, s3:// and oss://
(Alibaba OSS through its S3-compatible endpoint) through boto3.

Keys are relative to the store's URI. Credentials come from the caller (read from a Secret), a
Secret mounted as files, or the environment; they are held by the client only and never appear
in reprs, messages or logs.
"""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypeVar
from urllib.parse import urlparse

from stepscope import retry
from stepscope.files import PARTIAL_SUFFIX, write_atomically
from stepscope.retry import RetryPolicy
from stepscope.settings import CREDENTIALS_DIR_ENV, credentials_dir, store_keys

log = logging.getLogger(__name__)
T = TypeVar("T")
# botocore's debug log prints request headers, session tokens among them; `-v` must not leak them.
for _name in ("botocore", "boto3", "s3transfer"):
    logging.getLogger(_name).setLevel(logging.INFO)

# Parts of 16 MiB keep a sidecar's upload buffers (chunk x concurrency) at 64 MiB while a multi-GB
# trace still fits far below S3's 10 000-part limit.
MULTIPART_THRESHOLD = 32 * 1024 * 1024
MULTIPART_CHUNK = 16 * 1024 * 1024
MAX_CONCURRENCY = 4
LIST_PAGE_SIZE = 1000  # S3's own maximum per ListObjectsV2 call
TRANSIENT_CODES = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestTimeTooSkewed",
    "503",
    "500",
    "502",
    "504",
}
ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "403"}


class StoreError(Exception):
    """A store operation that failed for a reason a user can act on; `transient` when a retry may
    help (a 5xx, throttling, a dropped connection), never for access, a missing bucket or key."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ObjectNotFound(StoreError, FileNotFoundError):
    """The key is not in the store."""


class Store(Protocol):
    uri: str
    # How many reads a reader of many small objects runs at once: an object store answers each
    # after a round trip, so many are in flight; a folder's files come from the page cache, where
    # threads would only pass the GIL around (10,240 summaries: 0.35 s in one thread, 1.7 s in 16).
    parallel_reads: int

    def put_file(self, key: str, path: Path | str) -> None: ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes: ...
    def download(self, key: str, path: Path | str) -> Path: ...
    def list(self, prefix: str = "") -> list[str]: ...
    def exists(self, key: str) -> bool: ...
    def uri_for(self, key: str) -> str: ...


def _check_size(uri: str, size: int, max_bytes: int) -> None:
    """Refuse an object larger than a reader may hold, before its body is read."""
    if size > max_bytes:
        raise StoreError(
            f"{uri} holds {size / 1e6:,.0f} MB, more than the {max_bytes / (1 << 20):,.0f} MiB such a file may"
        )


def _clean_key(key: str) -> str:
    parts = PurePosixPath(key.replace("\\", "/")).parts
    if not parts or key.startswith("/") or any(p in ("..", ".") for p in parts):
        raise StoreError(f"invalid store key {key!r}: keys are relative paths without '..'")
    return "/".join(parts)


def _join(base: str, key: str) -> str:
    return f"{base.rstrip('/')}/{key}" if base else key


class FileStore:
    """A directory as a store; writes are atomic (temporary file + rename) like an object PUT."""

    parallel_reads = 1

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = self.root.as_uri()

    def __repr__(self) -> str:
        return f"FileStore({self.uri!r})"

    def _path(self, key: str) -> Path:
        return self.root / _clean_key(key)

    def put_file(self, key: str, path: Path | str) -> None:
        source = Path(path)
        if not source.is_file():
            raise StoreError(f"cannot store {source}: no such file")

        def copy(out: Any) -> None:
            with source.open("rb") as src:
                shutil.copyfileobj(src, out, 1024 * 1024)

        self._write(key, copy)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(key, lambda out: out.write(data))

    def _write(self, key: str, fill: Callable[[Any], Any]) -> None:
        target = self._path(key)
        try:
            write_atomically(target, fill)
        except OSError as exc:
            raise StoreError(f"cannot write {target}: {exc.strerror or exc}") from exc

    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        path = self._path(key)
        try:
            if max_bytes is not None:
                _check_size(self.uri_for(key), path.stat().st_size, max_bytes)
            return path.read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(f"{self.uri_for(key)} does not exist") from None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def download(self, key: str, path: Path | str) -> Path:
        source, target = self._path(key), Path(path)
        if not source.is_file():
            raise ObjectNotFound(f"{self.uri_for(key)} does not exist")
        with source.open("rb") as src:
            write_atomically(target, lambda out: shutil.copyfileobj(src, out, 1 << 20))
        return target

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        # A link to a file outside the folder is no object of it: a session's files never point out.
        # Each folder is resolved once (a session's thousands of ranks share one), a file only if a link.
        inside = functools.cache(lambda folder: folder.resolve().is_relative_to(self.root))
        keys = (
            p.relative_to(self.root).as_posix()
            for p in self.root.rglob("*")
            if p.is_file()
            and not p.name.endswith(PARTIAL_SUFFIX)
            and inside(p.parent)
            and (not p.is_symlink() or p.resolve().is_relative_to(self.root))
        )
        return sorted(k for k in keys if k.startswith(prefix))

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def uri_for(self, key: str) -> str:
        return _join(self.uri, _clean_key(key)) if key else self.uri


def _credentials(scheme: str, given: dict[str, Any] | None, ambient: bool = True) -> dict[str, str | None] | None:
    """Access key triple from the caller, a mounted Secret, or the environment; None lets boto3's
    own chain (instance role, IRSA, ~/.aws) decide for s3://. Without `ambient`, the caller's
    alone: a cluster session's storage is reached with its credentialsSecret, never with the
    identity of the process or node that happens to run it."""
    if given and given.get("accessKeyId"):
        return {
            "accessKeyId": given["accessKeyId"],
            "secretAccessKey": given.get("secretAccessKey"),
            "sessionToken": given.get("sessionToken"),
        }
    if not ambient:
        raise StoreError(
            f"no credentials for {scheme}:// from spec.storage.credentialsSecret; a session on the cluster uses no "
            "other"
        )
    folder = credentials_dir()
    if folder:
        files = {name: Path(folder, name) for name in ("accessKeyId", "secretAccessKey", "sessionToken")}
        if files["accessKeyId"].is_file() and files["secretAccessKey"].is_file():
            return {name: (p.read_text().strip() if p.is_file() else None) for name, p in files.items()}
        raise StoreError(f"{CREDENTIALS_DIR_ENV}={folder} must hold the files accessKeyId and secretAccessKey")
    keys = (store_keys("oss") if scheme == "oss" else None) or store_keys("s3")
    if keys is not None:
        return keys
    if scheme == "oss":
        raise StoreError(
            f"no credentials for oss://: set OSS_ACCESS_KEY_ID/OSS_ACCESS_KEY_SECRET, {CREDENTIALS_DIR_ENV}, or "
            "spec.storage.credentialsSecret"
        )
    return None


class S3Store:
    """A bucket and prefix on S3 or an S3-compatible service (OSS, MinIO)."""

    parallel_reads = 16

    def __init__(
        self,
        scheme: str,
        bucket: str,
        prefix: str,
        *,
        endpoint: str | None,
        region: str | None,
        credentials: dict[str, Any] | None,
        retry: RetryPolicy,
        proxies: dict[str, str] | None = None,
        ambient_credentials: bool = True,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.scheme, self.bucket, self.prefix = scheme, bucket, prefix.strip("/")
        self.uri = f"{scheme}://{bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint = endpoint
        self._retry = retry
        # OSS answers only virtual-hosted requests; MinIO-style custom S3 endpoints usually only
        # path-style ones; AWS itself picks.
        style = "virtual" if scheme == "oss" else ("path" if endpoint else "auto")
        config = Config(
            region_name=region or "us-east-1",
            # One retry layer (stepscope.retry, in _call), driven by _classify: botocore's own
            # retries would multiply its attempts and retry what _classify knows is permanent.
            retries={"mode": "standard", "total_max_attempts": 1},
            s3={"addressing_style": style},
            connect_timeout=10,
            read_timeout=60,
            # The analysis reads thousands of summaries parallel_reads at a time (gathering.session_files).
            max_pool_connections=32,
            proxies=proxies,
            # Newer boto3 adds CRC checksums that OSS and older S3-compatible services refuse.
            request_checksum_calculation="when_required" if endpoint or scheme == "oss" else "when_supported",
            response_checksum_validation="when_required" if endpoint or scheme == "oss" else "when_supported",
        )
        creds = _credentials(scheme, credentials, ambient_credentials)
        kwargs: dict[str, Any] = {"endpoint_url": endpoint, "config": config}
        if creds:
            kwargs.update(
                aws_access_key_id=creds["accessKeyId"],
                aws_secret_access_key=creds["secretAccessKey"],
                aws_session_token=creds["sessionToken"],
            )
        # A private session: boto3's default one is not thread-safe to create clients from.
        self._client = boto3.session.Session().client("s3", **kwargs)
        self._transfer = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD,
            multipart_chunksize=MULTIPART_CHUNK,
            max_concurrency=MAX_CONCURRENCY,
        )

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, endpoint={self.endpoint!r})"

    def _key(self, key: str) -> str:
        return _join(self.prefix, _clean_key(key))

    def put_file(self, key: str, path: Path | str) -> None:
        source = Path(path)
        if not source.is_file():
            raise StoreError(f"cannot store {source}: no such file")
        self._call(
            f"upload {source} to {self.uri_for(key)}",
            lambda: self._client.upload_file(str(source), self.bucket, self._key(key), Config=self._transfer),
        )

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(
            f"write {self.uri_for(key)}",
            lambda: self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data),
        )

    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        def read() -> bytes:
            answer = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            if max_bytes is not None and answer["ContentLength"] > max_bytes:
                answer["Body"].close()
                _check_size(self.uri_for(key), answer["ContentLength"], max_bytes)
            return answer["Body"].read()

        return self._call(f"read {self.uri_for(key)}", read)

    def download(self, key: str, path: Path | str) -> Path:
        target = Path(path)
        self._call(
            f"download {self.uri_for(key)}",
            lambda: write_atomically(
                target,
                lambda out: self._client.download_fileobj(self.bucket, self._key(key), out, Config=self._transfer),
            ),
        )
        return target

    def list(self, prefix: str = "") -> list[str]:
        base = _join(self.prefix, "") if self.prefix else ""

        def collect() -> list[str]:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base + prefix, PaginationConfig={"PageSize": LIST_PAGE_SIZE}
            )
            return [obj["Key"][len(base) :] for page in pages for obj in page.get("Contents", [])]

        return sorted(self._call(f"list {self.uri_for(prefix) if prefix else self.uri}", collect))

    def exists(self, key: str) -> bool:
        try:
            self._call(
                f"check {self.uri_for(key)}", lambda: self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            )
        except ObjectNotFound:
            return False
        return True

    def uri_for(self, key: str) -> str:
        return _join(self.uri, _clean_key(key)) if key else self.uri

    def _call(self, what: str, operation: Callable[[], T]) -> T:
        def classified() -> T:
            try:
                return operation()
            except Exception as exc:  # noqa: BLE001 - classified right here
                raise _classify(exc, what, self) from None

        return retry.call(
            classified, self._retry, transient=lambda e: isinstance(e, StoreError) and e.transient, what=what
        )


def _missing_bucket(what: str, store: S3Store) -> StoreError:
    return StoreError(
        f"cannot {what}: bucket {store.bucket!r} does not exist" + (f" at {store.endpoint}" if store.endpoint else "")
    )


def _classify(exc: Exception, what: str, store: S3Store) -> StoreError:
    """Turn a boto3 failure into a StoreError a user can act on, transient when a retry may help."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return StoreError(
            f"cannot {what}: no credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, {CREDENTIALS_DIR_ENV}, or "
            "spec.storage.credentialsSecret)"
        )
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("NoSuchKey", "404", "NotFound"):
            return ObjectNotFound(f"{what}: the object does not exist")
        if code == "NoSuchBucket":
            return _missing_bucket(what, store)
        if code in ACCESS_CODES:
            return StoreError(f"cannot {what}: access denied ({code}); check the credentials and the bucket policy")
        if code in TRANSIENT_CODES or status >= 500:
            return StoreError(f"cannot {what}: the service answered {code or status}", transient=True)
        return StoreError(
            f"cannot {what}: {code or status}: {exc.response.get('Error', {}).get('Message', '')}".rstrip(": ")
        )
    if isinstance(exc, S3UploadFailedError):
        text = str(exc)
        if "NoSuchBucket" in text:
            return _missing_bucket(what, store)
        if any(code in text for code in ACCESS_CODES):
            return StoreError(f"cannot {what}: access denied; check the credentials and the bucket policy")
        return StoreError(f"cannot {what}: {text}", transient=True)
    if isinstance(exc, (BotoCoreError, OSError)):
        return StoreError(f"cannot {what}: {exc}", transient=True)
    return StoreError(f"cannot {what}: {type(exc).__name__}: {exc}")


def open_store(
    uri: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    credentials: dict | None = None,
    retry: RetryPolicy | None = None,
    proxies: dict[str, str] | None = None,
    ambient_credentials: bool = True,
) -> FileStore | S3Store:
    """The store at `uri` (file:///dir, a plain directory path, s3://bucket/prefix or oss://bucket/prefix).

    oss:// needs `region` (endpoint https://oss-<region>.aliyuncs.com) or an explicit `endpoint`.
    `proxies` is botocore's proxy map, for networks that reach the store through a proxy.
    `ambient_credentials` False: s3:// and oss:// only with the given `credentials`, neither the
    environment's nor boto3's chain (the cluster's parts, which run with identities of their own).
    """
    if "://" not in uri:
        if not uri:
            raise StoreError("empty storage URI: use file:///dir, s3://bucket/prefix or oss://bucket/prefix")
        return FileStore(uri)
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            # file://relative/dir is a common slip for file:///abs/dir; take it as the user meant.
            return FileStore(parsed.netloc + parsed.path)
        if not parsed.path:
            raise StoreError(f"bad storage URI {uri!r}: file:// needs a directory, e.g. file:///tmp/stepscope")
        return FileStore(parsed.path)
    if scheme not in ("s3", "oss"):
        raise StoreError(f"bad storage URI {uri!r}: the scheme must be file://, s3:// or oss://")
    if not parsed.netloc:
        raise StoreError(f"bad storage URI {uri!r}: no bucket (expected {scheme}://bucket/prefix)")
    if scheme == "oss" and not endpoint:
        if not region:
            raise StoreError(f"{uri}: oss:// needs a region (e.g. cn-hangzhou) or an endpoint")
        endpoint = f"https://oss-{region.removeprefix('oss-')}.aliyuncs.com"
    if scheme == "oss" and region:
        # OSS signs with the bare region id (cn-hangzhou), whichever form the user wrote.
        region = region.removeprefix("oss-")
    return S3Store(
        scheme,
        parsed.netloc,
        parsed.path,
        endpoint=endpoint,
        region=region,
        credentials=credentials,
        retry=retry or RetryPolicy(),
        proxies=proxies,
        ambient_credentials=ambient_credentials,
    )
