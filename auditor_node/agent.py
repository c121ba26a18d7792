"""The auditor agent: fetch the transcript, replay it on its own profile, challenge and bisect.

Once the task is committed, :meth:`AuditorAgent.step` fetches the sealed transcript named by the
on-chain ``transcriptId``, checks it against every committed value (spec hash, state root, log
root, leaf count), replays it on the auditor's own profile with the trainer's rounding log
(``game.training.engine.audit.audit``: after a divergence the auditor keeps its own honest trajectory and
runs a step without corrections when the trainer's chunk no longer fits) and keeps its own leaves
in ``workdir/task-<id>/auditor.json``. Bisection answers come from those leaves; the game id is found again
from ``Challenged`` events, so nothing is sent twice after a crash.

A data key that is not the task's (its hash is on-chain) is the auditor's own mistake: it stops
before fetching anything. A transcript that cannot be had with the right key (not in the store
past a grace, not opening under the key, not what the chain committed to) is the trainer's: the
auditor demands a piece of a log chunk on-chain (an availability challenge,
:mod:`auditor_node.availability`), which the trainer must post within its clock or lose the task;
a trainer that posts it but still withholds the transcript has its whole log demanded and
replayed from the chain (:mod:`auditor_node.chainlog`). Once a task it won a game of is
settled, the auditor claims its share of the trainer's bond (:mod:`auditor_node.rewards`). The
fetch and the replay are :mod:`auditor_node.replay`'s; this module decides what is due and plays.

Where an auditor has a choice (challenge or not, agree or not, answer at all) it asks its
:class:`AuditorStrategy`: :class:`HonestAuditor` unless it is handed another (the dishonest ones of
the demo and the tests are in ``game.strategies``, which this module never imports).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from auditor_node.availability import DataDemands, TranscriptUnusable
from auditor_node.chainlog import MAX_PIECES, ChainLog
from auditor_node.replay import TranscriptReplay
from auditor_node.rewards import Rewards
from game.agents import (
    ActionSink,
    AgentAction,
    AgentError,
    NotThereYet,
    ProgressSink,
    TaskAgent,
    action_from_receipt,
    check_key,
    format_wei,
    games_of_task,
)
from game.chain.client import VerificationGameClient
from game.chain.types import Game, Outcome, Phase, Task, TaskStatus
from game.errors import VerificationGameError
from game.evidencedir import write_pre_state, write_task_config
from game.protocol.solver import (
    ClaimTimeout,
    Respond,
    auditor_move,
    challenge_in_time,
    decide_challenge,
    decide_claims,
    decide_withdraw,
    window_over,
)
from game.store.blobs import BlobStore
from game.store.keys import key_hash
from game.training.engine.auditprogress import DEFAULT_EVERY_S
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig
from game.training.transcript.reader import Transcript

log = logging.getLogger(__name__)

ACTOR = "auditor"


class AuditorStrategy(Protocol):
    """How an auditor plays where it has a choice; :class:`HonestAuditor` follows the rules."""

    @property
    def name(self) -> str:
        """What the strategy is called (``honest``, ``lying``, ...)."""
        ...

    @property
    def silent_once_challenged(self) -> bool:
        """Whether it stops moving once its game is open: no answer, no evidence for the judge
        (a timeout it can claim it still claims)."""
        ...

    def challenges(self, honest: bool) -> bool:
        """Whether to challenge the task, given whether an honest auditor would."""
        ...

    def answer(self, game: Game, game_id: int, honest: bool) -> bool:
        """Agree (True) or not with the leaf the trainer revealed in ``game``, given the answer
        the rules' solver gives from this auditor's own leaves."""
        ...


class HonestAuditor:
    """The rules' auditor: challenges a run its replay disagrees with, answers from its own leaves."""

    name = "honest"
    silent_once_challenged = False

    def challenges(self, honest: bool) -> bool:
        return honest

    def answer(self, game: Game, game_id: int, honest: bool) -> bool:
        return honest


