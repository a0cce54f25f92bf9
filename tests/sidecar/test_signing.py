"""stepscope.signing on its own: the replay window's memory and the key's sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.signing import HEADER_SIGNATURE, KeyLoadError, SignatureError, Verifier, load_key, sign

KEY = b"k" * 32
TO = "10.0.0.5:7470"


def test_signature_covers_method_path_body_and_is_case_insensitive_on_header_names() -> None:
    headers = sign(KEY, "PUT", "/v1/sessions/a", b"{}", to=TO, now=1000, nonce="n1")
    Verifier(KEY).verify(
        "PUT", "/v1/sessions/a", b"{}", {k.lower(): v for k, v in headers.items()}, targets={TO}, now=1000
    )
    for method, path, body in (
        ("GET", "/v1/sessions/a", b"{}"),
        ("PUT", "/v1/sessions/b", b"{}"),
        ("PUT", "/v1/sessions/a", b"{ }"),
    ):
        with pytest.raises(SignatureError, match="does not match"):
            Verifier(KEY).verify(method, path, body, headers, targets={TO}, now=1000)
    with pytest.raises(SignatureError, match="does not match"):
        Verifier(KEY).verify(
            "PUT", "/v1/sessions/a", b"{}", {**headers, HEADER_SIGNATURE: "0" * 64}, targets={TO}, now=1000
        )


def test_nonces_expire_with_the_window_and_memory_is_bounded() -> None:
    verifier = Verifier(KEY, window_s=300, max_nonces=3)
    for i in range(3):
        verifier.verify(
            "GET", "/p", b"", sign(KEY, "GET", "/p", b"", to=TO, now=1000, nonce=f"n{i}"), targets={TO}, now=1000
        )
    with pytest.raises(SignatureError, match="too many"):
        verifier.verify(
            "GET", "/p", b"", sign(KEY, "GET", "/p", b"", to=TO, now=1000, nonce="n3"), targets={TO}, now=1000
        )
    with pytest.raises(SignatureError, match="replayed"):
        verifier.verify(
            "GET", "/p", b"", sign(KEY, "GET", "/p", b"", to=TO, now=1000, nonce="n0"), targets={TO}, now=1001
        )
    # Past the window the old nonces are forgotten (their timestamps would be refused as stale anyway).
    verifier.verify("GET", "/p", b"", sign(KEY, "GET", "/p", b"", to=TO, now=1301, nonce="n4"), targets={TO}, now=1301)
    assert len(verifier._seen) == 1
    with pytest.raises(SignatureError, match="stale"):
        verifier.verify(
            "GET", "/p", b"", sign(KEY, "GET", "/p", b"", to=TO, now=1000, nonce="n0"), targets={TO}, now=1301
        )


def test_key_from_environment_first_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("  from-file\n")
    monkeypatch.setenv("STEPSCOPE_HMAC_KEY", "from-env\n")
    assert load_key(str(key_file)) == b"from-env"
    monkeypatch.delenv("STEPSCOPE_HMAC_KEY")
    assert load_key(str(key_file)) == b"from-file"
    key_file.write_text("\n \n")
    with pytest.raises(KeyLoadError, match="is empty"):
        load_key(str(key_file))
    with pytest.raises(KeyLoadError, match="STEPSCOPE_HMAC_KEY") as raised:
        load_key(str(tmp_path / "absent"))
    assert "from-file" not in str(raised.value)
    assert "from-env" not in repr(Verifier(b"from-env"))
