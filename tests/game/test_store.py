"""The encrypted content-addressed store: what a shared or public store may and may not see."""

from __future__ import annotations

from pathlib import Path

import pytest

from game.store import (
    BlobStore,
    StoreError,
    fetch_directory,
    new_key,
    pack_directory,
    parse_key,
    publish_directory,
    seal,
    unseal,
)


def make_tree(root: Path) -> Path:
    (root / "log").mkdir(parents=True)
    (root / "manifest.json").write_text('{"secret": "client data"}')
    (root / "log" / "step-000000001.bin").write_bytes(bytes(range(256)) * 4)
    return root


def test_publish_fetch_round_trip_and_store_sees_no_plaintext(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    store = BlobStore(tmp_path / "store")
    key = new_key()
    bid = publish_directory(store, key, src)
    raw = store.path(bid).read_bytes()
    assert b"client data" not in raw and bytes(range(256)) not in raw
    out = fetch_directory(store, key, bid, tmp_path / "out")
    assert (out / "manifest.json").read_text() == '{"secret": "client data"}'
    assert (out / "log" / "step-000000001.bin").read_bytes() == bytes(range(256)) * 4


def test_pack_is_deterministic(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "a")
    b = make_tree(tmp_path / "b")
    assert pack_directory(a) == pack_directory(b)


def test_wrong_key_modified_blob_and_wrong_purpose_are_errors(tmp_path: Path) -> None:
    key = new_key()
    blob = seal(key, b"payload", b"transcript")
    with pytest.raises(StoreError, match="wrong key"):
        unseal(new_key(), blob, b"transcript")
    with pytest.raises(StoreError, match="wrong key or the blob was modified"):
        unseal(key, blob[:-1] + bytes([blob[-1] ^ 1]), b"transcript")
    with pytest.raises(StoreError):
        unseal(key, blob, b"dataset")
    store = BlobStore(tmp_path)
    bid = store.put(blob)
    store.path(bid).write_bytes(blob[:-1] + b"\x00")
    with pytest.raises(StoreError, match="corrupt"):
        store.get(bid)
    with pytest.raises(StoreError, match="not found"):
        store.get(b"\x11" * 32)


def test_parse_key() -> None:
    k = new_key()
    assert parse_key("0x" + k.hex()) == k
    with pytest.raises(StoreError, match="64 hex"):
        parse_key("abcd")
    with pytest.raises(StoreError, match="64 hex"):
        parse_key("zz" * 32)
