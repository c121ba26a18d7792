"""The encrypted content-addressed store: what a shared or public store may and may not see."""

from __future__ import annotations

import hashlib
import io
import secrets
from pathlib import Path
from unittest import mock

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st

from game import store as store_module
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


SMALL = 64  # segment size in these tests, so that a few hundred bytes make many segments


def _segments(blob: bytes) -> tuple[bytes, list[bytes]]:
    head = len(store_module.MAGIC) + store_module.PREFIX_SIZE
    step = SMALL + store_module.TAG_SIZE
    return blob[:head], [blob[i : i + step] for i in range(head, len(blob), step)]


@given(st.binary(max_size=20 * SMALL))
def test_sealedInSegments_opensToTheSameBytes_andEverySegmentCounts(payload: bytes) -> None:
    key = new_key()
    with mock.patch.object(store_module, "SEGMENT", SMALL):
        blob = seal(key, payload, b"transcript")
        assert unseal(key, blob, b"transcript") == payload
        head, segs = _segments(blob)
        assert len(segs) == len(payload) // SMALL + 1  # a full last segment still has an end after it
        broken = [head + b"".join(segs[:-1])]  # cut off at a segment boundary
        broken.append(blob + segs[-1])  # a segment added at the end
        if len(segs) >= 2:
            broken.append(head + b"".join(segs[1:]))  # the first dropped
            broken.append(head + segs[1] + segs[0] + b"".join(segs[2:]))  # two swapped
        for bad in broken:
            with pytest.raises(StoreError):
                unseal(key, bad, b"transcript")


def test_aBlobOfTheFirstFormat_stillOpens() -> None:
    key, nonce = new_key(), secrets.token_bytes(12)
    v1 = (
        store_module.MAGIC_V1
        + nonce
        + AESGCM(key).encrypt(nonce, b"old", store_module.MAGIC_V1 + b"transcript")
    )
    assert unseal(key, v1, b"transcript") == b"old"
    with pytest.raises(StoreError, match="wrong key"):
        unseal(new_key(), v1, b"transcript")


def test_publishFetch_ofAManySegmentTranscript_roundTrips_andStoresUnderTheSealedBytesHash(
    tmp_path: Path,
) -> None:
    src = make_tree(tmp_path / "src")
    (src / "checkpoints").mkdir()
    big = secrets.token_bytes(50 * SMALL + 7)
    (src / "checkpoints" / "state-000000000.bin").write_bytes(big)
    store, key = BlobStore(tmp_path / "store"), new_key()
    with mock.patch.object(store_module, "SEGMENT", SMALL):
        bid = publish_directory(store, key, src)
        raw = store.path(bid).read_bytes()
        assert hashlib.sha256(raw).digest() == bid and big[:SMALL] not in raw
        assert sorted(p.name for p in store.root.iterdir()) == [bid.hex()[:2]]  # no temporary file left
        out = fetch_directory(store, key, bid, tmp_path / "out")
        assert unseal(key, raw, b"transcript") == pack_directory(src)  # the same deterministic tar
    assert (out / "checkpoints" / "state-000000000.bin").read_bytes() == big
    store.check(bid)
    store.path(bid).write_bytes(raw[:-1])
    with pytest.raises(StoreError, match="corrupt"):
        store.check(bid)


def test_unseal_stream_writesNothingUsable_untilTheEnd() -> None:
    """What a failed open wrote is the caller's to throw away: fetch_directory unpacks only after."""
    key = new_key()
    with mock.patch.object(store_module, "SEGMENT", SMALL):
        blob = seal(key, bytes(5 * SMALL), b"transcript")
        out = io.BytesIO()
        with pytest.raises(StoreError):
            store_module.unseal_stream(key, io.BytesIO(blob[:-1]), out, b"transcript")
    assert len(out.getvalue()) == 4 * SMALL  # the segments before the last, not yet proved whole
