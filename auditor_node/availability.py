"""An auditor's availability challenges: a log chunk's piece demanded when the transcript cannot be had.

Why: an auditor that cannot get or open the transcript cannot replay, and before issue 44 it stopped
without a word while the trainer was paid. Now it demands one piece of one log chunk on-chain
(``challengeData``; one transaction carries a piece, not a large chunk: :mod:`game.chunkleaf`), chosen
by :func:`game.protocol.solver.data_probe_index` and :func:`~game.protocol.solver.data_probe_piece`: a
trainer that cannot post it within its clock loses the game and with it the task; one that posts it
holds its data, and the auditor keeps waiting for the store. When to demand is the solver's
(:func:`~game.protocol.solver.decide_data_demand`); this module only sends what it decides and reads
the outcome back from the chain. It is handed the agent as the shared :class:`~game.agents.TaskAgent`
and the auditor's games as a callable, so it never imports :mod:`auditor_node.agent`, which holds it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from game.agents import AgentAction, AgentError, TaskAgent
from game.chain.types import Outcome, Task
from game.errors import VerificationGameError
from game.protocol.solver import DemandData, TranscriptState, decide_data_demand

log = logging.getLogger(__name__)


class TranscriptUnusable(AgentError):
    """The transcript is in the store but cannot be used with the task's key: it does not open, it
    is damaged, or it is not what the chain committed to. The trainer's fault (the key was checked
    against the task's first), so the auditor demands the data on-chain instead of stopping."""


class DataDemands:
    """One auditor's availability challenges on its task (found again from the chain after a restart)."""

    def __init__(self, agent: TaskAgent, game_ids: Callable[[], list[int]]) -> None:
        self.agent = agent
        self.game_ids = game_ids  # the auditor's games on the task (scanned from events)

    def games(self) -> list[int]:
        """This auditor's availability games on the task."""
        client = self.agent.client
        return [gid for gid in self.game_ids() if client.game(gid).availability]

    def won(self) -> bool:
        """Whether the trainer failed to post a chunk this auditor demanded (it lost the task)."""
        client = self.agent.client
        return any(client.game(gid).outcome == Outcome.AUDITOR_WON for gid in self.games())

    def maybe_demand(self, task: Task, transcript: TranscriptState, out: list[AgentAction]) -> None:
        """Open the availability challenge the solver calls for now, if any."""
        agent = self.agent
        me = agent.client.me
        move = decide_data_demand(
            task,
            agent.client.chain.now(),
            transcript,
            task_id=agent.task_id,
            auditor=me,
            demanded=bool(self.games()),
        )
        if move is None:
            return
        why = "not in the store" if transcript == "missing" else "not openable with the task's key"
        send_demand(
            agent,
            move,
            f"the transcript is {why}: the trainer must post piece {move.piece} (reduced by the chunk's "
            f"piece count) of the log chunk of step {move.index}",
            out,
        )


def send_demand(agent: TaskAgent, move: DemandData, detail: str, out: list[AgentAction]) -> None:
    """Open the availability challenge ``move`` and keep its game; a refusal (the piece was posted
    meanwhile, for another auditor's demand) is said in the log."""
    try:
        rec = agent.client.challenge_data(agent.task_id, move.index, move.piece)
    except VerificationGameError as exc:
        log.warning(
            "demand of piece %d of chunk %d of task %d refused: %s",
            move.piece,
            move.index,
            agent.task_id,
            exc,
        )
        return
    agent._opened(out, "demand", rec, leaf_index=move.index, detail=detail)


__all__ = ["DataDemands", "TranscriptUnusable", "send_demand"]
