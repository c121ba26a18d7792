"""The leaf-count bound is inclusive: ``MAX_LEAVES = 2^48`` leaves are committed and played to a
ruling, a task of ``2^48 + 1`` is refused (InvalidLeafCount), and so is a commitment of ``2^48 + 1`` to a task
of ``2^48`` (LeafCountMismatch), though its proofs verify.

The trees are the project's (game/merkle.py) built level by level over *runs* of equal leaves, so a
tree of 2^48 leaves takes a few hundred hashes: a level is a list of (node hash, count) runs, and
pairing two runs of equal nodes gives a run of equal parents. Only the nodes where runs meet differ.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence

import pytest

from game import chunkleaf
from game.chunkleaf import chunk_leaf
from game.merkle import MerkleTree, leaf_hash, node_hash
from tests.contracts.driver import (
    ANSWERED,
    AUDITOR_BOND,
    AUDITOR_WON,
    COMMITTED,
    FINALIZED,
    PAYMENT,
    PINNED,
    TRAINER_WON,
    Env,
)

MAX_LEAVES = 2**48
GOOD = hashlib.sha256(b"good state").digest()
BAD = hashlib.sha256(b"bad state").digest()
# The first wrong leaf of a liar's run: far from both ends and from every power of two.
DIVERGE = 2**47 + 2**31 + 12_345


class RunTree:
    """``MerkleTree`` of ``sum(counts)`` leaves given as runs ``(data, count)`` of equal data.

    Same tree, same proofs (a lone last node is promoted, adding no sibling), held as runs per level.
    """

    def __init__(self, runs: Sequence[tuple[bytes, int]]) -> None:
        self._data = self._merge([(d, c) for d, c in runs])
        self.size = sum(c for _, c in self._data)
        assert self.size > 0
        level = self._merge([(leaf_hash(d), c) for d, c in self._data])
        self._levels = [level]
        while sum(c for _, c in level) > 1:
            level = self._up(level)
            self._levels.append(level)

    @staticmethod
    def _merge(runs: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
        out: list[tuple[bytes, int]] = []
        for h, c in runs:
            if c == 0:
                continue
            if out and out[-1][0] == h:
                out[-1] = (h, out[-1][1] + c)
            else:
                out.append((h, c))
        return out

    @classmethod
    def _up(cls, level: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
        out: list[tuple[bytes, int]] = []
        waiting: bytes | None = None  # a left node whose right partner starts the next run
        for h, c in level:
            if waiting is not None:
                out.append((node_hash(waiting, h), 1))
                waiting, c = None, c - 1
            if c >= 2:
                out.append((node_hash(h, h), c // 2))
            if c % 2:
                waiting = h
        if waiting is not None:
            out.append((waiting, 1))  # the lone last node is promoted
        return cls._merge(out)

    @staticmethod
    def _at(runs: list[tuple[bytes, int]], index: int) -> bytes:
        for h, c in runs:
            if index < c:
                return h
            index -= c
        raise IndexError(index)

    @property
    def root(self) -> bytes:
        return self._levels[-1][0][0]

    def leaf(self, index: int) -> bytes:
        assert 0 <= index < self.size
        return self._at(self._data, index)

    def siblings(self, index: int) -> list[bytes]:
        assert 0 <= index < self.size
        out, pos = [], index
        for level in self._levels[:-1]:
            sib = pos ^ 1
            if sib < sum(c for _, c in level):
                out.append(self._at(level, sib))
            pos >>= 1
        return out


def test_runTree_isTheProjectsTree() -> None:
    """Root, leaves and every proof equal game/merkle.py's for small trees of one to three runs."""
    a, b, c = (hashlib.sha256(bytes([i])).digest() for i in range(3))
    cases = [[(a, n)] for n in range(1, 20)]
    cases += [[(a, s), (b, n - s)] for n in range(2, 34) for s in range(1, n)]
    cases += [[(a, 3), (b, 5), (c, 9)], [(a, 1), (b, 1), (c, 1), (a, 6)], [(a, 16), (b, 0), (c, 17)]]
    for runs in cases:
        data = list(itertools.chain.from_iterable([d] * k for d, k in runs))
        tree, rt = MerkleTree(data), RunTree(runs)
        assert (rt.size, rt.root) == (tree.size, tree.root), runs
        for i in range(tree.size):
            assert rt.leaf(i) == tree.leaf(i)
            assert rt.siblings(i) == list(tree.proof(i).siblings), (runs, i)


