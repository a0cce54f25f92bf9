"""HMAC-SHA256 request signing between the operator/CLI and the sidecar (docs/wire.md).

The signature covers method, the target (the host:port the sender addresses), path, timestamp,
nonce and the body's SHA-256, so a captured request cannot be replayed to another sidecar, with
another body, on another path, later than the window, or twice.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping
from email.message import Message
from pathlib import Path

from stepscope.settings import KEY_ENV, hmac_key

HEADER_TIMESTAMP = "X-Stepscope-Timestamp"
HEADER_NONCE = "X-Stepscope-Nonce"
HEADER_SIGNATURE = "X-Stepscope-Signature"
DEFAULT_KEY_FILE = "/etc/stepscope/hmac/key"
# A nonce store this size holds more than a sidecar sees in a 300 s window by orders of magnitude;
# only correctly signed requests enter it, so filling it needs the key.
MAX_NONCES = 100_000
# Whole Unix seconds, as sign() writes them: "nan", "inf" or "1e12" would pass a float comparison.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


class SignatureError(Exception):
    """A request whose signature is missing, wrong, stale or replayed; the message says which."""


class KeyLoadError(RuntimeError):
    """The shared key could not be found or is empty."""


def target(host: str, port: int) -> str:
    """How a signature names the address a request is sent to: `host:port`, lower case, an IPv6
    address compressed and in brackets (the operator's pod IP and the sidecar's POD_IP agree)."""
    host = host.strip("[]").lower()
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        pass  # a name (localhost)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _message(method: str, to: str, path: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    body_hash = hashlib.sha256(body or b"").hexdigest()
    return "\n".join((method.upper(), to, path, timestamp, nonce, body_hash)).encode()


def _digest(key: bytes, method: str, to: str, path: str, timestamp: str, nonce: str, body: bytes) -> str:
    return hmac.new(key, _message(method, to, path, timestamp, nonce, body), hashlib.sha256).hexdigest()


def sign(key: bytes, method: str, path: str, body: bytes, *, to: str, now: float | None = None, nonce: str | None = None) -> dict[str, str]:
    """The headers that authenticate one request to the sidecar at `to` (signing.target);
    `now` and `nonce` only for tests."""
    timestamp = str(int(time.time() if now is None else now))
    nonce = nonce or secrets.token_hex(16)
    return {
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: _digest(key, method, to, path, timestamp, nonce, body),
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

    def check_fresh(self, headers: Mapping[str, str] | Message, *, now: float | None = None) -> None:
        """What can be checked before the body is read: every header there, the timestamp whole
        seconds within the window. A request that fails here is refused unread."""
        for name in (HEADER_NONCE, HEADER_SIGNATURE):
            _header(headers, name)
        timestamp = _header(headers, HEADER_TIMESTAMP)
        if not _TIMESTAMP.fullmatch(timestamp):
            raise SignatureError(f"{HEADER_TIMESTAMP} must be whole Unix seconds")
        now = time.time() if now is None else now
        if abs(now - int(timestamp)) > self._window_s:
            raise SignatureError(f"stale request: signed {now - int(timestamp):+.0f} s from this clock, window is {self._window_s:.0f} s")

    def verify(self, method: str, path: str, body: bytes, headers: Mapping[str, str] | Message, *, targets: Collection[str],
               now: float | None = None) -> None:
        """Accept the request once if it was signed for one of `targets` (the addresses this side
        is reached at, signing.target) and is fresh; SignatureError says why not."""
        now = time.time() if now is None else now
        self.check_fresh(headers, now=now)
        timestamp, nonce = _header(headers, HEADER_TIMESTAMP), _header(headers, HEADER_NONCE)
        signature = _header(headers, HEADER_SIGNATURE).strip().lower().encode()
        if not any(hmac.compare_digest(_digest(self._key, method, to, path, timestamp, nonce, body).encode(), signature) for to in targets):
            raise SignatureError("signature does not match (wrong key, signed for another address, or the request was altered)")
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
    value = hmac_key()
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