class AuditorAgent(TaskAgent):
    """One task's auditor; ``strategy`` is honest play unless a misbehaviour is handed in (demos, tests)."""

    ACTOR = ACTOR
    STATE_NAME = "auditor.json"

    def __init__(
        self,
        client: VerificationGameClient,
        task_id: int,
        *,
        profile: str,
        workdir: Path,
        store: BlobStore,
        data_key: bytes,
        strategy: AuditorStrategy | None = None,
        evidence_dir: Path | None = None,
        on_action: ActionSink | None = None,
        progress: ProgressSink | None = None,
        save_every_s: float = DEFAULT_EVERY_S,
        config: TaskConfig | None = None,
        max_log_pieces: int = MAX_PIECES,
    ) -> None:
        super().__init__(
            client, task_id, profile=profile, workdir=workdir, store=store, data_key=data_key,
            on_action=on_action, progress=progress,
        )  # fmt: skip
        self.strategy: AuditorStrategy = strategy if strategy is not None else HonestAuditor()
        self.evidence_dir = Path(evidence_dir) if evidence_dir is not None else None
        self.save_every_s = save_every_s  # wall time between two saves of the replay's progress
        self.replay = TranscriptReplay(self)
        self.demands = DataDemands(self, self.game_ids)
        self.rewards = Rewards(self, self.game_ids)
        # the task's config, for a log read off the chain where the transcript is withheld
        self.chain_log = ChainLog(self, config, self.evidence_dir, self.game_ids, max_pieces=max_log_pieces)

    @property
    def transcript_dir(self) -> Path:
        return self.replay.transcript_dir

    @property
    def verdict(self) -> str | None:
        """ "match" when its replay reproduced the committed root, "mismatch" when not,
        "unavailable" when the transcript could not be had to replay, None before."""
        v = self.state.get("verdict")
        return str(v) if v is not None else None

    @property
    def leaves(self) -> list[bytes]:
        """The auditor's own leaves (empty before the replay)."""
        return [bytes.fromhex(h) for h in self.state.get("leaves", [])]

    def _first_divergent(self) -> int | None:
        """The auditor's first divergent step: from it on it disagrees with every leaf the trainer
        reveals, so a game pins that step (:func:`~game.protocol.solver.decide_response`)."""
        first = self.state.get("first_divergent_step")
        return None if first is None else int(first)

    def _final_is_state(self) -> bool:
        """Whether the auditor's own final leaf is a state's: not where an asynchronous task's
        schedule broke, and every leaf from there on is the rejected-schedule mark, which a trainer
        can commit as well (:func:`~game.protocol.solver.decide_challenge`)."""
        leaves = self.leaves
        if not self.state.get("scheduled") or not leaves:
            return True
        from game.training.engine.schedaudit import rejected_schedule_leaf

        return leaves[-1] != rejected_schedule_leaf(len(leaves) - 1)

    # ------------------------------------------------------------------------------- step
    def step(self) -> list[AgentAction]:
        """Do everything due now; returns what was done (empty when nothing was due)."""
        out: list[AgentAction] = []
        self.state.bind(self.client, self.home)
        task = self.client.task(self.task_id)
        check_key(ACTOR, self.task_id, task, self.client.me)
        if task.key_hash != key_hash(self.data_key):
            # its own mistake, not the trainer's: demanding data it could not open would be a false alarm
            raise AgentError(
                f"the data key given is not task {self.task_id}'s (the task's key hashes to "
                f"{task.key_hash.hex()[:16]}..., this one to {key_hash(self.data_key).hex()[:16]}...): "
                "get the task's key from its client"
            )
        if task.status in (TaskStatus.COMMITTED, TaskStatus.FINALIZED):
            if self.verdict is None:
                self._audit(task, out)
            if task.status == TaskStatus.COMMITTED:
                if self.verdict == "unavailable":
                    self.demands.maybe_demand(task, "unreadable", out)
                if self.verdict in (None, "unavailable"):
                    self.chain_log.maybe_read(task, out)
                self._maybe_challenge(task, out)
                for gid in self.game_ids():
                    self._play(gid, out)
                self.rewards.finalize_if_owed(out)
        self.rewards.claim(out)
        self._withdraw(out)
        return out

    def _audit(self, task: Task, out: list[AgentAction]) -> None:
        """Fetch and replay; a transcript that cannot be had is met with an availability challenge."""
        try:
            self.replay.run(task, out, save_every_s=self.save_every_s)
        except TranscriptUnusable as exc:
            self.state.update(verdict="unavailable", unusable=str(exc))
            self._emit(out, AgentAction(ACTOR, "replay", self.task_id, detail=f"cannot audit: {exc}"))
        except NotThereYet as exc:
            now = self.client.chain.now()
            if task.status == TaskStatus.COMMITTED and not window_over(task, now):
                self.demands.maybe_demand(task, "missing", out)
                if not self.demands.games():
                    raise  # a lagging store: wait for it while a challenge can still come
                log.info(
                    "task %d: waiting for the transcript while the demand for its data plays out",
                    self.task_id,
                )
                return
            if self.demands.won():  # the trainer could not post its data: it is not paid
                self.state.update(verdict="unavailable", unusable=str(exc))
                return
            # waiting on would never end, and "done" would read as "audited"
            raise AgentError(
                f"task {self.task_id}: the challenge window closed before the trainer's "
                "transcript reached the store, so nothing was audited in time and the trainer is "
                "paid as if it had been: tell the client (run this again once the store holds "
                f"the transcript to replay it all the same) ({exc})"
            ) from exc

    @property
    def done(self) -> bool:
        """Nothing left to do: the task is settled or decided on, own games ended, rewards claimed,
        credit withdrawn."""
        task = self.client.task(self.task_id)
        if task.status == TaskStatus.CANCELLED:
            return self.client.credit() == 0
        if task.status in (TaskStatus.OPEN, TaskStatus.ACCEPTED) or self.verdict is None:
            return False
        games = self.game_ids()
        states = [(gid, self.client.game(gid)) for gid in games]
        if any(g.phase != Phase.ENDED for _, g in states) or decide_claims(task, states):
            return False
        if task.status != TaskStatus.FINALIZED and any(g.outcome == Outcome.AUDITOR_WON for _, g in states):
            return False  # a reward is owed once the task is settled
        if self.client.credit() != 0:
            return False
        if games or task.status == TaskStatus.FINALIZED:
            return True
        # no game: done unless it still means to challenge while the window is open (or may open
        # again: another auditor's demand, once answered, extends it)
        return not self._wants_challenge(task) or window_over(task, self.client.chain.now())

    # ----------------------------------------------------------------------- challenge
    def _wants_challenge(self, task: Task) -> bool:
        if self.verdict not in ("match", "mismatch"):
            return False  # nothing replayed: nothing to bisect (an availability challenge instead)
        decision = decide_challenge(
            task.first_leaf,
            task.last_leaf,
            task.num_leaves,
            self.leaves,
            final_is_state=self._final_is_state(),
        )
        return self.strategy.challenges(decision.challenge)

    def _dispute_init(self, task: Task) -> bool:
        return decide_challenge(task.first_leaf, task.last_leaf, task.num_leaves, self.leaves).dispute_init

    def game_ids(self) -> list[int]:
        """This auditor's games on the task (scanned from events; the scan position kept on disk)."""
        known: list[int] = list(self.state.get("games", []))
        start = int(self.state.get("scan_from", 0))
        new, nxt = games_of_task(self.client, self.task_id, start, auditor=self.client.me)
        merged = known + [g for g in new if g not in known]
        if merged != known or nxt != start:
            self.state.update(games=merged, scan_from=nxt)
        return merged

    def _maybe_challenge(self, task: Task, out: list[AgentAction]) -> None:
        if not self._wants_challenge(task) or any(
            not self.client.game(g).availability for g in self.game_ids()
        ):
            return
        now = self.client.chain.now()
        if not challenge_in_time(task, now):
            if window_over(task, now):
                log.warning("task %d: the window closed before this auditor could challenge", self.task_id)
            else:
                log.info("task %d: the window is past its end while a game is live: waiting", self.task_id)
            return
        dispute_init = self._dispute_init(task)
        try:
            rec = self.client.challenge(self.task_id, dispute_init)
        except VerificationGameError as exc:
            log.warning("challenge of task %d refused: %s", self.task_id, exc)
            return
        self._opened(
            out,
            "challenge",
            rec,
            leaf_index=0 if dispute_init else None,
            detail="dispute the initial state" if dispute_init else f"[0, {task.num_leaves - 1}]",
        )

    # --------------------------------------------------------------------------- play
    def _play(self, gid: int, out: list[AgentAction]) -> None:
        g = self.client.game(gid)
        if g.phase == Phase.ENDED:
            return
        move = auditor_move(
            g, self.client.chain.now(), self.client.deadline(gid), self.leaves, self._first_divergent()
        )
        silent = self.strategy.silent_once_challenged
        if g.phase == Phase.PINNED and not silent:
            self._leave_evidence(gid, g, out)
        if isinstance(move, Respond) and not silent:
            self._respond(gid, g, move, out)
        elif isinstance(move, ClaimTimeout):
            why = {"trainer": "trainer silent", "judge": "judge silent: game void"}[move.silent]
            if g.availability:
                why = f"the trainer did not post the log chunk of step {g.lo}"
            self._timeout(gid, why, out)

    def _respond(self, gid: int, g: Game, move: Respond, out: list[AgentAction]) -> None:
        agree = self.strategy.answer(g, gid, move.agree)
        try:
            rec = self.client.respond(gid, agree)
        except VerificationGameError as exc:
            log.warning("respond in game %d refused: %s", gid, exc)
            return
        self._emit(
            out,
            action_from_receipt(
                ACTOR,
                "respond",
                self.task_id,
                rec,
                game_id=gid,
                leaf_index=move.index,
                detail="agree" if agree else "disagree",
            ),
        )

    def _timeout(self, gid: int, detail: str, out: list[AgentAction]) -> None:
        try:
            rec = self.client.timeout(gid)
        except VerificationGameError as exc:
            log.debug("timeout of game %d not possible yet: %s", gid, exc)
            return
        self._emit(out, action_from_receipt(ACTOR, "timeout", self.task_id, rec, game_id=gid, detail=detail))

    def _leave_evidence(self, gid: int, g: Game, out: list[AgentAction]) -> None:
        """Hand the judge the pre-state of the pinned step (or the config for step 0), once."""
        if self.evidence_dir is None or gid in self.state.get("evidence_for", []):
            return
        if self.chain_log.read:  # no transcript: the config and the state from the log on-chain
            left = self.chain_log.evidence(self.client.task(self.task_id), g)
            self.state.update(evidence_for=[*self.state.get("evidence_for", []), gid])
            if left is None:
                log.warning("game %d: no evidence from the log on-chain (own state not the agreed leaf)", gid)
                return
            path, detail = left
            self._emit(
                out, AgentAction(ACTOR, "evidence", self.task_id, game_id=gid, leaf_index=g.lo, detail=detail)
            )
            return
        t = Transcript(self.transcript_dir)
        if g.dispute_init:
            path = write_task_config(self.evidence_dir, t.config, t.spec_hash)
            detail = "task config for step 0"
        else:
            states = self.replay.states(t, g.lo, g.hi)
            data = states[g.lo]
            if leaf_of(data) != g.lo_leaf:
                log.warning("game %d: own state at step %d is not the agreed leaf; no evidence", gid, g.lo)
                self.state.update(evidence_for=[*self.state.get("evidence_for", []), gid])
                return
            path = write_pre_state(self.evidence_dir, data)
            detail = f"pre-state of step {g.hi} ({len(data)} bytes)"
            older = [v for v in states if v != g.lo and leaf_of(states[v]) == t.leaf(v)]
            for v in older:  # an asynchronous update's older states, each its committed leaf's
                write_pre_state(self.evidence_dir, states[v])
            if older:
                detail += f" and the states {older} it computes on"
        self.state.update(evidence_for=[*self.state.get("evidence_for", []), gid])
        self._emit(
            out, AgentAction(ACTOR, "evidence", self.task_id, game_id=gid, leaf_index=g.lo, detail=detail)
        )
        log.debug("evidence for game %d at %s", gid, path)

    # ---------------------------------------------------------------------------- money
    def _withdraw(self, out: list[AgentAction]) -> None:
        move = decide_withdraw(self.client.credit())
        if move is None:
            return
        rec = self.client.withdraw()
        self._emit(
            out, action_from_receipt(ACTOR, "withdraw", self.task_id, rec, detail=format_wei(move.amount))
        )


__all__ = ["AuditorAgent", "AuditorStrategy", "HonestAuditor"]
