"""A trainer's moves in the games of its task: the leaf a bisection asks for, the log chunk an
availability challenge demands, the timeout of an opponent that let its clock run out.

Apart from :mod:`trainer_node.agent` (the task's life: check, accept, train, publish, commit, mend,
finalize, withdraw) because the games are a concern of their own that starts once the commitment is
on-chain: the rules' solver (:func:`~game.protocol.solver.trainer_move`) decides each move from the
game's state and this trainer's trees, and this module sends it and says what it did. It is handed
the agent as the shared :class:`~game.agents.TaskAgent`, its transcript and its trees (built once,
held to the commitment by the agent), so it never imports :mod:`trainer_node.agent`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from game.agents import AgentAction, TaskAgent, action_from_receipt, games_of_task
from game.chain.types import Game, Phase
from game.chunkleaf import piece_count
from game.errors import RoundingLogError, TranscriptError, VerificationGameError
from game.merkle import MerkleTree
from game.protocol.solver import ClaimTimeout, ProvideData, Reveal, trainer_move
from game.training.transcript.reader import Transcript

log = logging.getLogger(__name__)


class TrainerGames:
    """One trainer's games on its task (found again from the chain's events after a restart)."""

    def __init__(
        self,
        agent: TaskAgent,
        transcript_dir: Path,
        tree: Callable[[], MerkleTree],
        log_tree: Callable[[], MerkleTree],
        restore: Callable[[], str | None],
    ) -> None:
        self.agent = agent
        self.transcript_dir = transcript_dir
        self.tree = tree  # the state tree the trainer committed to (reveals are proved against it)
        self.log_tree = log_tree  # its log-chunk hashes' tree (a demanded chunk is proved against it)
        self.restore = restore  # the committed transcript back from the store: None, or why not

    def game_ids(self) -> list[int]:
        """Every game of this task (scanned from events; the scan position is kept on disk)."""
        state = self.agent.state
        known: list[int] = list(state.get("games", []))
        start = int(state.get("scan_from", state.get("commit_block", 0)))
        new, nxt = games_of_task(self.agent.client, self.agent.task_id, start)
        merged = known + [g for g in new if g not in known]
        if merged != known or nxt != start:
            state.update(games=merged, scan_from=nxt)
        return merged

    def play(self, out: list[AgentAction]) -> None:
        """Make the move the solver calls for now in every game still in play."""
        client = self.agent.client
        for gid in self.game_ids():
            g = client.game(gid)
            if g.phase == Phase.ENDED:
                continue
            log_tree = self.log_tree() if g.availability else None
            move = trainer_move(g, client.chain.now(), client.deadline(gid), self.tree(), log_tree)
            if isinstance(move, Reveal):
                self._reveal(gid, g, move, out)
            elif isinstance(move, ProvideData):
                self._provide(gid, move, out)
            elif isinstance(move, ClaimTimeout):
                self._timeout(gid, move, out)

    def _reveal(self, gid: int, g: Game, move: Reveal, out: list[AgentAction]) -> None:
        agent = self.agent
        try:
            rec = agent.client.reveal(gid, move.leaf, move.proof)
        except VerificationGameError as exc:
            log.warning("reveal in game %d refused: %s", gid, exc)
            return
        agent._emit(
            out,
            action_from_receipt(
                agent.ACTOR,
                "reveal",
                agent.task_id,
                rec,
                game_id=gid,
                leaf_index=move.index,
                detail=f"[{g.lo}, {g.hi}]",
            ),
        )

    def _provide(self, gid: int, move: ProvideData, out: list[AgentAction]) -> None:
        """Post the demanded piece of a log chunk on-chain (an availability challenge: an auditor
        could not get or open the transcript); the client cuts the piece the game names."""
        agent = self.agent
        chunk = self._chunk(move.index)
        if chunk is None:
            return
        try:
            rec = agent.client.provide_data(gid, chunk, move.proof)
        except VerificationGameError as exc:
            log.warning("posting log chunk %d in game %d refused: %s", move.index, gid, exc)
            return
        posted = rec.event("DataProvided")  # the piece the contract took: the demand, reduced
        agent._emit(
            out,
            action_from_receipt(
                agent.ACTOR,
                "provide",
                agent.task_id,
                rec,
                game_id=gid,
                leaf_index=move.index,
                detail=f"piece {posted.piece} of {piece_count(len(chunk))} of the log chunk of "  # type: ignore[attr-defined]
                f"step {move.index} posted on-chain (a {len(chunk):,}-byte chunk)",
            ),
        )

    def _chunk(self, index: int) -> bytes | None:
        """Log chunk ``index`` from the transcript on disk, or, where it is missing or damaged there
        (a disk can lose what was written to it), from the transcript restored from the store: a
        demand left unanswered loses the task, and a chunk that raised here stopped the node on
        every restart. None (said in the log) where neither has it."""
        try:
            return Transcript(self.transcript_dir).chunk_bytes(index)
        except (TranscriptError, RoundingLogError, OSError) as exc:
            log.warning("log chunk %d on disk is unusable (%s); restoring the transcript", index, exc)
        failed = self.restore()
        if failed is None:
            try:
                return Transcript(self.transcript_dir).chunk_bytes(index)
            except (TranscriptError, RoundingLogError, OSError) as exc:
                failed = str(exc)
        log.error("cannot post log chunk %d: %s", index, failed)
        return None

    def _timeout(self, gid: int, move: ClaimTimeout, out: list[AgentAction]) -> None:
        agent = self.agent
        try:
            rec = agent.client.timeout(gid)
        except VerificationGameError as exc:  # ClockRunning (next block too early) or GameOver
            log.debug("timeout of game %d not possible yet: %s", gid, exc)
            return
        agent._emit(
            out,
            action_from_receipt(
                agent.ACTOR, "timeout", agent.task_id, rec, game_id=gid, detail=f"{move.silent} silent"
            ),
        )


__all__ = ["TrainerGames"]
