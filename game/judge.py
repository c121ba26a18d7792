"""The judge: re-run the single pinned step on its own profile and post the resulting state hash.

Why it verifies everything first: the judge's ruling moves bonds, so it must be computed from
inputs the chain itself vouches for. The config must hash to the task's spec hash; the log chunk
of the step must hash to leaf ``step`` of the log tree whose root was committed (checked with a
Merkle proof built from the transcript's chunk hashes); the pre-state must hash to the game's agreed
leaf. Bad evidence raises an :class:`EvidenceError` naming what failed and never becomes a ruling;
a judge that cannot gather valid evidence does not rule, and after the judge deadline anyone can
void the game.

Evidence comes from the published transcript (only the files the step needs, decrypted with the
data key) and, for the pre-state,
from an evidence directory where anyone may leave state bytes under their hash (the auditor does);
without one the judge rebuilds the pre-state from the transcript's nearest checkpoint, itself
checked against the committed state tree, by replaying with the trainer's log.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from game.agents import (
    ACTION_LOG,
    ActionSink,
    AgentAction,
    StateFile,
    action_from_receipt,
    check_key,
    next_scan_from,
)
from game.chain.client import VerificationGameClient
from game.chain.types import Game, Phase, Task, TaskStatus
from game.chainevidence import evidence_on_chain
from game.errors import (
    ConfigError,
    RoundingLogError,
    TrainingError,
    TranscriptError,
    VerificationGameError,
    VGameError,
)
from game.evidence import (
    ChunkEvidenceError,
    ConfigEvidenceError,
    Evidence,
    EvidenceError,
    PreStateEvidenceError,
    Ruling,
    TranscriptEvidenceError,
    VersionEvidenceError,
    versions_named,
)
from game.evidencedir import left_state, read_task_config
from game.fsio import atomic_write
from game.judgeupdate import (
    find_witness,
    rebuilt_state,
    rerun_step,
    rerun_update,
    staleness_of,
)
from game.merkle import InclusionProof, MerkleTree
from game.protocol.solver import initial_state_disputed, judge_move, pinned_step
from game.store.archive import SealedArchive
from game.store.blobs import BlobStore
from game.store.keys import key_hash
from game.store.sealing import StoreError
from game.training.engine.memory import trimmed
from game.training.task.config import TaskConfig
from game.training.transcript.layout import MANIFEST_NAME, chunk_relpath
from game.training.transcript.reader import Transcript, files_up_to, step_files

if TYPE_CHECKING:
    from game.training.engine.step import StepEngine

log = logging.getLogger(__name__)

ACTOR = "judge"
STATE_NAME = "judge.json"


#: A judge's fetched copy lists the archive's files here (not a transcript file: a dot-name).
_LISTING = ".archive-names.json"


class Judge:
    """Rules on every pinned game of the tasks that name this account as judge."""

    def __init__(
        self,
        client: VerificationGameClient,
        *,
        profile: str,
        workdir: Path,
        store: BlobStore,
        data_key: bytes,
        evidence_dir: Path | None = None,
        on_action: ActionSink | None = None,
        task_id: int | None = None,
    ) -> None:
        self.client = client
        self.profile = profile
        self.workdir = Path(workdir)
        self.store = store
        self.data_key = data_key
        self.evidence_dir = Path(evidence_dir) if evidence_dir is not None else None
        self.on_action = on_action
        self.task_id = task_id  # only this task (a node started with --task); None: every task
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state = StateFile(self.workdir / STATE_NAME)
        self.last_errors: dict[int, VGameError] = {}  # why a game got no ruling
        self._key_checked = False  # this key is the task's judge (asked once, at the first step)
        #: Pins of games other judges rule on, by (game, task, transaction): a rescan asks the chain
        #: about each once (a pin a reorganisation moved to another game or task is asked again).
        self._others: set[tuple[int, int, str]] = set()

    @property
    def home(self) -> Path:
        """The directory this judge writes (state, fetched transcripts): one running node's alone."""
        return self.workdir

    # ------------------------------------------------------------------------------- step
    def step(self) -> list[AgentAction]:
        """Rule on every pinned game of ours whose judge deadline has not passed."""
        out: list[AgentAction] = []
        self.state.bind(self.client, self.home)
        if self.task_id is not None and not self._key_checked:  # a judge of every task rules on
            check_key(ACTOR, self.task_id, self.client.task(self.task_id), self.client.me)  # what names it
            self._key_checked = True
        for gid in self.pinned_games():
            g = self.client.game(gid)
            if (
                g.phase != Phase.PINNED
                or judge_move(g, self.client.chain.now(), self.client.deadline(gid)) is None
            ):
                continue
            try:
                ruling = self.rule_on(gid)
            except EvidenceError as exc:
                self._no_ruling(gid, exc, "")
                continue
            except (ConfigError, TrainingError) as exc:
                # the trainer's transcript or task, not this judge, failed (a manifest naming a task
                # module this machine lacks, a file the reader refuses): no ruling on this game, and
                # every other pinned game, of any task, is still ruled on
                self._no_ruling(gid, exc, "the task or its transcript failed: ")
                continue
            except VerificationGameError as exc:
                log.warning("game %d: ruling refused: %s", gid, exc)
                continue
            assert ruling.tx is not None
            who = "trainer" if ruling.trainer_right else "auditor"
            action = action_from_receipt(
                ACTOR,
                "rule",
                g.task_id,
                ruling.tx,
                game_id=gid,
                leaf_index=ruling.step,
                detail=f"step {ruling.step}: computed {ruling.computed.hex()[:12]}..., {who} right"
                + (f" ({ruling.note})" if ruling.note else ""),
            )
            out.append(action)
            ACTION_LOG.info("judge: %s", action.detail)
            if self.on_action is not None:
                self.on_action(action)
        self._drop_settled_transcripts()
        return out

    def _drop_settled_transcripts(self) -> None:
        """Delete the fetched copies of settled tasks' transcripts: a settled task takes no more
        pins, the store keeps the sealed blob, and a judge of every task would otherwise keep a
        decrypted copy of every transcript it ever ruled on (each as large as the training's log)."""
        fetched: dict[str, str] = dict(self.state.get("fetched", {}))
        settled = [
            tid
            for tid in fetched
            if self.client.task(int(tid)).status in (TaskStatus.FINALIZED, TaskStatus.CANCELLED)
        ]
        for tid in settled:
            shutil.rmtree(self.workdir / "transcripts" / tid, ignore_errors=True)
            del fetched[tid]
        if settled:
            self.state.update(fetched=fetched)

    @property
    def done(self) -> bool:
        """Only a judge bound to one task is ever done: once that task is settled."""
        if self.task_id is None:
            return False
        return self.client.task(self.task_id).status in (TaskStatus.FINALIZED, TaskStatus.CANCELLED)

    def _no_ruling(self, gid: int, exc: VGameError, what: str) -> None:
        """Say why game ``gid`` got no ruling this round: a warning once the same reason comes
        again. The first time it is often passing: an auditor leaves its evidence on the step after
        the move that pinned the game, which may be this same round."""
        again = gid in self.last_errors and str(self.last_errors[gid]) == str(exc)
        self.last_errors[gid] = exc
        log.log(logging.WARNING if again else logging.INFO, "game %d: no ruling: %s%s", gid, what, exc)

    def pinned_games(self) -> list[int]:
        """Games pinned so far on tasks this account judges (scan position kept on disk)."""
        known: list[int] = list(self.state.get("games", []))
        start = int(self.state.get("scan_from", 0))
        last = self.client.chain.block_number()
        if last < start:
            return known
        filters = {} if self.task_id is None else {"task_id": self.task_id}
        new: list[int] = []
        for ev in self.client.get_events("StepPinned", start, last, **filters):
            gid = int(ev.game_id)  # type: ignore[attr-defined]
            pin = (gid, int(ev.task_id), ev.tx_hash)  # type: ignore[attr-defined]
            if gid in known or gid in new or pin in self._others:  # the newest blocks are scanned
                continue  # again every round (reorganisations)
            if self.client.task(pin[1]).judge.lower() == self.client.me.lower():
                new.append(gid)
            else:
                self._others.add(pin)
        nxt = next_scan_from(start, last)
        if new or nxt != start:
            self.state.update(games=known + new, scan_from=nxt)
        return known + new

    # ---------------------------------------------------------------------------- ruling
    def rule_on(self, game_id: int, evidence: Evidence | None = None) -> Ruling:
        """Verify the evidence (gathered when not given), compute the step, post the ruling."""
        ruling = self.evaluate(game_id, evidence)
        tx = self.client.rule(game_id, ruling.computed)
        return Ruling(
            ruling.game_id,
            ruling.step,
            ruling.computed,
            ruling.trainer_leaf,
            ruling.trainer_right,
            tx,
            ruling.note,
        )

    def evaluate(self, game_id: int, evidence: Evidence | None = None) -> Ruling:
        """The ruling the judge would post (nothing is sent); raises EvidenceError on bad evidence."""
        g = self.client.game(game_id)
        if g.phase != Phase.PINNED:
            raise EvidenceError(f"game {game_id} is in phase {g.phase.name}, not pinned: nothing to rule on")
        task = self.client.task(g.task_id)
        with trimmed():  # a judge of every task idles on after: give the step's memory back
            ev = evidence if evidence is not None else self.gather(game_id)
            ev.check(g, task)
            computed, note = self._compute(g, ev)
        return Ruling(game_id, pinned_step(g), computed, g.hi_leaf, computed == g.hi_leaf, note=note)

    # ------------------------------------------------------------------------ computing
    def _engine(self, cfg: TaskConfig) -> StepEngine:
        from game.training.engine.step import engine_for

        # it rebuilds agreed states; the ruling's own step checks by the rule (judgeupdate.rerun_step)
        return engine_for(cfg, self.profile, checks="rebuild")

    def _compute(self, g: Game, ev: Evidence) -> tuple[bytes, str]:
        from game.training.state.leaves import state_hash

        engine = self._engine(ev.config)
        if initial_state_disputed(g):
            return state_hash(engine.init_state()), ""
        assert ev.pre_state is not None
        step = pinned_step(g)
        if ev.config.scheduled:
            versions = {**ev.replayed, **{v: data for v, (data, _) in ev.versions.items()}}
            earlier = {w: data for w, (data, _) in ev.earlier.items()}
            return rerun_update(engine, ev.pre_state, versions, ev.chunk, step, earlier)
        # a chunk that breaks the bands, does not decode or does not fit is never ruled for
        return rerun_step(engine, ev.pre_state, ev.chunk, step)

    # ------------------------------------------------------------------------ gathering
    def gather(self, game_id: int) -> Evidence:
        """Collect the evidence for a pinned game from the transcript and the evidence directory."""
        g = self.client.game(game_id)
        task = self.client.task(g.task_id)
        config_only = initial_state_disputed(g)
        left = None if config_only else self._left_state(g.lo_leaf)
        t: Transcript | None
        try:
            t = self._transcript(
                g.task_id, task, None if config_only else pinned_step(g), rebuild=left is None
            )
        except TranscriptEvidenceError as exc:
            if not config_only:
                return self._from_chain(g, task, left, exc)
            t = None
        if config_only:
            return Evidence(config=self._config(task, t))
        assert t is not None
        step = pinned_step(g)
        hashes = t.chunk_hashes()
        try:
            chunk = t.chunk_bytes(step)
        except (TranscriptError, RoundingLogError) as exc:
            raise ChunkEvidenceError(f"the transcript's chunk of step {step} is unusable: {exc}") from exc
        proof = MerkleTree(hashes).proof(step)
        pre_state = left if left is not None else self._rebuild(g, task, t, g.lo, g.lo_leaf)
        versions: dict[int, tuple[bytes, InclusionProof]] = {}
        named = [v for v in versions_named(t.config, chunk, step) if v != g.lo]
        if named:
            tree = MerkleTree(t.leaves())
            left_states = {v: self._left_state(t.leaf(v)) for v in named}
            if left is not None and None in left_states.values():
                # the pre-state was left and the files to rebuild from not fetched: fetch them now
                # (anyone may leave states, a liar the pre-state alone)
                t = self._transcript(g.task_id, task, step, rebuild=True)
            for v in named:
                data = left_states[v] or self._rebuild(g, task, t, v, t.leaf(v))
                versions[v] = (data, tree.proof(v))
        earlier: dict[int, tuple[bytes, InclusionProof]] = {}
        if t.config.scheduled and step > 1:  # a micro-batch applied again: the chunk that applied it
            t = self._transcript(g.task_id, task, step, extra=[chunk_relpath(w) for w in range(1, step)])
            found = find_witness(t, chunk, step)
            if found is not None:
                earlier[found[0]] = (found[1], MerkleTree(hashes).proof(found[0]))
        return Evidence(
            config=t.config,
            chunk=chunk,
            chunk_proof=proof,
            pre_state=pre_state,
            versions=versions,
            earlier=earlier,
        )

    def _transcript(
        self,
        task_id: int,
        task: Task,
        step: int | None = None,
        *,
        rebuild: bool = False,
        extra: Sequence[str] = (),
        whole: bool = False,
    ) -> Transcript:
        """The task's published transcript, its roots checked against the chain, holding the
        files that re-running ``step`` needs (:func:`~game.training.transcript.reader.step_files`).

        Only those files are decrypted and written (``workdir/transcripts/N``, kept until the
        task is settled, gaining files as other games of it need them): a judge re-runs one step,
        and the transcript's checkpoints are each the model's whole state.
        """
        if task.key_hash != key_hash(self.data_key):
            # the judge's own mistake, said as such: "does not open" would blame the trainer
            raise TranscriptEvidenceError(
                f"this judge's data key is not task {task_id}'s (the task's key hashes to "
                f"{task.key_hash.hex()[:16]}...): get the task's key from its client"
            )
        dest = self.workdir / "transcripts" / str(task_id)
        marker: dict[str, str] = dict(self.state.get("fetched", {}))
        listing = dest / _LISTING
        names: set[str] | None = None
        if marker.get(str(task_id)) == task.transcript_id.hex() and listing.is_file():
            names = set(json.loads(listing.read_text("utf-8")))
        else:
            shutil.rmtree(dest, ignore_errors=True)  # none yet, or one a crash cut short

        def wanted(names: set[str]) -> list[str]:
            if whole and step is not None:  # every file up to the step: a rebuild from any start
                files = files_up_to(names, step)
            else:
                files = step_files(names, step, rebuild=rebuild, back=staleness_of(dest))
            return files + [n for n in extra if n in names and n not in files]

        if names is None or any(not (dest / n).is_file() for n in wanted(names)):
            try:
                with SealedArchive(self.store, self.data_key, task.transcript_id) as archive:
                    if names is None:
                        names = set(archive.names())
                        dest.mkdir(parents=True, exist_ok=True)
                        atomic_write(listing, json.dumps(sorted(names)).encode())
                        self.state.update(fetched={**marker, str(task_id): task.transcript_id.hex()})
                    if MANIFEST_NAME in names and not (dest / MANIFEST_NAME).is_file():
                        archive.extract(MANIFEST_NAME, dest)  # first: it says how far back to reach
                    for name in wanted(names):
                        if not (dest / name).is_file():
                            archive.extract(name, dest)
            except StoreError as exc:
                raise TranscriptEvidenceError(f"cannot get the transcript of task {task_id}: {exc}") from exc
        try:
            t = Transcript(dest, spec_hash=task.spec_hash)  # nothing of another task's config loaded
            leaves, hashes = t.leaves(), t.chunk_hashes()
        except (VGameError, ValueError) as exc:  # its manifest's config too (a task module not here)
            raise TranscriptEvidenceError(f"the transcript of task {task_id} is unreadable: {exc}") from exc
        if len(leaves) != task.num_leaves or MerkleTree(leaves).root != task.state_root:
            raise TranscriptEvidenceError(
                f"the transcript's leaves are not the committed state tree of task {task_id}"
            )
        if len(hashes) != task.num_leaves or MerkleTree(hashes).root != task.log_root:
            raise TranscriptEvidenceError(
                f"the transcript's chunk hashes are not the committed log tree of task {task_id}"
            )
        return t

    def _from_chain(self, g: Game, task: Task, left: bytes | None, why: TranscriptEvidenceError) -> Evidence:
        """The evidence from the log on-chain where the transcript cannot be had (``why``, raised
        where the log is not whole there: :func:`game.chainevidence.evidence_on_chain`)."""
        return evidence_on_chain(
            self.client, g, task, lambda: self._config(task, None), left, self.profile, why
        )

    def _config(self, task: Task, t: Transcript | None) -> TaskConfig:
        if t is not None:
            return t.config
        if self.evidence_dir is not None:
            try:  # anyone may leave one: held to the task's spec hash before it is loaded
                cfg = read_task_config(self.evidence_dir, task.spec_hash)
            except ConfigError as exc:
                raise ConfigEvidenceError(str(exc)) from exc
            if cfg is not None:
                return cfg
        raise ConfigEvidenceError("no task config: the transcript is unavailable and no config was left")

    def _left_state(self, leaf: bytes) -> bytes | None:
        """State bytes hashing to ``leaf`` that someone left in the evidence directory."""
        return None if self.evidence_dir is None else left_state(self.evidence_dir, leaf)

    def _rebuild(self, g: Game, task: Task, t: Transcript, step: int, want: bytes) -> bytes:
        """State bytes after ``step`` that hash to ``want``, replayed through the trainer's chunks
        from its nearest checkpoint; where that fails (a checkpoint missing or altered: nothing on
        the chain checks them, and without evidence the game went void), again with every file up
        to ``step`` fetched, from the latest checkpoint that loads or else the initial state. The
        state reached is held to ``want`` whatever it started from."""
        try:
            return rebuilt_state(t, self._engine(t.config), step, want)
        except PreStateEvidenceError as exc:
            log.warning("%s; fetching every file up to step %d to rebuild it from further back", exc, step)
        t = self._transcript(g.task_id, task, step, whole=True)
        return rebuilt_state(t, self._engine(t.config), step, want)


__all__ = [
    "ChunkEvidenceError",
    "ConfigEvidenceError",
    "Evidence",
    "EvidenceError",
    "Judge",
    "PreStateEvidenceError",
    "Ruling",
    "TranscriptEvidenceError",
    "VersionEvidenceError",
]
