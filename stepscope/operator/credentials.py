"""Object-store credentials from `spec.storage.credentialsSecret`.

They go to the sidecars in the signed PUT body and to the analysis Job as secretKeyRef env, and
nowhere else: never into status, events or logs (error messages name the Secret, not its data)."""
from __future__ import annotations

import base64
from typing import Any

from kubernetes.client.rest import ApiException

from stepscope.operator import kube
from stepscope.settings import STORE_KEY_ENV, store_keys

# Secret data key -> field of the wire `credentials` object. Both the camelCase names of
# docs/wire.md and the AWS environment names (what `kubectl create secret --from-env-file` of an
# AWS profile gives) are accepted.
SECRET_KEYS = {
    "accessKeyId": "accessKeyId", "AWS_ACCESS_KEY_ID": "accessKeyId",
    "secretAccessKey": "secretAccessKey", "AWS_SECRET_ACCESS_KEY": "secretAccessKey",
    "sessionToken": "sessionToken", "AWS_SESSION_TOKEN": "sessionToken",
}
# What the analysis Job's container reads them from (boto3 reads the same names by itself).
ENV_OF_FIELD = dict(zip(("accessKeyId", "secretAccessKey", "sessionToken"), STORE_KEY_ENV["s3"], strict=True))


class CredentialsError(Exception):
    """The Secret is missing or holds no usable keys; the message says what to change."""


class SecretNotFound(CredentialsError):
    """No such Secret (yet: one applied in the same `kubectl apply` may land a moment later)."""


def read_secret_data(namespace: str, secret: str) -> dict[str, str]:
    try:
        obj = kube.core().read_namespaced_secret(secret, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise SecretNotFound(f"Secret {secret} not found in namespace {namespace}") from None
        raise CredentialsError(f"Secret {secret} in namespace {namespace} could not be read: HTTP {exc.status} {exc.reason}") from None
    # Only the keys stepscope reads are decoded: the same Secret may hold binary values (a CA
    # bundle, a keytab) that are none of its business; the others keep just their names.
    data: dict[str, str] = {}
    for key, value in (obj.data or {}).items():
        try:
            data[key] = base64.b64decode(value).decode() if key in SECRET_KEYS else ""
        except UnicodeDecodeError:
            raise CredentialsError(f"Secret {secret} in namespace {namespace}: key {key} is not UTF-8 text") from None
    return data


def secret_key_names(data: dict[str, str]) -> dict[str, str]:
    """wire field -> the Secret's data key that holds it."""
    found: dict[str, str] = {}
    for key in data:
        field = SECRET_KEYS.get(key)
        if field and field not in found:
            found[field] = key
    return found


def from_secret(namespace: str, secret: str) -> dict[str, Any]:
    data = read_secret_data(namespace, secret)
    names = secret_key_names(data)
    if "accessKeyId" not in names or "secretAccessKey" not in names:
        raise CredentialsError(f"Secret {secret} in namespace {namespace} needs the keys accessKeyId and secretAccessKey (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY); it has {sorted(data)}")
    return {"accessKeyId": data[names["accessKeyId"]], "secretAccessKey": data[names["secretAccessKey"]], "sessionToken": data.get(names.get("sessionToken", ""))}


def from_env() -> dict[str, Any] | None:
    """What the analysis Job got through secretKeyRef env; None lets the store use its default chain."""
    values = store_keys("s3")
    return values if values is not None and values["secretAccessKey"] else None