def _commit_fn(env: Env, task: int, tree: RunTree, num_leaves: int, log_root: bytes | None = None) -> object:
    last = tree.size - 1
    return env.game.functions.commit(
        task,
        tree.root,
        hashlib.sha256(b"log").digest() if log_root is None else log_root,
        num_leaves,
        hashlib.sha256(b"transcript").digest(),
        tree.leaf(0),
        tree.siblings(0),
        tree.leaf(last),
        tree.siblings(last),
    )


@pytest.mark.parametrize("liar", ["trainer", "auditor"])
def test_maxLeaves_committedAndPlayedToARuling(env: Env, liar: str) -> None:
    """N = 2^48 (the bound itself): committed, bisected in 48 rounds to the first step the two sides
    disagree on, ruled for the honest side, and settled."""
    assert env.game.functions.MAX_LEAVES().call() == MAX_LEAVES
    honest = RunTree([(GOOD, MAX_LEAVES)])
    lying = RunTree([(GOOD, DIVERGE), (BAD, MAX_LEAVES - DIVERGE)])
    trainer, auditor = (lying, honest) if liar == "trainer" else (honest, lying)
    assert len(trainer.siblings(MAX_LEAVES - 1)) == 48

    task = env.create_task(MAX_LEAVES)
    ev = env.event(env.send(_commit_fn(env, task, trainer, MAX_LEAVES), env.trainer), "Committed")
    assert (ev["numLeaves"], ev["stateRoot"]) == (MAX_LEAVES, trainer.root)
    t = env.task(task)
    assert (t.status, t.numLeaves, t.lastLeaf) == (COMMITTED, MAX_LEAVES, trainer.leaf(MAX_LEAVES - 1))

    game_id = env.challenge(task, env.auditors[0])
    g = env.game_state(game_id)
    assert (g.lo, g.hi) == (0, MAX_LEAVES - 1)
    rounds = 0
    while env.game_state(game_id).phase != PINNED:
        mid = env.mid(game_id)
        env.send(env.game.functions.reveal(game_id, trainer.leaf(mid), trainer.siblings(mid)), env.trainer)
        env.respond(game_id, trainer.leaf(mid) == auditor.leaf(mid))
        rounds += 1
    assert rounds == 48
    g = env.game_state(game_id)
    assert (g.lo, g.hi) == (DIVERGE - 1, DIVERGE)
    assert (g.loLeaf, g.hiLeaf) == (GOOD, trainer.leaf(DIVERGE))

    # The judge re-runs step DIVERGE from the agreed GOOD state and gets GOOD.
    ev = env.event(env.rule(game_id, GOOD), "GameEnded")
    assert ev["outcome"] == (AUDITOR_WON if liar == "trainer" else TRAINER_WON)
    env.at(max(env.now() + 1, env.task(task).windowEnds))
    paid = env.event(env.finalize(task), "TaskFinalized")["trainerPaid"]
    assert paid is (liar == "auditor") and env.task(task).status == FINALIZED
    if liar == "trainer":
        assert env.credit(env.client) == PAYMENT
    assert env.solvent()


def test_maxLeavesPlusOne_refused_thoughItsProofsVerify(env: Env) -> None:
    tree = RunTree([(GOOD, MAX_LEAVES + 1)])
    n = tree.size
    verify = env.game.functions.verifyLeaf
    assert verify(tree.root, 0, n, tree.leaf(0), tree.siblings(0)).call()
    assert verify(tree.root, n - 1, n, tree.leaf(n - 1), tree.siblings(n - 1)).call()
    # no task can ask for more than MAX_LEAVES leaves ...
    assert env.reverts(env.create_task_fn(MAX_LEAVES + 1), env.client, PAYMENT) == (
        "InvalidLeafCount",
        (MAX_LEAVES + 1,),
    )
    # ... and a task of MAX_LEAVES refuses one more, though its proofs verify
    task = env.create_task(MAX_LEAVES)
    assert env.reverts(_commit_fn(env, task, tree, n), env.trainer) == (
        "LeafCountMismatch",
        (MAX_LEAVES, MAX_LEAVES + 1),
    )


