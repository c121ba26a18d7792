"""Content-addressed, encrypted blob store for transcripts and client data.

Why: the trainer's transcript (checkpoints, rounding log) and the client's data must reach the
auditor and the judge through a store that may be shared or public, while only hashes go on-chain.
So every blob is sealed with AES-256-GCM under a key the client hands to trainer, auditor and judge,
and addressed by the SHA-256 of the *sealed* bytes: anyone can check integrity, only key holders
can read. A local directory is the default store; anything that maps hash -> bytes can replace it.

Sealed layout: ``b"vgame-blob-v1\\0" || nonce (12 bytes) || AES-GCM ciphertext+tag``; the
associated data binds the blob to its purpose (e.g. ``b"transcript"``), so a blob cannot be
replayed as another kind.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import tarfile
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from game.errors import VGameError
from game.fsio import atomic_write

MAGIC = b"vgame-blob-v1\0"
NONCE_SIZE = 12
KEY_SIZE = 32


class StoreError(VGameError, ValueError):
    """A blob is missing, modified, or cannot be opened with the given key."""


class BlobNotFound(StoreError):
    """No blob of that id in the store (yet: a store synced between machines may lag the chain)."""


def new_key() -> bytes:
    """A fresh random 256-bit data key (the client makes one per task)."""
    return secrets.token_bytes(KEY_SIZE)


def parse_key(text: str) -> bytes:
    """Parse a key given as 64 hex characters (optionally 0x-prefixed)."""
    t = text.strip().removeprefix("0x")
    try:
        key = bytes.fromhex(t)
    except ValueError:
        raise StoreError("a data key must be 64 hex characters (256 bits)") from None
    if len(key) != KEY_SIZE:
        raise StoreError(f"a data key must be {KEY_SIZE} bytes (64 hex characters), got {len(key)} bytes")
    return key


def seal(key: bytes, plaintext: bytes, purpose: bytes) -> bytes:
    """Encrypt and authenticate ``plaintext`` for ``purpose`` under ``key``."""
    nonce = secrets.token_bytes(NONCE_SIZE)
    return MAGIC + nonce + AESGCM(key).encrypt(nonce, plaintext, MAGIC + purpose)


def unseal(key: bytes, blob: bytes, purpose: bytes) -> bytes:
    """Decrypt a sealed blob; a wrong key, another purpose or any modified byte is a StoreError."""
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + NONCE_SIZE + 16:
        raise StoreError("not a vgame blob (bad header or too short)")
    nonce = blob[len(MAGIC) : len(MAGIC) + NONCE_SIZE]
    try:
        return AESGCM(key).decrypt(nonce, blob[len(MAGIC) + NONCE_SIZE :], MAGIC + purpose)
    except InvalidTag:
        raise StoreError(
            f"cannot open {purpose.decode(errors='replace')} blob: wrong key or the blob was modified"
        ) from None


def blob_id(blob: bytes) -> bytes:
    """Content address of a blob: SHA-256 of its (sealed) bytes."""
    return hashlib.sha256(blob).digest()


class BlobStore:
    """A directory of blobs named by the hex SHA-256 of their bytes; writes are atomic."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, bid: bytes) -> Path:
        h = bid.hex()
        return self.root / h[:2] / h

    def put(self, blob: bytes) -> bytes:
        bid = blob_id(blob)
        dest = self.path(bid)
        if dest.exists():
            return bid
        atomic_write(dest, blob)
        return bid

    def get(self, bid: bytes) -> bytes:
        p = self.path(bid)
        if not p.exists():
            raise BlobNotFound(f"blob {bid.hex()} not found in store {self.root}")
        blob = p.read_bytes()
        if blob_id(blob) != bid:
            raise StoreError(f"blob {bid.hex()} in store {self.root} is corrupt (hash mismatch)")
        return blob


def pack_directory(src: Path) -> bytes:
    """A deterministic tar of a directory (sorted names, zeroed times and owners)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(q for q in Path(src).rglob("*") if q.is_file()):
            rel = p.relative_to(src).as_posix()
            if rel.startswith(".") or "/." in rel:
                continue  # temp files of an interrupted writer are not part of the transcript
            info = tarfile.TarInfo(rel)
            data = p.read_bytes()
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def unpack_directory(data: bytes, dest: Path) -> None:
    """Extract a tar made by :func:`pack_directory`, refusing links and paths outside ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for m in tar.getmembers():
            if not m.isfile():
                raise StoreError(f"transcript archive holds a non-file entry {m.name!r}")
        tar.extractall(dest, filter="data")


def publish_directory(store: BlobStore, key: bytes, src: Path, purpose: bytes = b"transcript") -> bytes:
    """Seal a directory into the store; returns its blob id (what goes on-chain)."""
    return store.put(seal(key, pack_directory(src), purpose))


def fetch_directory(
    store: BlobStore, key: bytes, bid: bytes, dest: Path, purpose: bytes = b"transcript"
) -> Path:
    """Fetch, verify, decrypt and unpack a published directory into ``dest``."""
    unpack_directory(unseal(key, store.get(bid), purpose), dest)
    return dest
