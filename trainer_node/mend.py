"""A trainer's transcript that no longer proves what it committed: found, and mended from the store.

Why a module of its own: after its commit a trainer needs its transcript for one thing, the leaves
it reveals with their Merkle proofs when a game asks for them. A workdir whose copy was lost or
damaged (a disk that filled or failed, a crash before the files reached it, a stray edit) stopped
the node for good, with no hint, even for finalize and withdraw, which need no transcript. The
trainer published the very bytes it committed (the on-chain ``transcriptId`` is the sealed blob's
id), so the store holds a copy that can be held to the chain and put in place of the damaged one.

:func:`transcript_problem` says why a directory cannot prove the committed leaves (None when it
can); :func:`restore_from_store` fetches the committed blob into a directory of its own and gives
it the transcript's name only once it proves them. Neither raises for damage: the agent decides
what to do with the answer (see :meth:`trainer_node.agent.TrainerAgent.step`).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from game.chain.types import Task
from game.errors import VGameError
from game.fsio import fsync_dir
from game.merkle import MerkleTree
from game.store.archive import fetch_directory
from game.store.blobs import BlobStore
from game.store.sealing import StoreError
from game.training.transcript.reader import Transcript

log = logging.getLogger(__name__)

#: The name a transcript is fetched under, beside the damaged one, until it proves the commitment.
RESTORING_PREFIX = ".restoring-"


class _NotCommitted(VGameError):
    """A whole transcript, but not the one committed."""


def committed_tree(directory: Path, task: Task) -> MerkleTree:
    """The Merkle tree of the leaves in ``directory``, once they are known to be the ones ``task``
    committed to; a :class:`~game.errors.VGameError` or :class:`OSError` says why they are not."""
    t = Transcript(directory)  # a missing directory or manifest, or a garbled one, raises here
    if not t.manifest.complete:
        raise _NotCommitted(f"{directory} holds an unfinished transcript ({len(t.leaves())} leaves)")
    tree = MerkleTree(t.leaves())
    if tree.size != task.num_leaves or tree.root != task.state_root:
        raise _NotCommitted(
            f"the {tree.size} leaves in {directory} have root {tree.root.hex()[:16]}..., not the committed "
            f"{task.num_leaves} leaves with root {task.state_root.hex()[:16]}..."
        )
    return tree


def transcript_problem(directory: Path, task: Task) -> str | None:
    """Why the transcript in ``directory`` cannot prove the leaves ``task`` committed to (missing,
    unfinished, unreadable, or other leaves), or None when it can."""
    try:
        committed_tree(directory, task)
    except (VGameError, OSError, ValueError) as exc:
        return str(exc)
    return None


def restore_from_store(store: BlobStore, key: bytes, task: Task, directory: Path) -> str | None:
    """Put the committed transcript (the blob ``task.transcript_id``) in place of ``directory``.

    The blob is fetched and authenticated into a directory of its own beside it, held to the
    commitment, and only then takes the name (the damaged copy is deleted: the store keeps the
    bytes). Returns None when the transcript is in place, else why it could not be restored; the
    damaged copy is then left as it was."""
    tmp = directory.with_name(RESTORING_PREFIX + directory.name)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        fetch_directory(store, key, task.transcript_id, tmp)
    except StoreError as exc:  # not there (BlobNotFound), corrupt, or not under this key
        shutil.rmtree(tmp, ignore_errors=True)
        return f"the store at {store.root} does not give it back: {exc}"
    problem = transcript_problem(tmp, task)
    if problem is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"the store's copy does not prove the commitment either: {problem}"
    if directory.is_dir():
        shutil.rmtree(directory)
    else:
        directory.unlink(missing_ok=True)  # a file where the directory was
    tmp.rename(directory)
    fsync_dir(directory.parent)
    log.info("restored the committed transcript into %s from the store", directory)
    return None


__all__ = ["RESTORING_PREFIX", "committed_tree", "restore_from_store", "transcript_problem"]
