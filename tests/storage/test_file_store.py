"""file:// stores: the single-machine store behaves like an object store (keys, atomic writes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.storage import FileStore, ObjectNotFound, StoreError, open_store


def test_file_uri_forms_open_the_same_folder(tmp_path: Path) -> None:
    assert isinstance(open_store(f"file://{tmp_path}"), FileStore)
    assert open_store(f"file://{tmp_path}").root == open_store(str(tmp_path)).root == tmp_path.resolve()
    assert (
        open_store(f"file://{tmp_path}").uri_for("ranks/rank-0.summary.json")
        == f"file://{tmp_path.resolve()}/ranks/rank-0.summary.json"
    )


def test_put_get_list_exists_download(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    assert store.list() == []
    store.put_bytes("ranks/rank-1.summary.json", b"{}")
    source = tmp_path / "t.gz"
    source.write_bytes(b"trace")
    store.put_file("ranks/rank-1.trace.json.gz", source)
    store.put_bytes("session.json", b"{}")

    assert store.list() == ["ranks/rank-1.summary.json", "ranks/rank-1.trace.json.gz", "session.json"]
    assert store.list("ranks/") == ["ranks/rank-1.summary.json", "ranks/rank-1.trace.json.gz"]
    assert store.exists("session.json") and not store.exists("ranks/rank-0.summary.json")
    assert store.get_bytes("ranks/rank-1.trace.json.gz") == b"trace"
    assert store.download("ranks/rank-1.trace.json.gz", tmp_path / "out" / "t.gz").read_bytes() == b"trace"
    assert source.exists()
    with pytest.raises(ObjectNotFound):
        store.get_bytes("ranks/rank-0.summary.json")
    with pytest.raises(ObjectNotFound):
        store.download("nope", tmp_path / "x")


def test_overwrite_is_atomic_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    store.put_bytes("a/b.json", b"old")
    inode = (tmp_path / "a" / "b.json").stat().st_ino
    store.put_bytes("a/b.json", b"new")
    # A new inode: the new content was renamed over the old file, never written into it.
    assert (tmp_path / "a" / "b.json").stat().st_ino != inode
    assert store.get_bytes("a/b.json") == b"new"
    assert (tmp_path / "a" / "b.json").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.json"]


def test_keys_cannot_escape_the_store(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    for key in ("../x", "/etc/passwd", "a/../../x", ""):
        with pytest.raises(StoreError, match="invalid store key"):
            store.put_bytes(key, b"x")
    with pytest.raises(StoreError, match="no such file"):
        store.put_file("k", tmp_path / "missing")
