"""The typed client of the VerificationGame contract: one method per contract function.

Its views and event scans are :class:`~game.chain.views.GameViews`'s, the base it builds on; this
module holds the transactions, each with its pre-check, and what the pre-checks share.

Transactions are pre-checked against the state read from the chain, in the contract's own check
order, and refused with the very exception class the contract would revert with, so a caller
learns the reason without paying gas. What a pre-check cannot know for sure (conditions that hinge
on the next block's timestamp, like ``ClockRunning`` or ``WindowOpen``) is left to the gas
estimate, which reverts just as freely and is decoded into the same classes.
``prechecks=False`` sends anyway (tests use it to reach the contract's own reverts), and
``fixed_gas`` skips the estimate too, so a doomed call is mined, paid for and decoded.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3

from game import chunkleaf, clock
from game.chain import errors as E
from game.chain.address import checked_address
from game.chain.base import Chain
from game.chain.calls import send_function
from game.chain.tx import TxSender
from game.chain.types import Game, Outcome, Phase, Task, TaskStatus, TxReceipt
from game.chain.views import ClientOptions, GameHandle, GameViews
from game.merkle import InclusionProof, MerkleTree, verify_proof

log = logging.getLogger(__name__)

ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
MAX_PROOF_LENGTH = 64  # the contract's bound on proof length (MerkleProof.sol)
MAX_LEAVES = 2**48  # the contract's bound on a task's leaf count (VerificationGame.MAX_LEAVES)
MAX_DURATION = 30 * 86_400  # the contract's bound on every clock and window (VerificationGame.MAX_DURATION)

ProofLike = InclusionProof | Sequence[bytes]


class VerificationGameClient(GameViews):
    """One signer's client of one deployed game contract: the views and events of
    :class:`~game.chain.views.GameViews`, and one pre-checked method per transaction."""

    def __init__(
        self,
        chain: Chain,
        address: str,
        account: LocalAccount,
        *,
        options: ClientOptions | None = None,
        prechecks: bool | None = None,
    ) -> None:
        opts = options or ClientOptions()
        if prechecks is not None:
            opts = replace(opts, prechecks=prechecks)
        super().__init__(chain, address, account, options=opts)
        self.sender = TxSender(chain, opts.policy)

    # ------------------------------------------------------------ variants
    def as_account(self, account: LocalAccount) -> VerificationGameClient:
        """The same contract and options, signing as ``account``."""
        return self._variant(account, self.options)

    def with_options(self, **changes: Any) -> VerificationGameClient:
        """A copy with some :class:`ClientOptions` changed (e.g. ``prechecks=False``)."""
        return self._variant(self.account, replace(self.options, **changes))

    def _variant(self, account: LocalAccount, options: ClientOptions) -> VerificationGameClient:
        other = VerificationGameClient(self.chain, self.address, account, options=options)
        other._deployed_in_block = self._deployed_in_block  # the same contract: read once
        return other

    # --------------------------------------------------------- transactions
    def create_task(
        self,
        spec_hash: bytes,
        trainer: str,
        judge: str,
        *,
        key_hash: bytes,
        num_leaves: int,
        payment: int,
        trainer_bond: int,
        auditor_bond: int,
        clock_allowance: int,
        challenge_window: int,
        judge_window: int,
        commit_window: int,
    ) -> TxReceipt:
        """Client: post a task and escrow ``payment``; ``receipt.result`` is the new task id.

        ``key_hash`` is the data key's hash (:func:`game.store.keys.key_hash`), ``num_leaves`` the
        leaf count the trainer must commit: the task's steps + 1
        (:attr:`TaskConfig.num_leaves <game.training.task.config.TaskConfig.num_leaves>`).
        """

        def check() -> None:
            if payment == 0:
                raise E.ZeroPayment()
            if ZERO_ADDRESS in (trainer, judge) or trainer.lower() == judge.lower():
                raise E.InvalidRoles(trainer, judge)
            if 0 in (trainer_bond, auditor_bond):
                raise E.InvalidBonds(trainer_bond, auditor_bond)
            durations = (clock_allowance, challenge_window, judge_window, commit_window)
            if not all(0 < d <= MAX_DURATION for d in durations):
                raise E.InvalidDurations(*durations)
            if not 2 <= num_leaves <= MAX_LEAVES:
                raise E.InvalidLeafCount(num_leaves)

        args = [
            spec_hash,
            key_hash,
            checked_address(trainer, "trainer"),
            checked_address(judge, "judge"),
            num_leaves,
            trainer_bond,
            auditor_bond,
            clock_allowance,
            challenge_window,
            judge_window,
            commit_window,
        ]
        return self._transact("createTask", args, payment, check, result=("TaskCreated", "task_id"))

    def accept(self, task_id: int, *, bond: int | None = None) -> TxReceipt:
        """Trainer: lock an open task before training, posting the bond (read from the task by
        default); from then on the client cannot cancel until the commit window has passed."""
        task = self.task(task_id) if bond is None or self.options.prechecks else None
        value = bond if bond is not None else task.trainer_bond  # type: ignore[union-attr]

        def check() -> None:
            assert task is not None
            if task.status != TaskStatus.OPEN:
                raise E.WrongTaskStatus(task_id, task.status)
            self._require_caller(task.trainer)
            if value != task.trainer_bond:
                raise E.WrongBond(value, task.trainer_bond)

        return self._transact("accept", [task_id], value, check)

    def cancel(self, task_id: int) -> TxReceipt:
        """Client: withdraw a task nobody committed to: an open one (the payment is credited back),
        or an accepted one whose trainer let its commit window pass (the payment and its bond)."""

        def check() -> None:
            t = self.task(task_id)
            if t.status not in (TaskStatus.OPEN, TaskStatus.ACCEPTED):
                raise E.WrongTaskStatus(task_id, t.status)
            self._require_caller(t.client)
            # the cancel needs block.timestamp > commitBy: certainly too early unless the next block may be past it
            if t.status == TaskStatus.ACCEPTED and not clock.clock_ran_out(self.chain.now(), t.commit_by):
                raise E.CommitWindowOpen(task_id, t.commit_by)

        return self._transact("cancel", [task_id], 0, check)

    def commit(
        self,
        task_id: int,
        state_root: bytes,
        log_root: bytes,
        num_leaves: int,
        transcript_id: bytes,
        first_leaf: bytes,
        first_proof: ProofLike,
        last_leaf: bytes,
        last_proof: ProofLike,
    ) -> TxReceipt:
        """Trainer: commit the state root (and log root) of an accepted task (bonded at the accept)."""
        first = _siblings(first_proof)
        last = _siblings(last_proof)

        def check() -> None:
            task = self.task(task_id)
            if task.status != TaskStatus.ACCEPTED:
                raise E.WrongTaskStatus(task_id, task.status)
            self._require_caller(task.trainer)
            if not clock.move_in_time(self.chain.now(), task.commit_by):
                raise E.CommitWindowClosed(task_id, task.commit_by)
            if num_leaves != task.num_leaves:
                raise E.LeafCountMismatch(task.num_leaves, num_leaves)
            for index, leaf, proof in ((0, first_leaf, first), (num_leaves - 1, last_leaf, last)):
                if not _proof_ok(state_root, index, num_leaves, leaf, proof):
                    raise E.InvalidProof(index, leaf)

        args = [task_id, state_root, log_root, num_leaves, transcript_id, first_leaf, first, last_leaf, last]
        return self._transact("commit", args, 0, check)

    def commit_tree(
        self,
        task_id: int,
        tree: MerkleTree,
        log_root: bytes,
        transcript_id: bytes,
    ) -> TxReceipt:
        """Trainer: :meth:`commit` the whole state tree (proofs of the first and last leaf built here)."""
        n = tree.size
        return self.commit(
            task_id,
            tree.root,
            log_root,
            n,
            transcript_id,
            tree.leaf(0),
            tree.proof(0),
            tree.leaf(n - 1),
            tree.proof(n - 1),
        )

    def challenge(self, task_id: int, dispute_init: bool = False, *, bond: int | None = None) -> TxReceipt:
        """Auditor: open a game against the commitment; ``receipt.result`` is the game id."""
        task = self.task(task_id) if bond is None or self.options.prechecks else None
        value = bond if bond is not None else task.auditor_bond  # type: ignore[union-attr]

        def check() -> None:
            assert task is not None
            self._check_challenger(task_id, task, value)

        return self._transact(
            "challenge", [task_id, dispute_init], value, check, result=("Challenged", "game_id")
        )

    def challenge_data(
        self, task_id: int, index: int, piece: int = 0, *, bond: int | None = None
    ) -> TxReceipt:
        """Auditor: an availability challenge demanding piece ``piece`` of log chunk ``index``
        (:data:`game.chunkleaf.PIECE_BYTES` bytes each), which the trainer must post on-chain within
        its clock (:meth:`provide_data`) or lose; ``receipt.result`` is the game id. Any piece
        number is accepted: the contract reduces it modulo the chunk's piece count (once an answer
        has made the count known; else the answer does). A piece posted already is refused by the
        contract (``DataAlreadyProvided``: the gas estimate says so, for free)."""
        task = self.task(task_id) if bond is None or self.options.prechecks else None
        value = bond if bond is not None else task.auditor_bond  # type: ignore[union-attr]

        def check() -> None:
            assert task is not None
            self._check_challenger(task_id, task, value)
            if not 0 <= index < task.num_leaves:
                raise E.DataIndexOutOfRange(index, task.num_leaves)

        return self._transact(
            "challengeData", [task_id, index, piece], value, check, result=("Challenged", "game_id")
        )

    def reveal(self, game_id: int, leaf: bytes, proof: ProofLike) -> TxReceipt:
        """Trainer: reveal leaf ``mid`` of the game's interval with its proof."""
        siblings = _siblings(proof)

        def check() -> None:
            g = self.game(game_id)
            t = self.task(g.task_id)
            self._check_turn(game_id, g, Phase.AWAITING_REVEAL, t.trainer)
            self._check_clock(game_id, clock.deadline_of(g.last_move_at, g.trainer_clock))
            if not _proof_ok(t.state_root, g.mid, t.num_leaves, leaf, siblings):
                raise E.InvalidProof(g.mid, leaf)

        return self._transact("reveal", [game_id, leaf, siblings], 0, check)

    def respond(self, game_id: int, agree: bool) -> TxReceipt:
        """Auditor: agree (``lo = mid``) or disagree (``hi = mid``) with the revealed leaf."""

        def check() -> None:
            g = self.game(game_id)
            self._check_turn(game_id, g, Phase.AWAITING_RESPONSE, g.auditor)
            self._check_clock(game_id, clock.deadline_of(g.last_move_at, g.auditor_clock))

        return self._transact("respond", [game_id, agree], 0, check)

    def rule(self, game_id: int, computed_post_state: bytes) -> TxReceipt:
        """Judge: post the post-state hash of the pinned step as re-computed."""

        def check() -> None:
            g = self.game(game_id)
            t = self.task(g.task_id)
            self._check_turn(game_id, g, Phase.PINNED, t.judge)
            self._check_clock(game_id, clock.deadline_of(g.last_move_at, t.judge_window))

        return self._transact("rule", [game_id, computed_post_state], 0, check)

    def provide_data(self, game_id: int, chunk: bytes, proof: ProofLike) -> TxReceipt:
        """Trainer: answer an availability challenge from the whole demanded log chunk and the proof
        of its leaf in the log tree (leaf data: :func:`game.chunkleaf.chunk_leaf`). Only the piece
        the game demands is posted (:func:`game.chunkleaf.answer`: the chunk's length and piece
        root, the piece, and its proof in the chunk's piece tree), so a chunk of any size is
        answered in one transaction a pool accepts."""
        siblings = _siblings(proof)
        g = self.game(game_id)  # the piece demanded, read whether or not the call is pre-checked
        answer = chunkleaf.answer(chunk, g.piece)
        piece_siblings = _siblings(answer.proof)

        def check() -> None:
            t = self.task(g.task_id)
            self._check_turn(game_id, g, Phase.AWAITING_DATA, t.trainer)
            self._check_clock(game_id, clock.deadline_of(g.last_move_at, g.trainer_clock))
            leaf = chunkleaf.leaf_of_parts(answer.length, answer.piece_root)
            if not _proof_ok(t.log_root, g.lo, t.num_leaves, leaf, siblings):
                raise E.InvalidProof(g.lo, leaf)
            piece_hash = hashlib.sha256(answer.data).digest()
            count = chunkleaf.piece_count(answer.length)
            if not _proof_ok(answer.piece_root, answer.piece, count, piece_hash, piece_siblings):
                raise E.InvalidPieceProof(g.lo, answer.piece, piece_hash)

        args = [game_id, answer.length, answer.piece_root, answer.data, piece_siblings, siblings]
        return self._transact("provideData", args, 0, check)

    def timeout(self, game_id: int) -> TxReceipt:
        """Anyone: end a game whose mover (or judge) ran out of time."""

        def check() -> None:
            g = self.game(game_id)
            if g.phase == Phase.ENDED:
                raise E.GameOver(game_id, g.outcome)
            # ClockRunning hinges on the next block's timestamp: the estimate settles it, for free

        return self._transact("timeout", [game_id], 0, check)

    def finalize(self, task_id: int) -> TxReceipt:
        """Anyone: settle a task after its window, once all its games ended."""

        def check() -> None:
            t = self.task(task_id)
            if t.status != TaskStatus.COMMITTED:
                raise E.WrongTaskStatus(task_id, t.status)
            # WindowOpen hinges on the next block's timestamp (left to the estimate); GamesLive is
            # only certain once the window has surely closed, because the contract checks it second
            if t.live_games and clock.finalize_in_time(self.chain.now(), t.window_ends):
                raise E.GamesLive(task_id, t.live_games)

        return self._transact("finalize", [task_id], 0, check)

    def claim_reward(self, game_id: int) -> TxReceipt:
        """Anyone: credit the auditor of a game it won its share of the trainer's forfeited bond,
        once the task is finalized."""

        def check() -> None:
            g = self.game(game_id)
            if g.outcome != Outcome.AUDITOR_WON:
                raise E.NoReward(game_id, g.outcome)
            t = self.task(g.task_id)
            if t.status != TaskStatus.FINALIZED:
                raise E.WrongTaskStatus(g.task_id, t.status)
            if g.reward_claimed:
                raise E.RewardAlreadyClaimed(game_id)

        return self._transact("claimReward", [game_id], 0, check)

    def withdraw(self) -> TxReceipt:
        """Anyone: collect this account's credit."""

        def check() -> None:
            if self.credit() == 0:
                raise E.NothingToWithdraw(self.me)

        return self._transact("withdraw", [], 0, check)

    # ------------------------------------------------------------ internals
    def _require_caller(self, expected: str) -> None:
        if self.me.lower() != expected.lower():
            raise E.Unauthorized(self.me, Web3.to_checksum_address(expected))

    def _check_challenger(self, task_id: int, task: Task, value: int) -> None:
        """The contract's ``_checkChallenger``: status, window, role, bond."""
        if task.status != TaskStatus.COMMITTED:
            raise E.WrongTaskStatus(task_id, task.status)
        if not clock.challenge_in_time(self.chain.now(), task.window_ends):
            raise E.WindowClosed(task_id, task.window_ends)
        if self.me.lower() in (task.trainer.lower(), task.judge.lower()):
            raise E.ChallengerNotAllowed(self.me)
        if value != task.auditor_bond:
            raise E.WrongBond(value, task.auditor_bond)

    def _check_turn(self, game_id: int, g: Game, expected: Phase, mover: str) -> None:
        """The contract's ``_checkTurn``: ended, then phase, then caller."""
        if g.phase == Phase.ENDED:
            raise E.GameOver(game_id, g.outcome)
        if g.phase != expected:
            raise E.NotYourTurn(game_id, g.phase)
        self._require_caller(mover)

    def _check_clock(self, game_id: int, deadline: int) -> None:
        # the move lands in a block at least one second after the latest: certainly too late if so
        if not clock.move_in_time(self.chain.now(), deadline):
            raise E.ClockExpired(game_id, deadline)

    def _transact(
        self,
        fn: str,
        args: list[Any],
        value: int,
        check: Callable[[], None] | None,
        *,
        result: tuple[str, str] | None = None,
    ) -> TxReceipt:
        if self.options.prechecks and check is not None:
            check()
        out = send_function(
            self.sender, self.account, self.contract, self.events, fn, args, value,
            gas=self.options.fixed_gas, result=result,
        )  # fmt: skip
        log.debug("%s(%s) by %s: gas %d", fn, args, self.me, out.gas_used)
        return out


def _siblings(proof: ProofLike) -> list[bytes]:
    if isinstance(proof, InclusionProof):
        return [bytes(s) for s in proof.siblings]
    return [bytes(s) for s in proof]


def _proof_ok(root: bytes, index: int, size: int, leaf: bytes, siblings: list[bytes]) -> bool:
    """The contract's ``MerkleProof.verify``, locally (same tree: ``game.merkle``)."""
    if not 0 <= index < size or len(siblings) > MAX_PROOF_LENGTH or len(leaf) != 32:
        return False
    return verify_proof(root, leaf, InclusionProof(index=index, size=size, siblings=tuple(siblings)))


__all__ = [
    "MAX_DURATION",
    "MAX_LEAVES",
    "MAX_PROOF_LENGTH",
    "ZERO_ADDRESS",
    "ClientOptions",
    "GameHandle",
    "ProofLike",
    "VerificationGameClient",
]
