"""The encrypted content-addressed store: what a shared or public store may and may not see."""

from __future__ import annotations

import contextlib
import hashlib
import io
import secrets
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st

from game.store import archive, blobs, sealing
from game.store.archive import SealedArchive, fetch_directory, publish_directory
from game.store.blobs import BlobStore
from game.store.keys import new_key, parse_key
from game.store.sealing import SealedFile, StoreError
from tests.game.helpers import pack_directory, seal, unseal, unseal_stream


def _in_store(name: str, value: Any) -> contextlib.ExitStack:
    """Patch ``name`` in every module of :mod:`game.store` that holds it (``open`` in all of them,
    as a module global standing in for the builtin)."""
    stack = contextlib.ExitStack()
    for module in (sealing, blobs, archive):
        if name == "open" or hasattr(module, name):
            stack.enter_context(mock.patch.object(module, name, value, create=name == "open"))
    return stack


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
    store.path(bid).write_bytes(
        blob[:-1] + bytes([blob[-1] ^ 1])
    )  # a zero byte was no change one time in 256
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
    head = len(sealing.MAGIC) + sealing.PREFIX_SIZE
    step = SMALL + sealing.TAG_SIZE
    return blob[:head], [blob[i : i + step] for i in range(head, len(blob), step)]


@given(st.binary(max_size=20 * SMALL))
def test_sealedInSegments_opensToTheSameBytes_andEverySegmentCounts(payload: bytes) -> None:
    key = new_key()
    with _in_store("SEGMENT", SMALL):
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
    v1 = sealing.MAGIC_V1 + nonce + AESGCM(key).encrypt(nonce, b"old", sealing.MAGIC_V1 + b"transcript")
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
    with _in_store("SEGMENT", SMALL):
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