def test_maxLeaves_lastChunkDemanded_andPosted(env: Env) -> None:
    """An availability challenge of chunk 2^48 - 1 (the last step of the largest task) is answered
    with a 48-sibling proof into the log tree; chunk 2^48 does not exist."""
    state = RunTree([(GOOD, MAX_LEAVES)])
    chunk = b"the rounding log of the last step"
    log_tree = RunTree([(chunk_leaf(b"an earlier chunk"), MAX_LEAVES - 1), (chunk_leaf(chunk), 1)])
    task = env.create_task(MAX_LEAVES)
    env.send(_commit_fn(env, task, state, MAX_LEAVES, log_tree.root), env.trainer)
    assert env.reverts(
        env.game.functions.challengeData(task, MAX_LEAVES, 0), env.auditors[0], AUDITOR_BOND
    ) == (
        "DataIndexOutOfRange",
        (MAX_LEAVES, MAX_LEAVES),
    )
    game_id = env.challenge_data(task, env.auditors[0], MAX_LEAVES - 1)
    assert env.game_state(game_id).lo == MAX_LEAVES - 1
    proof = log_tree.siblings(MAX_LEAVES - 1)
    assert len(proof) == 48
    answer = chunkleaf.answer(chunk, 0)
    fn = env.game.functions.provideData(game_id, len(chunk), answer.piece_root, chunk, [], proof)
    ev = env.event(env.send(fn, env.trainer), "DataProvided")
    assert (ev["index"], ev["piece"], ev["chunkLength"], ev["data"]) == (MAX_LEAVES - 1, 0, len(chunk), chunk)
    assert env.game_state(game_id).outcome == ANSWERED and env.credit(env.auditors[0]) == AUDITOR_BOND


def test_maxLeaves_longestChunk_aFullPieceWithTwo48SiblingProofs_isAnswered(env: Env) -> None:
    """The largest answer the contract can be asked for: a full piece of the longest chunk whose
    length fits 64 bits (about 1.5e14 pieces, all equal here: a 48-sibling piece proof), chunk
    2^48 - 1 of the largest task (a 48-sibling log proof). Its calldata stays under geth's 128 KiB
    pool limit, and the demand's piece number, below the piece count, is not reduced."""
    import random

    piece = random.Random(0).randbytes(chunkleaf.PIECE_BYTES)  # incompressible: the worst case for gas
    count = (2**64 - 1) // chunkleaf.PIECE_BYTES
    length = count * chunkleaf.PIECE_BYTES
    pieces = RunTree([(hashlib.sha256(piece).digest(), count)])
    leaf = chunkleaf.leaf_of_parts(length, pieces.root)
    log = RunTree([(chunk_leaf(b"an earlier chunk"), MAX_LEAVES - 1), (leaf, 1)])
    task = env.create_task(MAX_LEAVES)
    env.send(_commit_fn(env, task, RunTree([(GOOD, MAX_LEAVES)]), MAX_LEAVES, log.root), env.trainer)
    demanded = 2**32 - 1
    game_id = env.challenge_data(task, env.auditors[0], MAX_LEAVES - 1, piece=demanded)
    piece_proof, log_proof = pieces.siblings(demanded), log.siblings(MAX_LEAVES - 1)
    assert (len(piece_proof), len(log_proof)) == (48, 48)
    fn = env.game.functions.provideData(game_id, length, pieces.root, piece, piece_proof, log_proof)
    calldata = bytes.fromhex(fn._encode_transaction_data()[2:])
    assert len(calldata) == 126_244 and len(calldata) + 256 <= 128 * 1024
    receipt = env.send(fn, env.trainer)
    ev = env.event(receipt, "DataProvided")
    assert (ev["index"], ev["piece"], ev["chunkLength"], ev["data"]) == (
        MAX_LEAVES - 1,
        demanded,
        length,
        piece,
    )
    assert int(receipt["gasUsed"]) < 6_000_000, receipt["gasUsed"]
    print(f"provideData, longest proofs: {len(calldata)} bytes of calldata, {receipt['gasUsed']} gas")
