"""HMAC-SHA256 request signing between the operator/CLI and the sidecar (docs/wire.md).

The signature covers method, path, timestamp, nonce and the body's SHA-256, so a captured request
cannot be replayed with another body, on another path, later than the window, or twice.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from email.message import Message
from pathlib import Path

HEADER_TIMESTAMP = "X-Stepscope-Timestamp"
HEADER_NONCE = "X-Stepscope-Nonce"
HEADER_SIGNATURE = "X-Stepscope-Signature"
KEY_ENV = "STEPSCOPE_HMAC_KEY"
KEY_FILE_ENV = "STEPSCOPE_HMAC_KEY_FILE"  # the operator's key file when KEY_ENV is unset
DEFAULT_KEY_FILE = "/etc/stepscope/hmac/key"
# A nonce store this size holds more than a sidecar sees in a 300 s window by orders of magnitude;
# only correctly signed requests enter it, so filling it needs the key.
MAX_NONCES = 100_000


class SignatureError(Exception):
    """A request whose signature is missing, wrong, stale or replayed; the message says which."""


class KeyLoadError(RuntimeError):
    """The shared key could not be found or is empty."""


def _message(method: str, path: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    body_hash = hashlib.sha256(body or b"").hexdigest()
    return "\n".join((method.upper(), path, timestamp, nonce, body_hash)).encode()


def _digest(key: bytes, method: str, path: str, timestamp: str, nonce: str, body: bytes) -> str:
    return hmac.new(key, _message(method, path, timestamp, nonce, body), hashlib.sha256).hexdigest()


def sign(key: bytes, method: str, path: str, body: bytes, *, now: float | None = None, nonce: str | None = None) -> dict[str, str]:
    """The headers that authenticate one request (`now` and `nonce` only for tests)."""
    timestamp = str(int(time.time() if now is None else now))
    nonce = nonce or secrets.token_hex(16)
    return {
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: _digest(key, method, path, timestamp, nonce, body),
    }


def _header(headers: Mapping[str, str] | Message, name: str) -> str:
    value = headers.get(name)
    if value is None:
        # http.server's message object is case-insensitive already; plain dicts are not.
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    if not value:
        raise SignatureError(f"missing header {name}")
    return value


class Verifier:
    """Checks signed requests; remembers nonces for the window so each is accepted once."""

    def __init__(self, key: bytes, window_s: float = 300, *, max_nonces: int = MAX_NONCES) -> None:
        if not key:
            raise KeyLoadError("the HMAC key is empty")
        self._key = key
        self._window_s = window_s
        self._max_nonces = max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Verifier(window_s={self._window_s})"

    def verify(self, method: str, path: str, body: bytes, headers: Mapping[str, str] | Message, *, now: float | None = None) -> None:
        timestamp = _header(headers, HEADER_TIMESTAMP)
        nonce = _header(headers, HEADER_NONCE)
        signature = _header(headers, HEADER_SIGNATURE)
        expected = _digest(self._key, method, path, timestamp, nonce, body)
        if not hmac.compare_digest(expected.encode(), signature.strip().lower().encode()):
            raise SignatureError("signature does not match (wrong key, or the request was altered)")
        try:
            signed_at = float(timestamp)
        except ValueError:
            raise SignatureError(f"{HEADER_TIMESTAMP} is not a Unix time") from None
        now = time.time() if now is None else now
        if abs(now - signed_at) > self._window_s:
            raise SignatureError(f"stale request: signed {now - signed_at:+.0f} s from this clock, window is {self._window_s:.0f} s")
        self._remember(nonce, now)

    def _remember(self, nonce: str, now: float) -> None:
        with self._lock:
            # Insertion order is arrival order, so expired nonces sit at the front.
            while self._seen and next(iter(self._seen.values())) < now - self._window_s:
                self._seen.popitem(last=False)
            if nonce in self._seen:
                raise SignatureError("replayed request: nonce already used")
            if len(self._seen) >= self._max_nonces:
                # Forgetting a live nonce would reopen it to replay; refusing is the safe side.
                raise SignatureError("too many signed requests in the replay window; retry later")
            self._seen[nonce] = now


def load_key(path: str | None) -> bytes:
    """The shared key: $STEPSCOPE_HMAC_KEY, else the file at `path` (default the Secret mount)."""
    value = os.environ.get(KEY_ENV, "").strip()
    if value:
        return value.encode()
    key_path = Path(path or DEFAULT_KEY_FILE)
    try:
        data = key_path.read_bytes().strip()
    except FileNotFoundError:
        raise KeyLoadError(f"no HMAC key: set {KEY_ENV} or mount the key file at {key_path} (--key-file)") from None
    except OSError as exc:
        raise KeyLoadError(f"cannot read the HMAC key file {key_path}: {exc.strerror}") from None
    if not data:
        raise KeyLoadError(f"the HMAC key file {key_path} is empty")
    return data
