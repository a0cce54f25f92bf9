"""What the core reads from the environment, each variable named here once: the key that signs
operator-to-sidecar requests, and an object store's credentials (a mounted Secret's folder, or the
keys the environment carries). The parts read theirs in their own settings modules."""

from __future__ import annotations

import os

KEY_ENV = "STEPSCOPE_HMAC_KEY"
KEY_FILE_ENV = "STEPSCOPE_HMAC_KEY_FILE"  # the operator's key file when KEY_ENV is unset
CREDENTIALS_DIR_ENV = "STEPSCOPE_CREDENTIALS_DIR"
# What the Job controller sets in each pod of an Indexed Job (the shard Job): the pod's completion index.
SHARD_INDEX_ENV = "JOB_COMPLETION_INDEX"
# The store keys each scheme's own tools read from the environment: (access key id, secret, token).
STORE_KEY_ENV = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    "oss": ("OSS_ACCESS_KEY_ID", "OSS_ACCESS_KEY_SECRET", "OSS_SESSION_TOKEN"),
}


def hmac_key() -> str:
    """$STEPSCOPE_HMAC_KEY, stripped; empty where unset."""
    return os.environ.get(KEY_ENV, "").strip()


def hmac_key_file() -> str | None:
    return os.environ.get(KEY_FILE_ENV)


def credentials_dir() -> str | None:
    return os.environ.get(CREDENTIALS_DIR_ENV)


def shard_index() -> str:
    """$JOB_COMPLETION_INDEX as set, empty where unset."""
    return os.environ.get(SHARD_INDEX_ENV, "")


def store_keys(scheme: str) -> dict[str, str | None] | None:
    """The access key triple the environment carries for `scheme` ("s3" or "oss"), None without
    an access key id."""
    key_id, secret, token = STORE_KEY_ENV[scheme]
    if not os.environ.get(key_id):
        return None
    return {
        "accessKeyId": os.environ[key_id],
        "secretAccessKey": os.environ.get(secret),
        "sessionToken": os.environ.get(token),
    }