def test_publish_sealsAsItPacks_writingNoPlaintextToDisk(tmp_path: Path) -> None:
    """The archive goes to disk only sealed: no clear copy of the client's data beside the store,
    even one unlinked at once (a store may be synced)."""
    src = make_tree(tmp_path / "src")
    (src / "checkpoints").mkdir()
    (src / "checkpoints" / "state-000000000.bin").write_bytes(secrets.token_bytes(9 * SMALL))
    store, key = BlobStore(tmp_path / "store"), new_key()

    def read_only(path: Path, mode: str = "r") -> Any:
        assert "r" in mode and "+" not in mode, f"{path} opened to write ({mode})"
        return open(path, mode)

    def no_clear_file(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a temporary file for the archive in the clear")

    with (
        _in_store("SEGMENT", SMALL),
        _in_store("open", read_only),
        mock.patch.object(tempfile, "TemporaryFile", no_clear_file),
        mock.patch.object(tempfile, "NamedTemporaryFile", no_clear_file),
    ):
        bid = publish_directory(store, key, src)
        raw = store.path(bid).read_bytes()
        assert unseal(key, raw, b"transcript") == pack_directory(src)
    assert [p.relative_to(store.root) for p in store.root.rglob("*") if p.is_file()] == [
        Path(bid.hex()[:2]) / bid.hex()
    ]


def test_publishAndFetch_reportTheirBytes_inOrder_endingWhole(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    (src / "checkpoints").mkdir()
    (src / "checkpoints" / "state-000000000.bin").write_bytes(secrets.token_bytes(20 * SMALL + 3))
    store, key = BlobStore(tmp_path / "store"), new_key()
    published: list[tuple[int, int]] = []
    fetched: list[tuple[int, int]] = []
    with _in_store("SEGMENT", SMALL):
        bid = publish_directory(store, key, src, progress=lambda d, t: published.append((d, t)))
        fetch_directory(store, key, bid, tmp_path / "out", progress=lambda d, t: fetched.append((d, t)))
    archive = len(pack_directory(src))
    for calls, whole in ((published, archive), (fetched, store.path(bid).stat().st_size)):
        assert len(calls) > 10  # a segment at a time, not once at the end
        assert [d for d, _ in calls] == sorted(d for d, _ in calls)
        assert all(d < t for d, t in calls[:-1])  # not done before the end: a bar stays up
        assert calls[-1] == (whole, whole)


def test_unseal_stream_writesNothingUsable_untilTheEnd() -> None:
    """What a failed open wrote is the caller's to throw away (fetch_directory's caller too)."""
    key = new_key()
    with _in_store("SEGMENT", SMALL):
        blob = seal(key, bytes(5 * SMALL), b"transcript")
        out = io.BytesIO()
        with pytest.raises(StoreError):
            unseal_stream(key, io.BytesIO(blob[:-1]), out, b"transcript")
    assert len(out.getvalue()) == 4 * SMALL  # the segments before the last, not yet proved whole


class _CountingReads(io.RawIOBase):
    """A blob file that counts the bytes read from it."""

    def __init__(self, fh: Any, counter: list[int]) -> None:
        self.fh, self.counter = fh, counter

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.fh.seek(offset, whence)

    def fileno(self) -> int:
        return self.fh.fileno()

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        n: int = self.fh.readinto(buffer)
        self.counter[0] += n
        return n

    def close(self) -> None:
        self.fh.close()
        super().close()


def test_fetch_readsTheBlobOnce_hashingAndDecryptingAsItUnpacks(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    (src / "checkpoints").mkdir()
    big = secrets.token_bytes(30 * SMALL + 5)
    (src / "checkpoints" / "state-000000000.bin").write_bytes(big)
    store, key = BlobStore(tmp_path / "store"), new_key()
    counter = [0]

    def counting_open(path: Path, mode: str = "r") -> Any:
        fh = open(path, mode)  # noqa: SIM115 - closed by the wrapper
        return _CountingReads(fh, counter) if Path(path) == store.path(bid) else fh

    with _in_store("SEGMENT", SMALL):
        bid = publish_directory(store, key, src)
        with _in_store("open", counting_open):
            out = fetch_directory(store, key, bid, tmp_path / "out")
    assert counter[0] == store.path(bid).stat().st_size  # once through, not a hash pass and then a copy
    assert (out / "checkpoints" / "state-000000000.bin").read_bytes() == big
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "checkpoints/state-000000000.bin",
        "log/step-000000001.bin",
        "manifest.json",
    ]


def test_fetch_ofABlobThatIsNotItsId_isCorrupt_evenWhereASegmentFailsFirst(tmp_path: Path) -> None:
    store, key = BlobStore(tmp_path / "store"), new_key()
    with _in_store("SEGMENT", SMALL):
        first = publish_directory(store, key, make_tree(tmp_path / "a"))
        other = tmp_path / "b"
        make_tree(other)
        (other / "extra.bin").write_bytes(b"x" * 5 * SMALL)
        second = publish_directory(store, key, other)
        raw = store.path(first).read_bytes()
        # a key holder's other blob under this id: every segment authentic, the id wrong
        store.path(first).write_bytes(store.path(second).read_bytes())
        with pytest.raises(StoreError, match="corrupt"):
            fetch_directory(store, key, first, tmp_path / "out1")
        # one byte changed in the first segment: its tag fails before the hash is known
        flipped = bytearray(raw)
        flipped[len(sealing.MAGIC) + sealing.PREFIX_SIZE + 3] ^= 1
        store.path(first).write_bytes(bytes(flipped))
        with pytest.raises(StoreError, match="corrupt"):
            fetch_directory(store, key, first, tmp_path / "out2")
        store.path(first).write_bytes(raw)
        with pytest.raises(StoreError, match="wrong key"):
            fetch_directory(store, new_key(), first, tmp_path / "out3")
        assert (fetch_directory(store, key, first, tmp_path / "out4") / "manifest.json").exists()


def _sealed_tar(store: BlobStore, key: bytes, add: Callable[[tarfile.TarFile], None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add(tar)
    return store.put(seal(key, buf.getvalue(), b"transcript"))


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"bad") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _link(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    tar.addfile(info)


def test_fetch_refusesLinksAndPathsOutsideItsDirectory_andWhatIsNoArchive(tmp_path: Path) -> None:
    store, key = BlobStore(tmp_path / "store"), new_key()
    dest = tmp_path / "out" / "inner"
    outside = _sealed_tar(store, key, lambda tar: _file(tar, "../escaped"))
    with pytest.raises(StoreError, match=r"entry '\.\./escaped' is not a name its packer writes"):
        fetch_directory(store, key, outside, dest)
    assert not (tmp_path / "out" / "escaped").exists()
    link = _sealed_tar(store, key, lambda tar: _link(tar, "manifest.json"))
    with pytest.raises(StoreError, match=r"non-file entry 'manifest\.json'"):
        fetch_directory(store, key, link, dest)
    assert not (dest / "manifest.json").exists()
    junk = store.put(seal(key, b"not a tar" * 100, b"transcript"))
    with pytest.raises(StoreError, match="is not a published directory"):
        fetch_directory(store, key, junk, tmp_path / "out2")


def _v1_blob(tmp_path: Path) -> tuple[BlobStore, bytes, bytes]:
    """A published directory in the first format (one AES-GCM call): the store, key and id."""
    src = make_tree(tmp_path / "src")
    key, nonce = new_key(), secrets.token_bytes(12)
    sealed = AESGCM(key).encrypt(nonce, pack_directory(src), sealing.MAGIC_V1 + b"transcript")
    store = BlobStore(tmp_path / "store")
    return store, key, store.put(sealing.MAGIC_V1 + nonce + sealed)


def test_fetch_opensABlobOfTheFirstFormat(tmp_path: Path) -> None:
    store, key, bid = _v1_blob(tmp_path)
    out = fetch_directory(store, key, bid, tmp_path / "out")
    assert (out / "log" / "step-000000001.bin").read_bytes() == bytes(range(256)) * 4


@given(
    st.binary(max_size=6 * SMALL + 3),
    st.lists(st.tuples(st.integers(0, 7 * SMALL), st.integers(0, 3 * SMALL)), max_size=8),
)
def test_sealedFile_readsAnyRangeAsThePlaintext(payload: bytes, reads: list[tuple[int, int]]) -> None:
    key = new_key()
    with _in_store("SEGMENT", SMALL):
        sealed = SealedFile(key, io.BytesIO(seal(key, payload, b"transcript")), b"transcript")
        assert sealed.seek(0, io.SEEK_END) == len(payload)
        for offset, n in reads:
            sealed.seek(offset)
            assert sealed.read(n) == payload[offset : offset + n]
            assert sealed.tell() == min(offset + n, max(offset, len(payload)))


def test_sealedFile_failsOnTheSegmentThatWasChanged_andOnOneCutOffTheEnd() -> None:
    key, payload = new_key(), secrets.token_bytes(4 * SMALL + 10)
    with _in_store("SEGMENT", SMALL):
        head, segs = _segments(seal(key, payload, b"transcript"))
        changed = bytearray(segs[2])
        changed[5] ^= 1
        sealed = SealedFile(
            key, io.BytesIO(head + b"".join([*segs[:2], bytes(changed), *segs[3:]])), b"transcript"
        )
        sealed.seek(SMALL)
        assert sealed.read(SMALL) == payload[SMALL : 2 * SMALL]  # segments are checked one by one
        with pytest.raises(StoreError, match="wrong key or the blob was modified"):
            sealed.read(1)
        cut = SealedFile(key, io.BytesIO(head + b"".join(segs[:3])), b"transcript")
        cut.seek(2 * SMALL)
        with pytest.raises(StoreError):  # the new last segment was not sealed as the last
            cut.read(1)
        with pytest.raises(StoreError, match="wrong key"):
            SealedFile(new_key(), io.BytesIO(head + b"".join(segs)), b"transcript").read(1)


def test_sealedArchive_extractsOneFile_decryptingOnlyItsSegments(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    (src / "checkpoints").mkdir()
    big = secrets.token_bytes(40 * SMALL)
    (src / "checkpoints" / "state-000000000.bin").write_bytes(big)
    store, key = BlobStore(tmp_path / "store"), new_key()
    with _in_store("SEGMENT", SMALL):
        bid = publish_directory(store, key, src)
        with SealedArchive(store, key, bid) as archive:
            assert archive.names() == [
                "checkpoints/state-000000000.bin",
                "log/step-000000001.bin",
                "manifest.json",
            ]
            path = archive.extract("manifest.json", tmp_path / "out")
            assert archive.sealed is not None
            total = len(_segments(store.path(bid).read_bytes())[1])
            assert archive.sealed.segments_read <= total - 39  # none of the checkpoint's inner 39
            with pytest.raises(StoreError, match=r"no file 'leaves\.bin'"):
                archive.extract("leaves.bin", tmp_path / "out")
    assert path.read_text() == '{"secret": "client data"}'
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.json"]  # no temporary left
    with pytest.raises(StoreError, match="wrong key"):
        SealedArchive(store, new_key(), bid)


def test_sealedArchive_refusesAFileNamedOutsideItsDirectory(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    store, key = BlobStore(tmp_path / "store"), new_key()
    bid = store.put(seal(key, buf.getvalue(), b"transcript"))
    with pytest.raises(StoreError, match="is not a name its packer writes"):
        SealedArchive(store, key, bid)
    assert not (tmp_path / "out" / "escaped").exists()


@pytest.mark.parametrize(
    ("names", "why"),
    [
        (["log/step-000000003.bin", "./log/step-000000003.bin"], "is not a name its packer writes"),
        (["log/step-000000003.bin", "log//step-000000003.bin"], "is not a name its packer writes"),
        (["log/step-000000003.bin", "log/step-000000003.bin"], "holds 'log/step-000000003.bin' twice"),
        (["log/.hidden"], "is not a name its packer writes"),
    ],
)
def test_anArchiveWhoseNamesAFilesystemWouldMerge_isRefused_byBothReaders(
    tmp_path: Path, names: list[str], why: str
) -> None:
    """The auditor unpacks to a filesystem, where the last of ``log/x`` and ``./log/x`` (or of two
    ``log/x``) wins; the judge looks a member up by its name and got the first. A trainer's archive
    so made had the judge rule on other bytes than the auditor replayed (a void game; for an
    asynchronous task, a witness chunk skipped and a ruling for the trainer)."""
    store, key = BlobStore(tmp_path / "store"), new_key()

    def add(tar: tarfile.TarFile) -> None:
        for i, name in enumerate(names):
            data = bytes([i]) * 4
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    bid = _sealed_tar(store, key, add)
    with pytest.raises(StoreError, match=why):
        fetch_directory(store, key, bid, tmp_path / "out")
    with pytest.raises(StoreError, match=why):
        SealedArchive(store, key, bid)


def test_sealedArchive_withAFileThatClaimsMoreBytesThanTheBlobHolds_doesNotOpen(tmp_path: Path) -> None:
    info = tarfile.TarInfo("checkpoints/state-000000000.bin")
    info.size = 10 * SMALL
    header = info.tobuf(tarfile.USTAR_FORMAT)
    store, key = BlobStore(tmp_path / "store"), new_key()
    bid = store.put(seal(key, header + bytes(SMALL), b"transcript"))  # the data stops short
    with pytest.raises(StoreError, match="not a published directory: unexpected end of data"):
        SealedArchive(store, key, bid)  # every file's extent is read at the opening


def test_sealedArchive_opensABlobOfTheFirstFormat_whole(tmp_path: Path) -> None:
    store, key, bid = _v1_blob(tmp_path)
    with SealedArchive(store, key, bid) as archive:
        assert archive.sealed is None and archive.names() == ["log/step-000000001.bin", "manifest.json"]
        path = archive.extract("log/step-000000001.bin", tmp_path / "out")
    assert path.read_bytes() == bytes(range(256)) * 4
