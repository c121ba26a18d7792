"""An auditor's pay once it won: settling the task and claiming its share of the trainer's bond.

Why: the trainer's forfeited bond is split at ``finalize`` (docs/contract.md "Money"), and each winning
game's share is credited by ``claimReward``. A trainer that lost has no reason to settle the task, so
the auditor that won does it when it is due, then claims; anyone may do either. It is handed the agent
as the shared :class:`~game.agents.TaskAgent` and the auditor's games as a callable, so it never
imports :mod:`auditor_node.agent`, which holds it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from game.agents import AgentAction, TaskAgent, action_from_receipt, format_wei
from game.chain.types import Outcome
from game.errors import VerificationGameError
from game.protocol.solver import decide_claims, decide_finalize

log = logging.getLogger(__name__)
ACTOR = "auditor"


class Rewards:
    """One auditor's settlement and reward claims on its task."""

    def __init__(self, agent: TaskAgent, game_ids: Callable[[], list[int]]) -> None:
        self.agent = agent
        self.game_ids = game_ids  # the auditor's games on the task (scanned from events)

    def finalize_if_owed(self, out: list[AgentAction]) -> None:
        """Settle the task when it is due and this auditor won a game of it: its reward is fixed
        only then (anyone may finalize; a trainer that lost has no reason to)."""
        task = self.agent.client.task(self.agent.task_id)
        won = any(self.agent.client.game(g).outcome == Outcome.AUDITOR_WON for g in self.game_ids())
        if not won or decide_finalize(task, self.agent.client.chain.now()) is None:
            return
        try:
            rec = self.agent.client.finalize(self.agent.task_id)
        except VerificationGameError as exc:  # WindowOpen in the next block, or finalized meanwhile
            log.debug("finalize of task %d not possible yet: %s", self.agent.task_id, exc)
            return
        self.agent._emit(
            out, action_from_receipt(ACTOR, "finalize", self.agent.task_id, rec, detail="trainer lost a game")
        )

    def claim(self, out: list[AgentAction]) -> None:
        """Claim the share of the trainer's bond of every own game won, once the task is settled."""
        task = self.agent.client.task(self.agent.task_id)
        for claim in decide_claims(task, [(gid, self.agent.client.game(gid)) for gid in self.game_ids()]):
            try:
                rec = self.agent.client.claim_reward(claim.game_id)
            except VerificationGameError as exc:  # claimed by someone else meanwhile
                log.debug("reward of game %d not claimed: %s", claim.game_id, exc)
                continue
            amount = sum(int(getattr(e, "amount", 0)) for e in rec.events_named("RewardPaid"))
            self.agent._emit(
                out,
                action_from_receipt(
                    ACTOR,
                    "claim",
                    self.agent.task_id,
                    rec,
                    game_id=claim.game_id,
                    detail=f"reward {format_wei(amount)}",
                ),
            )


__all__ = ["Rewards"]
