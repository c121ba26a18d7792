"""The trainer agent: accept the task, train it, publish the transcript, commit, answer every game.

Each :meth:`TrainerAgent.step` reads the task and its games from the chain and does what is due
now. Before any work it checks the task: its spec hash and leaf count are its config's, the data
key it was given is the task's (``keyHash``), and the terms pass its :class:`TermsPolicy`; then it
accepts the task, posting its bond, so that the client cannot cancel it while it trains. Training
is resumable (``game.training.engine.train.train``); before committing it opens the published blob
under the task's key and holds its manifest to the roots it commits. The published transcript id is
kept in ``workdir/task-<id>/trainer.json``, and everything else (accepted, committed or not, which
leaf or log chunk a game wants next, whose clock ran out) is read back from the chain, so a trainer
killed at any point and recreated with the same arguments sends no transaction twice and ends the
game the same way (its moves in the games are :mod:`trainer_node.games`'s). A transcript found
damaged after the commit is mended from the store, or trained again where it is gone
(:mod:`trainer_node.mend`); until then finalize and withdraw still go ahead, and the node says how
to mend it.

A ``deviation`` makes it a dishonest trainer on purpose (the demo; ``vgame node trainer
--rehearse``); a node's ``rehearsal`` names it (``poison@8``) in its state file and its actions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

from game.agents import (
    ActionSink,
    AgentAction,
    AgentError,
    ProgressSink,
    TaskAgent,
    action_from_receipt,
    check_key,
    format_wei,
)
from game.chain.client import VerificationGameClient
from game.chain.types import Task, TaskStatus
from game.errors import ContractGone, VerificationGameError, VGameError
from game.merkle import MerkleTree
from game.protocol.solver import decide_accept, decide_finalize, decide_withdraw
from game.protocol.terms import Estimate, TermsPolicy, terms_problems
from game.store.archive import SealedArchive, publish_directory
from game.store.blobs import BlobStore
from game.store.keys import key_hash
from game.store.sealing import StoreError
from game.training.engine.train import Deviation, probe_steps, train
from game.training.task.config import TaskConfig
from game.training.transcript.layout import MANIFEST_NAME
from game.training.transcript.manifest import read_manifest
from game.training.transcript.reader import Transcript, steps_on_disk
from trainer_node.games import TrainerGames
from trainer_node.mend import committed_tree, restore_from_store

log = logging.getLogger(__name__)

ACTOR = "trainer"
TRANSCRIPT_DIR = "transcript"
#: Seconds of training between two looks at the task: a task the client cancels meanwhile stops
#: the training (hours of it, on a large task) instead of running to a commit the contract refuses.
CANCEL_CHECK_S = 30.0


class _Cancelled(Exception):
    """The client cancelled the task while this trainer trained."""


class TrainerAgent(TaskAgent):
    """One task's trainer; see the module docstring for what :meth:`step` does."""

    ACTOR = ACTOR
    STATE_NAME = "trainer.json"

    def __init__(
        self,
        client: VerificationGameClient,
        task_id: int,
        cfg: TaskConfig,
        *,
        profile: str,
        workdir: Path,
        store: BlobStore,
        data_key: bytes,
        deviation: Deviation | None = None,
        rehearsal: str | None = None,
        policy: TermsPolicy | None = None,
        on_action: ActionSink | None = None,
        progress: ProgressSink | None = None,
    ) -> None:
        """``rehearsal``: what a node calls its ``deviation`` (``poison@8``), kept in the state file
        (a restart with another one, or none, is refused: its transcript would mix two trainers)
        and said in its actions."""
        super().__init__(
            client, task_id, profile=profile, workdir=workdir, store=store, data_key=data_key,
            on_action=on_action, progress=progress,
        )  # fmt: skip
        self.cfg = cfg
        self.deviation = deviation
        self.rehearsal = rehearsal
        self.policy = policy or TermsPolicy()
        self._estimate: Estimate | None = None  # what it measured of the task (before the accept)
        self._tree: MerkleTree | None = None
        self._log_tree: MerkleTree | None = None
        self.games = TrainerGames(self, self.transcript_dir, self.tree, self.log_tree, self._restore)

    @property
    def transcript_dir(self) -> Path:
        return self.taskdir / TRANSCRIPT_DIR

    # ------------------------------------------------------------------------------- step
    def step(self) -> list[AgentAction]:
        """Do everything due now; returns what was done (empty when nothing was due)."""
        out: list[AgentAction] = []
        self.state.bind(self.client, self.home)
        task = self.client.task(self.task_id)
        if task.spec_hash != self.cfg.spec_hash():
            raise AgentError(
                f"task {self.task_id} has spec hash {task.spec_hash.hex()[:16]}..., this trainer's config "
                f"hashes to {self.cfg.spec_hash().hex()[:16]}...: it is another task"
            )
        if task.num_leaves != self.cfg.num_leaves:
            # the spec hash matched, so this is a task whose client posted the wrong leaf count: the
            # contract would refuse this trainer's commitment (LeafCountMismatch) after the training
            raise AgentError(
                f"task {self.task_id} asks on-chain for {task.num_leaves} leaves, but its config has "
                f"{self.cfg.steps} steps, so {self.cfg.num_leaves} leaves: the contract would refuse "
                "the commitment; not training for it"
            )
        check_key(ACTOR, self.task_id, task, self.client.me)
        self._check_rehearsal()
        damage: str | None = None
        if task.status in (TaskStatus.OPEN, TaskStatus.ACCEPTED):
            problems = terms_problems(
                task, key_hash(self.data_key), self.policy, estimate=self._measure(task)
            )
            if problems:
                # before the accept (its bond) and before any training: nothing is lost yet
                raise AgentError(f"not working on task {self.task_id}: " + "; ".join(problems))
        if task.status == TaskStatus.OPEN and decide_accept(task) is not None:
            self._accept(out)
            task = self.client.task(self.task_id)
        if task.status == TaskStatus.ACCEPTED:
            with contextlib.suppress(_Cancelled):  # said by _still_open, next
                self._train(out)
            if self._still_open(out):
                self._publish(out)
                self._commit(out)
        elif task.status == TaskStatus.COMMITTED:
            damage = self._mend(task, out)
            if damage is None:
                self.games.play(out)
            self._finalize(out)  # needs no transcript
        self._withdraw(out)
        if damage is not None and task.live_games:  # a game will ask for leaves it cannot prove
            raise AgentError(f"a game of task {self.task_id} is in play and {damage}")
        return out

    @property
    def done(self) -> bool:
        """The task is settled (finalized or cancelled) and nothing is left to withdraw."""
        status = self.client.task(self.task_id).status
        return status in (TaskStatus.FINALIZED, TaskStatus.CANCELLED) and self.client.credit() == 0

    # ------------------------------------------------------------------------ before commit
    def _measure(self, task: Task) -> Estimate | None:
        """How long this node would train the task for (a step timed here, ``probe_steps``, times
        its steps) and how large its log chunks are. Only for a task still open: once its bond is
        posted, the trainer trains whatever the terms, and a restart measures nothing again."""
        if task.status != TaskStatus.OPEN:
            return None
        if self._estimate is None:
            probe = probe_steps(self.cfg, self.profile)
            self._estimate = Estimate(probe.seconds * self.cfg.steps, probe.chunk_bytes)
            log.info(
                "task %d: training its %d steps takes about %.0f s here; a log chunk is about %d bytes",
                self.task_id,
                self.cfg.steps,
                self._estimate.training_s,
                self._estimate.chunk_bytes,
            )
        return self._estimate

    def _accept(self, out: list[AgentAction]) -> None:
        """Lock the task and post the bond: from now on the client cannot cancel until the commit
        window has passed, so a commit of work done cannot be front-run by a cancel."""
        rec = self.client.accept(self.task_id)
        commit_by = self.client.task(self.task_id).commit_by
        self._emit(
            out,
            action_from_receipt(
                ACTOR,
                "accept",
                self.task_id,
                rec,
                detail=f"bond posted; commit due by block time {commit_by}",
            ),
        )

    def _complete(self) -> bool:
        if not (self.transcript_dir / MANIFEST_NAME).is_file():
            return False
        return read_manifest(self.transcript_dir).complete

    def _train(self, out: list[AgentAction]) -> None:
        if self._complete():
            return
        progress = self.progress
        looked = time.monotonic()

        def tick(done: int, total: int) -> None:
            nonlocal looked
            if progress is not None:
                progress("train", done, total)
            if time.monotonic() - looked >= CANCEL_CHECK_S:
                looked = time.monotonic()
                if self._cancelled():
                    raise _Cancelled  # the steps done are on disk: train() stops cleanly

        result = train(self.cfg, self.profile, self.transcript_dir, progress=tick, deviation=self.deviation)
        resumed = "" if result.resumed_from is None else f", resumed after step {result.resumed_from}"
        self._emit(
            out,
            AgentAction(
                ACTOR,
                "train",
                self.task_id,
                detail=f"{result.steps} steps on {self.profile}{resumed}{self._marked()}",
            ),
        )

    def _published_id(self) -> bytes | None:
        hexid = self.state.get("transcript_id")
        if not hexid:
            return None
        bid = bytes.fromhex(hexid)
        try:
            self.store.check(bid)  # there and whole: read through, not into memory
        except StoreError:
            return None
        return bid

    def _publish(self, out: list[AgentAction]) -> None:
        if self._published_id() is not None:
            return
        bid = publish_directory(
            self.store, self._sealing_key(), self.transcript_dir, progress=self._mib_progress("publish")
        )
        self.state.update(transcript_id=bid.hex())
        self._emit(out, AgentAction(ACTOR, "publish", self.task_id, detail=f"transcript {bid.hex()[:16]}..."))

    def _sealing_key(self) -> bytes:
        """The key the transcript is sealed under: the task's. (The seam a withholding trainer of the
        demo and the tests overrides: :mod:`game.strategies.withholding`.)"""
        return self.data_key

    def tree(self) -> MerkleTree:
        """The Merkle tree of this trainer's leaves (what it commits and proves against)."""
        if self._tree is None:
            self._tree = MerkleTree(Transcript(self.transcript_dir).leaves())
        return self._tree

    def log_tree(self) -> MerkleTree:
        """The Merkle tree of this trainer's log-chunk hashes (the log root; a demanded chunk is
        proved against it)."""
        if self._log_tree is None:
            self._log_tree = MerkleTree(Transcript(self.transcript_dir).chunk_hashes())
        return self._log_tree

    def _cancelled(self) -> bool:
        """Whether the chain says the client cancelled the task; a chain that does not answer now
        says nothing (training goes on, the next look may tell)."""
        try:
            return self.client.task(self.task_id).status == TaskStatus.CANCELLED
        except ContractGone:
            raise  # the chain was reset: the task is gone, hours of training for it would be wasted
        except Exception as exc:  # a look in passing must not stop the training
            log.debug("task %d: could not look at its status while training: %s", self.task_id, exc)
            return False

    def _still_open(self, out: list[AgentAction]) -> bool:
        """Whether the task still waits for this trainer's commit; a cancelled one (its commit window
        passed before the commit) is said once."""
        if self.client.task(self.task_id).status == TaskStatus.ACCEPTED:
            return True
        if not self.state.get("saw_cancel"):
            self.state.update(saw_cancel=True)
            done = steps_on_disk(self.transcript_dir)  # leaves: step 0 and the steps trained
            self._emit(
                out,
                AgentAction(
                    ACTOR,
                    "cancelled",
                    self.task_id,
                    detail=f"the client cancelled the task (its commit window had passed); nothing to "
                    f"commit ({max(done - 1, 0)} steps trained are kept in {self.transcript_dir})",
                ),
            )
        return False

    def _check_opens(self, bid: bytes, log_root: bytes) -> None:
        """The published blob opens under the task's key and holds the roots about to be committed.

        Why before the commit: a trainer whose node sealed its transcript under another key than
        the client's committed and was paid for a transcript nobody could open (issue 44). The
        key's hash was held to the task's before the accept; this opens the blob itself (its tar
        headers and manifest only: a segment or two, authenticated) and compares what it holds."""
        try:
            with SealedArchive(self.store, self.data_key, bid) as archive:
                manifest = json.loads(archive.read(MANIFEST_NAME))
        except (StoreError, ValueError) as exc:
            raise AgentError(
                f"the transcript published for task {self.task_id} does not open under the task's data "
                f"key ({exc}); not committing"
            ) from exc
        if (manifest.get("state_root"), manifest.get("log_root")) != (self.tree().root.hex(), log_root.hex()):
            raise AgentError(
                f"the transcript published for task {self.task_id} holds other roots than this trainer's "
                f"transcript in {self.transcript_dir}; not committing"
            )

    def _commit(self, out: list[AgentAction]) -> None:
        bid = self._published_id()
        assert bid is not None
        t = Transcript(self.transcript_dir)
        assert t.manifest.log_root is not None
        self._check_opens(bid, bytes.fromhex(t.manifest.log_root))
        tree = self.tree()
        rec = self.client.commit_tree(self.task_id, tree, bytes.fromhex(t.manifest.log_root), bid)
        self.state.update(commit_block=rec.block_number)
        self._emit(
            out,
            action_from_receipt(
                ACTOR,
                "commit",
                self.task_id,
                rec,
                detail=f"{tree.size} leaves, root {tree.root.hex()[:16]}...{self._marked()}",
            ),
        )

    def _restore(self) -> str | None:
        """The committed transcript put back from the store: None, or why it could not be."""
        return restore_from_store(
            self.store, self.data_key, self.client.task(self.task_id), self.transcript_dir
        )

    def _mend(self, task: Task, out: list[AgentAction]) -> str | None:
        """None once the transcript proves the leaves committed to: as it is, restored from the
        store, or, where it is gone and the store cannot give it back, trained again (the same
        leaves: training is deterministic on one profile). Otherwise what is wrong and how to
        mend it, said once as a ``damaged`` action."""
        if self._tree is not None:
            return None  # held to the commitment in this process already
        try:
            self._tree = committed_tree(self.transcript_dir, task)
            return None
        except (VGameError, OSError, ValueError) as exc:
            problem = str(exc)
        failed = restore_from_store(self.store, self.data_key, task, self.transcript_dir)
        if failed is None:
            self._tree = committed_tree(self.transcript_dir, task)
            self._emit(out, AgentAction(ACTOR, "restore", self.task_id, detail=f"{problem}; restored "
                       f"the committed transcript {task.transcript_id.hex()[:16]}... from the store"))  # fmt: skip
            return None
        if not self.transcript_dir.exists():  # nothing there to lose: train it again
            self._train(out)
            try:
                self._tree = committed_tree(self.transcript_dir, task)
                return None
            except (VGameError, OSError, ValueError) as exc:
                raise AgentError(
                    f"task {self.task_id}: trained again into {self.transcript_dir}, {exc}: was the "
                    f"task first trained on another --profile{' or --rehearse' if self.rehearsal else ''}?"
                ) from exc
        again = " and --rehearse" if self.rehearsal else ""
        damage = (
            f"this trainer cannot prove the leaves it committed: {problem}; and {failed}. To mend it, put "
            f"the blob {task.transcript_id.hex()} back into the store, or delete {self.transcript_dir} "
            f"and run this node again with the same --config, --profile{again}: it trains the task "
            "into it again (the same leaves)"
        )
        if self.state.get("damage_said") != problem:
            self.state.update(damage_said=problem)
            self._emit(out, AgentAction(ACTOR, "damaged", self.task_id, detail=damage))
        return damage

    def _marked(self) -> str:
        """What the actions of a rehearsal say after their detail: it deviates on purpose."""
        return f" (REHEARSAL {self.rehearsal}: deviates on purpose)" if self.rehearsal else ""

    def _check_rehearsal(self) -> None:
        """Keep the rehearsal this workdir was started with in its state, and refuse another one (or
        none) later: a transcript trained part honest, part deviating would commit neither."""
        if "rehearsal" not in self.state.data:
            if self.rehearsal is not None and self.transcript_dir.exists():
                raise AgentError(
                    f"{self.taskdir} holds an honest trainer's work: rehearse {self.rehearsal} in a fresh --workdir"
                )
            self.state.update(rehearsal=self.rehearsal)
            return
        was = self.state.get("rehearsal")
        if was != self.rehearsal:
            given = f"--rehearse {was}" if was else "no --rehearse"
            raise AgentError(
                f"{self.taskdir} is the workdir of {f'a rehearsal, {was}' if was else 'an honest trainer'}: "
                f"run it again with {given}, or give this trainer a fresh --workdir"
            )

    # ------------------------------------------------------------------------- the games
    def game_ids(self) -> list[int]:
        """Every game of this task (scanned from events; the scan position is kept on disk)."""
        return self.games.game_ids()

    # ---------------------------------------------------------------------------- money
    def _finalize(self, out: list[AgentAction]) -> None:
        if decide_finalize(self.client.task(self.task_id), self.client.chain.now()) is None:
            return
        try:
            rec = self.client.finalize(self.task_id)
        except VerificationGameError as exc:
            log.debug("finalize of task %d not possible yet: %s", self.task_id, exc)
            return
        paid = any(getattr(e, "trainer_paid", False) for e in rec.events_named("TaskFinalized"))
        self._emit(
            out,
            action_from_receipt(
                ACTOR,
                "finalize",
                self.task_id,
                rec,
                detail="the trainer is paid" if paid else "the trainer is not paid",
            ),
        )

    def _withdraw(self, out: list[AgentAction]) -> None:
        move = decide_withdraw(self.client.credit())
        if move is None:
            return
        rec = self.client.withdraw()
        self._emit(
            out, action_from_receipt(ACTOR, "withdraw", self.task_id, rec, detail=format_wei(move.amount))
        )


__all__ = ["TrainerAgent"]
