"""What a demo run did, and whether the money adds up: the result the ``vgame demo`` command shows.

Why apart from the runner (:mod:`game.demo`): the loop that plays a scenario and the accounting
after it change for different reasons. This module reads the settled task back from the chain,
summarises its games, and holds every party's balance to the contract's money rules
(:func:`game.protocol.payouts.expected_changes`, net of the fees each party paid).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from game.protocol.payouts import expected_changes

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from game.agents import AgentAction
    from game.chain.backends import Chain
    from game.chain.client import VerificationGameClient
    from game.scenarios import Scenario
    from game.training.task.config import TaskConfig

#: Actions that are moves of a verification game (what the live table counts as "moves").
GAME_MOVES = frozenset({"challenge", "demand", "provide", "reveal", "respond", "rule", "timeout"})


@dataclass(frozen=True)
class PartyBalance:
    """One party's money over the run (wei): what moved, what the rules say should have moved."""

    address: str
    start: int
    end: int
    gas_cost: int  # fees paid for the transactions this party sent
    expected_change: int  # change the rules promise, before fees

    @property
    def change(self) -> int:
        return self.end - self.start

    @property
    def ok(self) -> bool:
        return self.change == self.expected_change - self.gas_cost

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "start": self.start,
            "end": self.end,
            "change": self.change,
            "gas_cost": self.gas_cost,
            "expected_change": self.expected_change,
            "ok": self.ok,
        }


@dataclass(frozen=True)
class GameSummary:
    game_id: int
    auditor: str
    outcome: str  # trainer_won | auditor_won | void | answered
    reason: str  # ruling | timeout | judge_timeout | data_provided
    winner: str | None
    pinned_step: int | None
    dispute_init: bool
    availability: bool  # a demand for a piece of a log chunk (answered, or lost by the trainer)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class DemoResult:
    """What happened; :meth:`to_dict` is the ``vgame demo --json`` document."""

    scenario: str
    disputed_step: int | None  # the step the judge re-ran (None when no game was pinned)
    winner: str  # "trainer" | "auditor" | "void"
    trainer_paid: bool
    moves: int  # game moves: challenge, demand, provide, reveal, respond, rule, timeout
    demands: int  # availability games: pieces of the log demanded on-chain
    transactions: int  # every transaction of the run after deployment
    gas_total: int
    balances_ok: bool
    trainer_profile: str
    auditor_profile: str
    judge_profile: str
    expected_winner: str
    deviation_step: int | None  # S, for the scenarios where the trainer deviates
    chain: str
    preset: str
    steps: int
    task_id: int
    contract: str
    contract_balance: int
    burnt: int  # wei the contract keeps for good: half the bond of a trainer that lost
    end_reason: str | None  # how the (first) bisection game ended, else the first game
    games: tuple[GameSummary, ...]
    balances: dict[str, PartyBalance]
    actions: tuple[AgentAction, ...] = field(repr=False)
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "disputed_step": self.disputed_step,
            "winner": self.winner,
            "trainer_paid": self.trainer_paid,
            "moves": self.moves,
            "demands": self.demands,
            "transactions": self.transactions,
            "gas_total": self.gas_total,
            "balances_ok": self.balances_ok,
            "trainer_profile": self.trainer_profile,
            "auditor_profile": self.auditor_profile,
            "judge_profile": self.judge_profile,
            "expected_winner": self.expected_winner,
            "deviation_step": self.deviation_step,
            "end_reason": self.end_reason,
            "chain": self.chain,
            "preset": self.preset,
            "steps": self.steps,
            "task_id": self.task_id,
            "contract": self.contract,
            "contract_balance": self.contract_balance,
            "burnt": self.burnt,
            "games": [g.to_dict() for g in self.games],
            "balances": {k: v.to_dict() for k, v in self.balances.items()},
            "actions": [a.to_dict() for a in self.actions],
            "elapsed_s": round(self.elapsed_s, 3),
        }


class RunFacts(Protocol):
    """What the accounting needs to know of a run (the runner's ``_Run`` has it)."""

    scenario: Scenario
    chain: Chain
    cfg: TaskConfig
    deviation_step: int | None
    profiles: tuple[str, str, str]
    actions: list[AgentAction]
    started: float


