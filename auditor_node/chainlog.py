"""An auditor reads a withheld log off the chain, piece by piece, and replays from it.

Why: a trainer that keeps its transcript back but answers the availability demand holds its data,
and before this the auditor could only wait for the store: a trainer that trained wrong and
withheld its transcript was paid. Once that first demand is answered and the transcript still
cannot be had, the auditor demands every piece of the log not yet on-chain (each piece once, a
bond each, at most :data:`MAX_OPEN` open at a time), then replays the task from its config and
those chunks (:func:`~game.training.engine.chunkaudit.audit_chunks`) and plays on with its own
leaves as after any replay: a bisection, evidence for the judge, who takes the pinned chunk from
the chain too. An asynchronous task's log is read and replayed the same way, by the schedule its
chunks carry. The trainer pays a transaction a piece for what it withheld; a log of more pieces
than the auditor's cap (:data:`MAX_PIECES` unless its operator set another, ``vgame node auditor
--max-log-pieces``: each piece is a demand of the auditor's and its bond until answered) is not
read, and the auditor says so, naming the option.

The auditor needs the task's config, which the transcript would have carried: the node's own
(``vgame node auditor --config``), or one left in the evidence directory (a client may leave it),
in either case held to the task's spec hash.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from auditor_node.availability import send_demand
from game.agents import AgentAction, TaskAgent
from game.chain.types import Game, Outcome, Phase, Task
from game.chunkleaf import piece_count
from game.errors import ConfigError, RoundingLogError
from game.evidencedir import read_task_config, write_pre_state, write_task_config
from game.onchainlog import OnChainLog
from game.protocol.solver import decide_log_demands
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)

#: Demands open at once while reading a log: each holds an auditor bond until it is answered.
MAX_OPEN = 16
#: The most pieces of a log an auditor demands by default (a transaction of its own and one of the
#: trainer's each; ``--max-log-pieces`` sets another).
MAX_PIECES = 512


class ChainLog:
    """One auditor's reading of its task's log off the chain (found again from the chain after a
    restart: the pieces posted, the auditor's open demands)."""

    def __init__(
        self,
        agent: TaskAgent,
        config: TaskConfig | None,
        evidence_dir: Path | None,
        game_ids: Callable[[], list[int]],
        *,
        max_pieces: int = MAX_PIECES,
    ) -> None:
        if max_pieces < 1:
            raise ConfigError(f"max_log_pieces: {max_pieces} is not a positive number of pieces")
        self.agent = agent
        self.max_pieces = max_pieces
        self.config = config
        self.evidence_dir = evidence_dir
        self.game_ids = game_ids  # the auditor's games on the task (scanned from events)
        self._said: set[str] = set()
        self._checked: TaskConfig | None = None  # the config found and held to the spec hash, once

    def _once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("task %d: %s", self.agent.task_id, message)

    @property
    def read(self) -> bool:
        """Whether this auditor's leaves come from a log it read off the chain."""
        return bool(self.agent.state.get("from_chain"))

    def task_config(self, task: Task) -> TaskConfig | None:
        """The task's config: the node's own or one left in the evidence directory, either held to
        the task's spec hash; None (said once) where neither is."""
        if self._checked is not None:
            return self._checked
        found, where = self.config, "--config"
        if found is None and self.evidence_dir is not None:
            try:  # anyone may leave one: held to the spec hash before it is loaded
                found, where = read_task_config(self.evidence_dir, task.spec_hash), "the evidence directory"
            except ConfigError as exc:
                self._once("bad", str(exc))
        if found is None:
            self._once("none", "the transcript is withheld and no task config is at hand to replay its "
                       "log from the chain (pass --config)")  # fmt: skip
            return None
        if found.spec_hash() != task.spec_hash:
            self._once("foreign", f"the config of {where} is not the task's: its spec hash differs")
            return None
        self._checked = found
        return found

    def maybe_read(self, task: Task, out: list[AgentAction]) -> None:
        """Once the trainer has answered a demand (it holds its data) and the transcript still
        cannot be had: demand the pieces of the log not on-chain yet, or, once all are, replay."""
        agent, client = self.agent, self.agent.client
        demands = [(gid, g) for gid in self.game_ids() if (g := client.game(gid)).availability]
        outcomes = {g.outcome for _, g in demands}
        if Outcome.ANSWERED not in outcomes or Outcome.AUDITOR_WON in outcomes:
            return  # nothing shown held yet, or a demand went unanswered: the trainer lost the task
        cfg = self.task_config(task)
        if cfg is None:
            return
        onchain = OnChainLog.read(client, agent.task_id, task.num_leaves)
        chunks = onchain.chunks(task.log_root)
        if chunks is not None:
            self._replay(task, cfg, chunks, len(onchain.pieces), out)
            return
        widest = max((piece_count(n) for n in onchain.lengths.values()), default=1)
        if (total := onchain.total_pieces(widest)) > self.max_pieces:
            self._once("large", f"the log has about {total} pieces, over the {self.max_pieces} this "
                       "auditor demands one by one (a transaction and a bond each): not read from the "
                       f"chain; --max-log-pieces {total} reads it")  # fmt: skip
            return
        open_now = [(g.lo, g.piece) for _, g in demands if g.phase != Phase.ENDED]
        for move in decide_log_demands(
            task, client.chain.now(), onchain.missing(), open_now, max_open=MAX_OPEN
        ):
            send_demand(
                agent,
                move,
                f"the transcript is withheld: reading its log off the chain, piece {move.piece} of step {move.index}",
                out,
            )

    def _replay(
        self, task: Task, cfg: TaskConfig, chunks: list[bytes], pieces: int, out: list[AgentAction]
    ) -> None:
        from game.training.engine.chunkaudit import audit_chunks

        agent = self.agent
        progress = agent.progress

        def tick(done: int, total: int) -> None:
            if progress is not None:
                progress("replay", done, total)

        result = audit_chunks(cfg, agent.profile, chunks, task.state_root, progress=tick)
        verdict = "match" if result.match else "mismatch"
        agent.state.update(
            leaves=[h.hex() for h in result.leaves],
            verdict=verdict,
            first_divergent_step=None,
            scheduled=cfg.scheduled,
            from_chain=True,
        )
        detail = f"{verdict} on {agent.profile}, from the log posted on-chain ({pieces} pieces), {result.corrections} corrections"
        if result.rejected_log_steps:
            detail += f"; log rejected at step {result.rejected_log_steps[0]}: {result.log_errors[0]}"
        agent._emit(out, AgentAction(agent.ACTOR, "replay", agent.task_id, detail=detail))

    def evidence(self, task: Task, g: Game) -> tuple[Path, str] | None:
        """Leave the judge the config and the pinned step's pre-state, from the log on-chain (the
        judge has no transcript either, and replays an asynchronous update's older states itself);
        None where the own state is not the agreed leaf."""
        from game.training.engine.chunkaudit import states_after_chunks

        assert self.evidence_dir is not None
        cfg = self.task_config(task)
        chunks = OnChainLog.read(self.agent.client, self.agent.task_id, task.num_leaves).chunks(task.log_root)
        if cfg is None or chunks is None:
            return None
        path = write_task_config(self.evidence_dir, cfg, task.spec_hash)
        if g.dispute_init:
            return path, "task config for step 0"
        try:
            data = states_after_chunks(cfg, self.agent.profile, chunks, {g.lo})[g.lo]
        except RoundingLogError:  # an earlier update's schedule broke the rules: no state follows it
            return None
        if leaf_of(data) != g.lo_leaf:
            return None
        return write_pre_state(
            self.evidence_dir, data
        ), f"task config and pre-state of step {g.hi} ({len(data)} bytes)"


__all__ = ["MAX_OPEN", "MAX_PIECES", "ChainLog"]
