"""A thin, obvious driver of the game contract for its own tests.

Deliberately independent of ``game.chain``'s client and error decoder: these tests check the
contract against its ABI and ``docs/contract.md``, so they decode reverts and events themselves.
Only the chain backends (``game.chain.base``, ``game.chain.backends``) are shared, for time travel and snapshots.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import function_signature_to_4byte_selector
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractLogicError, Web3RPCError
from web3.logs import DISCARD

from game import chunkleaf
from game.chain.base import Chain
from game.chain.errors import Reverted, revert_data_of
from game.chunkleaf import chunk_leaf
from game.merkle import MerkleTree

ARTIFACTS = Path(__file__).resolve().parents[2] / "game" / "chain" / "artifacts"

# Enum values, as the contract numbers them (docs/contract.md "Types").
OPEN, ACCEPTED, COMMITTED, CANCELLED, FINALIZED = 1, 2, 3, 4, 5
AWAITING_REVEAL, AWAITING_RESPONSE, PINNED, AWAITING_DATA, ENDED = 1, 2, 3, 4, 5
TRAINER_WON, AUDITOR_WON, VOID, ANSWERED = 1, 2, 3, 4
RULING, TIMEOUT, JUDGE_TIMEOUT, DATA_PROVIDED = 1, 2, 3, 4

ETHER = 10**18
PAYMENT = 3 * ETHER
TRAINER_BOND = 2 * ETHER
AUDITOR_BOND = 1 * ETHER
CLOCK = 3_600
WINDOW = 86_400
JUDGE_WINDOW = 7_200
COMMIT_WINDOW = 7 * 86_400
MAX_DURATION = 30 * 86_400
SPEC = hashlib.sha256(b"spec").digest()
DATA_KEY = hashlib.sha256(b"the task's data key").digest()
KEY_HASH = hashlib.sha256(DATA_KEY).digest()


def chunks(n: int, tag: str = "log") -> list[bytes]:
    """``n`` log chunks of a few bytes each (their :func:`~game.chunkleaf.chunk_leaf` values are the
    log tree's leaves)."""
    return [f"{tag} chunk of step {i}".encode() * (1 + i % 3) for i in range(n)]


def log_tree(chunk_list: Sequence[bytes]) -> MerkleTree:
    """The log tree over the chunks' leaves (:func:`~game.chunkleaf.chunk_leaf`: the contract's logRoot)."""
    return MerkleTree([chunk_leaf(c) for c in chunk_list])


def artifact(name: str) -> dict[str, Any]:
    return dict(json.loads((ARTIFACTS / f"{name}.json").read_text()))


def leaves(n: int, tag: str = "honest", diverge_at: int | None = None) -> list[bytes]:
    """``n`` leaf hashes; with ``diverge_at`` every leaf from that index on differs (a liar's run)."""
    out = []
    for i in range(n):
        t = "liar" if diverge_at is not None and i >= diverge_at else tag
        out.append(hashlib.sha256(f"{t}/{i}".encode()).digest())
    return out


class ContractReverted(AssertionError):
    """A transaction the test expected to succeed reverted; carries the decoded custom error."""

    def __init__(self, name: str, args: tuple[Any, ...]) -> None:
        super().__init__(f"{name}{args}")
        self.name = name
        self.args_ = args


class ErrorTable:
    """Custom-error selector -> (name, ABI types), from the artifacts' ABIs."""

    def __init__(self, abis: Sequence[Sequence[dict[str, Any]]]) -> None:
        self.by_selector: dict[bytes, tuple[str, list[str]]] = {}
        for abi in abis:
            for e in abi:
                if e["type"] != "error":
                    continue
                types = [i["type"] for i in e["inputs"]]
                sel = bytes(function_signature_to_4byte_selector(f"{e['name']}({','.join(types)})"))
                self.by_selector[sel] = (e["name"], types)

    def decode(self, data: bytes) -> tuple[str, tuple[Any, ...]]:
        if len(data) < 4 or data[:4] not in self.by_selector:
            return ("<undecoded>", (data.hex(),))
        name, types = self.by_selector[data[:4]]
        values = abi_decode(types, data[4:])
        return name, tuple(
            Web3.to_checksum_address(v) if t == "address" else v for t, v in zip(types, values, strict=True)
        )


@dataclass
class Env:
    """A deployed game on one chain, the cast of accounts, and helpers to move and read it."""

    chain: Chain
    game: Contract
    harness: Contract
    rejecter: Contract
    reenterer: Contract
    errors: ErrorTable
    gas_used: list[int] = field(default_factory=list)

    # ------------------------------------------------------------------ cast
    @property
    def w3(self) -> Web3:
        return self.chain.w3

    @property
    def client(self) -> str:
        return self.chain.accounts[1].address

    @property
    def trainer(self) -> str:
        return self.chain.accounts[2].address

    @property
    def judge(self) -> str:
        return self.chain.accounts[3].address

    @property
    def auditors(self) -> list[str]:
        return [a.address for a in self.chain.accounts[4:8]]

    @property
    def outsider(self) -> str:
        return self.chain.accounts[8].address

    # ------------------------------------------------------------------ time
    def now(self) -> int:
        return self.chain.now()

    def at(self, ts: int) -> None:
        """Make the next transaction's block carry timestamp ``ts`` exactly."""
        now = self.now()
        assert ts > now, f"time only moves forward ({ts} <= {now})"
        if ts == now + 1:
            return  # every block is one second after its parent (conftest), nothing to do
        if self.chain.kind == "anvil":
            resp = self.w3.provider.make_request("evm_mine", [ts - 1])  # type: ignore[arg-type]
            assert "error" not in resp, resp
        else:
            # eth-tester mines a block at ts - 1
            self.chain.tester.time_travel(ts)  # type: ignore[attr-defined]
        assert self.now() == ts - 1

    # ------------------------------------------------------------ transacting
    def _tx(self, fn: Any, sender: str, value: int) -> dict[str, Any]:
        return {"from": sender, "to": fn.address, "data": fn._encode_transaction_data(), "value": value}

    def estimate(self, tx: dict[str, Any]) -> int:
        """Gas estimate in the *next* block's context (its timestamp matters to the game); raises
        :class:`Reverted`. anvil estimates against ``latest`` unless told ``pending``."""
        if self.chain.kind != "anvil":
            return self.chain.estimate_gas(tx)
        try:
            return int(self.w3.eth.estimate_gas(tx, "pending"))  # type: ignore[arg-type]
        except (ContractLogicError, Web3RPCError, ValueError) as exc:
            data = revert_data_of(exc)
            if data is None:
                raise
            raise Reverted(data) from exc

    def send(self, fn: Any, sender: str, value: int = 0) -> Any:
        """Send ``fn`` from ``sender``; return the receipt, raise :class:`ContractReverted` on a revert."""
        tx = self._tx(fn, sender, value)
        try:
            gas = self.estimate(tx)
        except Reverted as rev:
            raise ContractReverted(*self.errors.decode(rev.data)) from None
        tx["gas"] = gas + 100_000
        receipt = self.w3.eth.wait_for_transaction_receipt(self.w3.eth.send_transaction(tx))  # type: ignore[arg-type]
        assert receipt["status"] == 1, "estimate passed but the transaction reverted"
        self.gas_used.append(int(receipt["gasUsed"]))
        return receipt

    def reverts(self, fn: Any, sender: str, value: int = 0) -> tuple[str, tuple[Any, ...]]:
        """The decoded custom error ``fn`` reverts with (fails the test when it succeeds)."""
        try:
            self.estimate(self._tx(fn, sender, value))
        except Reverted as rev:
            return self.errors.decode(rev.data)
        raise AssertionError("expected a revert, the call would succeed")

    def events(self, receipt: Any, name: str) -> list[Any]:
        return [e["args"] for e in getattr(self.game.events, name)().process_receipt(receipt, errors=DISCARD)]

    def event(self, receipt: Any, name: str) -> Any:
        found = self.events(receipt, name)
        assert len(found) == 1, f"expected one {name}, got {len(found)}"
        return found[0]

    def event_names(self, receipt: Any) -> list[str]:
        """Names of the game's events in ``receipt``, in log order."""
        topics = {
            Web3.keccak(text=f"{e['name']}({','.join(i['type'] for i in e['inputs'])})"): e["name"]
            for e in self.game.abi
            if e["type"] == "event"
        }
        return [
            topics[bytes(log["topics"][0])]
            for log in receipt["logs"]
            if log["address"] == self.game.address and bytes(log["topics"][0]) in topics
        ]

    # ------------------------------------------------------------------ views
    def task(self, task_id: int) -> Any:
        return self.game.functions.task(task_id).call()

    def game_state(self, game_id: int) -> Any:
        return self.game.functions.game(game_id).call()

    def credit(self, account: str) -> int:
        return int(self.game.functions.credit(account).call())

    def balance(self) -> int:
        return int(self.w3.eth.get_balance(self.game.address))

    # ------------------------------------------------------------------ moves
    def create_task(
        self,
        num_leaves: int,
        *,
        payment: int = PAYMENT,
        trainer_bond: int = TRAINER_BOND,
        auditor_bond: int = AUDITOR_BOND,
        clock: int = CLOCK,
        window: int = WINDOW,
        judge_window: int = JUDGE_WINDOW,
        commit_window: int = COMMIT_WINDOW,
        spec: bytes = SPEC,
        judge: str | None = None,
        accept: bool = True,
    ) -> int:
        """A task whose trainer must commit exactly ``num_leaves`` leaves; returns its id. The trainer
        accepts it (posting its bond) unless ``accept`` is False."""
        fn = self.create_task_fn(
            num_leaves,
            trainer_bond=trainer_bond,
            auditor_bond=auditor_bond,
            clock=clock,
            window=window,
            judge_window=judge_window,
            commit_window=commit_window,
            spec=spec,
            judge=judge,
        )
        task_id = int(self.event(self.send(fn, self.client, payment), "TaskCreated")["taskId"])
        if accept:
            self.accept(task_id, trainer_bond)
        return task_id

    def create_task_fn(
        self,
        num_leaves: int,
        *,
        trainer_bond: int = TRAINER_BOND,
        auditor_bond: int = AUDITOR_BOND,
        clock: int = CLOCK,
        window: int = WINDOW,
        judge_window: int = JUDGE_WINDOW,
        commit_window: int = COMMIT_WINDOW,
        spec: bytes = SPEC,
        judge: str | None = None,
    ) -> Any:
        return self.game.functions.createTask(
            spec,
            KEY_HASH,
            self.trainer,
            judge or self.judge,
            num_leaves,
            trainer_bond,
            auditor_bond,
            clock,
            window,
            judge_window,
            commit_window,
        )

    def accept(self, task_id: int, bond: int = TRAINER_BOND) -> Any:
        return self.send(self.game.functions.accept(task_id), self.trainer, bond)

    def commit_fn(
        self,
        task_id: int,
        tree: MerkleTree,
        *,
        num_leaves: int | None = None,
        log_root: bytes | None = None,
    ) -> Any:
        n = tree.size
        return self.game.functions.commit(
            task_id,
            tree.root,
            log_tree(chunks(n)).root if log_root is None else log_root,
            n if num_leaves is None else num_leaves,
            hashlib.sha256(b"transcript").digest(),
            tree.leaf(0),
            list(tree.proof(0).siblings),
            tree.leaf(n - 1),
            list(tree.proof(n - 1).siblings),
        )

    def commit(self, task_id: int, tree: MerkleTree, *, log_root: bytes | None = None) -> Any:
        """The trainer commits ``tree``; the log root defaults to that of :func:`chunks` (``tree.size``)."""
        return self.send(self.commit_fn(task_id, tree, log_root=log_root), self.trainer)

    def challenge(
        self, task_id: int, auditor: str, dispute_init: bool = False, bond: int = AUDITOR_BOND
    ) -> int:
        receipt = self.send(self.game.functions.challenge(task_id, dispute_init), auditor, bond)
        return int(self.event(receipt, "Challenged")["gameId"])

    def challenge_data(
        self, task_id: int, auditor: str, index: int, bond: int = AUDITOR_BOND, piece: int = 0
    ) -> int:
        receipt = self.send(self.game.functions.challengeData(task_id, index, piece), auditor, bond)
        return int(self.event(receipt, "Challenged")["gameId"])

    def provide_data_fn(self, game_id: int, chunk_list: Sequence[bytes], data: bytes | None = None) -> Any:
        """The trainer's answer to availability game ``game_id`` from its chunks: the demanded piece
        of chunk ``lo`` with its proofs (``data`` overrides the piece sent, with the proofs of the
        real one)."""
        g = self.game_state(game_id)
        answer = chunkleaf.answer(chunk_list[g.lo], g.piece)
        return self.game.functions.provideData(
            game_id,
            answer.length,
            answer.piece_root,
            answer.data if data is None else data,
            list(answer.proof.siblings),
            list(log_tree(chunk_list).proof(g.lo).siblings),
        )

    def provide_data(self, game_id: int, chunk_list: Sequence[bytes]) -> Any:
        return self.send(self.provide_data_fn(game_id, chunk_list), self.trainer)

    def claim_reward(self, game_id: int, caller: str | None = None) -> Any:
        return self.send(self.game.functions.claimReward(game_id), caller or self.outsider)

    def burnt(self) -> int:
        return int(self.game.functions.burnt().call())

    def mid(self, game_id: int) -> int:
        g = self.game_state(game_id)
        return (g.lo + g.hi) // 2

    def reveal_fn(self, game_id: int, tree: MerkleTree, index: int | None = None) -> Any:
        i = self.mid(game_id) if index is None else index
        return self.game.functions.reveal(game_id, tree.leaf(i), list(tree.proof(i).siblings))

    def reveal(self, game_id: int, tree: MerkleTree) -> Any:
        return self.send(self.reveal_fn(game_id, tree), self.trainer)

    def respond(self, game_id: int, agree: bool, auditor: str | None = None) -> Any:
        who = auditor or self.game_state(game_id).auditor
        return self.send(self.game.functions.respond(game_id, agree), who)

    def bisect(self, game_id: int, trainer_tree: MerkleTree, auditor_leaves: Sequence[bytes]) -> int:
        """Play the game to the pin: the trainer reveals from its tree, the auditor agrees iff the
        revealed leaf equals its own. Returns the number of (reveal, respond) rounds."""
        rounds = 0
        while self.game_state(game_id).phase != PINNED:
            mid = self.mid(game_id)
            self.reveal(game_id, trainer_tree)
            self.respond(game_id, trainer_tree.leaf(mid) == auditor_leaves[mid])
            rounds += 1
        return rounds

    def rule(self, game_id: int, computed: bytes) -> Any:
        return self.send(self.game.functions.rule(game_id, computed), self.judge)

    def timeout(self, game_id: int, caller: str | None = None) -> Any:
        return self.send(self.game.functions.timeout(game_id), caller or self.outsider)

    def finalize(self, task_id: int) -> Any:
        return self.send(self.game.functions.finalize(task_id), self.outsider)

    def deadline(self, game_id: int) -> int:
        return int(self.game.functions.deadline(game_id).call())

    def clock_left(self, game_id: int) -> tuple[int, int]:
        t, a = self.game.functions.clockLeft(game_id).call()
        return int(t), int(a)

    # ------------------------------------------------------------- solvency
    def reward_share(self, task_id: int) -> int:
        """A finalized, lost task's share per AuditorWon game (docs/contract.md "Money"), computed
        here independently of the contract: half the trainer's bond (rounded up) split evenly
        among the winning games, at most one auditor bond each."""
        t = self.task(task_id)
        pool = t.trainerBond - t.trainerBond // 2
        return min(t.auditorBond, pool // t.auditorWins) if t.auditorWins else 0

    def escrow(self) -> int:
        """What the contract must hold besides credits and the burnt wei: payments and trainer bonds
        of unsettled tasks, live auditor bonds and unclaimed rewards of settled tasks."""
        total = 0
        for task_id in range(1, self.game.functions.taskCount().call() + 1):
            t = self.task(task_id)
            if t.status in (OPEN, ACCEPTED, COMMITTED):
                total += t.payment
            if t.status in (ACCEPTED, COMMITTED):
                total += t.trainerBond
        for game_id in range(1, self.game.functions.gameCount().call() + 1):
            g = self.game_state(game_id)
            t = self.task(g.taskId)
            if g.phase != ENDED:
                total += t.auditorBond
            elif g.outcome == AUDITOR_WON and t.status == FINALIZED and not g.rewardClaimed:
                total += self.reward_share(g.taskId)
        return total

    def credits(self) -> int:
        contracts = (self.rejecter.address, self.reenterer.address)
        return sum(self.credit(a) for a in [*(a.address for a in self.chain.accounts), *contracts])

    def solvent(self) -> bool:
        """The contract holds exactly its credits, its escrow and what it burnt."""
        return self.balance() == self.credits() + self.escrow() + self.burnt()