def demo_result(
    run: RunFacts,
    clients: dict[str, VerificationGameClient],
    accounts: dict[str, LocalAccount],
    address: str,
    task_id: int,
    start: dict[str, int],
) -> DemoResult:
    """What the run did, read back from the chain, with every balance held to the money rules."""
    from game.tasks import game_winner, task_games

    client = clients["client"]
    chain = run.chain
    task = client.task(task_id)
    games = task_games(client, task_id)
    summaries = tuple(
        GameSummary(
            game_id=gid,
            auditor=g.auditor,
            outcome=g.outcome.name.lower(),
            reason=g.reason.name.lower(),
            winner=game_winner(g),
            pinned_step=g.pinned_step,
            dispute_init=g.dispute_init,
            availability=g.availability,
        )
        for gid, g in games
    )
    finalized = client.get_events("TaskFinalized", task_id=task_id)
    trainer_paid = bool(finalized and finalized[0].trainer_paid)  # type: ignore[attr-defined]
    fees = _fees(run, accounts)
    expected = expected_changes(task, [g for _, g in games])
    balances = {
        p: PartyBalance(
            address=acct.address,
            start=start[p],
            end=chain.balance(acct.address),
            gas_cost=fees.get(acct.address.lower(), 0),
            expected_change=expected.get(acct.address.lower(), 0),
        )
        for p, acct in accounts.items()
    }
    contract_balance = chain.balance(address)
    burnt = client.burnt()
    tx_hashes = {a.tx_hash for a in run.actions if a.tx_hash}
    winners = [s.winner for s in summaries if s.winner and s.winner != "answered"]
    if "auditor" in winners:
        winner = "auditor"
    elif winners:
        winner = winners[0]
    else:
        winner = "trainer" if trainer_paid else "none"
    pinned = [s.pinned_step for s in summaries if s.pinned_step is not None]
    decisive = [s for s in summaries if not s.availability] or list(summaries)
    return DemoResult(
        scenario=run.scenario.name,
        disputed_step=pinned[0] if pinned else None,
        winner=winner,
        trainer_paid=trainer_paid,
        moves=sum(1 for a in run.actions if a.what in GAME_MOVES and a.tx_hash),
        demands=sum(1 for s in summaries if s.availability),
        transactions=len(tx_hashes),
        gas_total=sum(a.gas_used or 0 for a in _unique_txs(run.actions)),
        # the contract keeps only what it burnt (half a lost trainer's bond, for good)
        balances_ok=contract_balance == burnt and all(b.ok for b in balances.values()),
        trainer_profile=run.profiles[0],
        auditor_profile=run.profiles[1],
        judge_profile=run.profiles[2],
        expected_winner=run.scenario.winner,
        deviation_step=run.deviation_step,
        chain=chain.kind,
        preset=run.cfg.preset,
        steps=run.cfg.steps,
        task_id=task_id,
        contract=address,
        contract_balance=contract_balance,
        burnt=burnt,
        end_reason=decisive[0].reason if decisive else None,
        games=summaries,
        balances=balances,
        actions=tuple(run.actions),
        elapsed_s=time.monotonic() - run.started,
    )


def _fees(run: RunFacts, accounts: dict[str, LocalAccount]) -> dict[str, int]:
    """Fees per sender (lower-case address) of every transaction the run reported."""
    ours = {a.address.lower() for a in accounts.values()}
    fees: dict[str, int] = {}
    for a in _unique_txs(run.actions):
        rec = run.chain.w3.eth.get_transaction_receipt(a.tx_hash)  # type: ignore[arg-type]
        sender = str(rec["from"]).lower()
        if sender not in ours:
            continue
        price = int(rec.get("effectiveGasPrice", 0) or 0)
        fees[sender] = fees.get(sender, 0) + int(rec["gasUsed"]) * price
    return fees


def _unique_txs(actions: list[AgentAction] | tuple[AgentAction, ...]) -> list[AgentAction]:
    seen: set[str] = set()
    out = []
    for a in actions:
        if a.tx_hash and a.tx_hash not in seen:
            seen.add(a.tx_hash)
            out.append(a)
    return out


__all__ = ["GAME_MOVES", "DemoResult", "GameSummary", "PartyBalance", "RunFacts", "demo_result"]
