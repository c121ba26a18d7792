"""The auditor agent: fetch the transcript, replay it on its own profile, challenge and bisect.

Once the task is committed, :meth:`AuditorAgent.step` fetches the sealed transcript named by the
on-chain ``transcriptId``, checks it against every committed value (spec hash, state root, log
root, leaf count), replays it on the auditor's own profile with the trainer's rounding log
(``game.training.engine.audit.audit``: after a divergence the auditor keeps its own honest trajectory and
runs a step without corrections when the trainer's chunk no longer fits) and keeps its own leaves
in ``workdir/task-<id>/auditor.json``. Bisection answers come from those leaves; the game id is found again
from ``Challenged`` events, so nothing is sent twice after a crash.

Where an auditor has a choice (challenge or not, agree or not, answer at all) it asks its
:class:`AuditorStrategy`: :class:`HonestAuditor` unless it is handed another (the dishonest ones of
the demo and the tests are in ``game.strategies``, which this module never imports).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Protocol

from game import clock
from game.agents import (
    ActionSink,
    AgentAction,
    AgentError,
    NotThereYet,
    ProgressSink,
    TaskAgent,
    action_from_receipt,
    atomic_write,
    check_key,
    config_path,
    format_wei,
    games_of_task,
    write_pre_state,
)
from game.chain.client import VerificationGameClient
from game.chain.types import Game, Phase, Task, TaskStatus
from game.errors import RoundingLogError, TranscriptError, VerificationGameError
from game.protocol.solver import (
    ClaimTimeout,
    Respond,
    auditor_move,
    challenge_in_time,
    decide_challenge,
    decide_withdraw,
)
from game.store.archive import fetch_directory
from game.store.blobs import BlobNotFound, BlobStore
from game.store.sealing import StoreError
from game.training.engine.auditprogress import DEFAULT_EVERY_S
from game.training.state.leafhash import leaf_of
from game.training.transcript.reader import Transcript

log = logging.getLogger(__name__)

ACTOR = "auditor"
TRANSCRIPT_DIR = "transcript"
#: Where the replay keeps its progress, so that a node restarted after a crash goes on from there.
REPLAY_PROGRESS_DIR = "replay-progress"
#: Seconds of replay between two looks at its pace against the challenge window.
PACE_CHECK_S = 60.0


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
    ) -> None:
        super().__init__(
            client, task_id, profile=profile, workdir=workdir, store=store, data_key=data_key,
            on_action=on_action, progress=progress,
        )  # fmt: skip
        self.strategy: AuditorStrategy = strategy if strategy is not None else HonestAuditor()
        self.evidence_dir = Path(evidence_dir) if evidence_dir is not None else None
        self.save_every_s = save_every_s  # wall time between two saves of the replay's progress

    @property
    def transcript_dir(self) -> Path:
        return self.taskdir / TRANSCRIPT_DIR

    @property
    def verdict(self) -> str | None:
        """ "match" when its replay reproduced the committed root, "mismatch" when not, None before."""
        v = self.state.get("verdict")
        return str(v) if v is not None else None

    @property
    def leaves(self) -> list[bytes]:
        """The auditor's own leaves (empty before the replay)."""
        return [bytes.fromhex(h) for h in self.state.get("leaves", [])]

    def _answers(self) -> list[bytes]:
        """The leaves the auditor answers a bisection by: its own, except that for an asynchronous
        task every leaf from its first divergent one on is one no state has, so the game pins that
        update. Why: an update there computes on older states (its schedule names them), which the
        judge takes from the trainer's tree; at the first divergent update all of them are honest,
        where at a later pair whose pre-state agrees again some need not be."""
        leaves = self.leaves
        first = self.state.get("first_divergent_step")
        if not self.state.get("scheduled") or first is None:
            return leaves
        from game.training.engine.schedaudit import rejected_schedule_leaf

        return leaves[:first] + [rejected_schedule_leaf(i) for i in range(first, len(leaves))]

    # ------------------------------------------------------------------------------- step
    def step(self) -> list[AgentAction]:
        """Do everything due now; returns what was done (empty when nothing was due)."""
        out: list[AgentAction] = []
        self.state.bind(self.client, self.home)
        task = self.client.task(self.task_id)
        check_key(ACTOR, self.task_id, task, self.client.me)
        if task.status in (TaskStatus.COMMITTED, TaskStatus.FINALIZED):
            if self.verdict is None:
                try:
                    self._replay(task, out)
                except NotThereYet as exc:
                    now = self.client.chain.now()
                    if task.status == TaskStatus.COMMITTED and not clock.window_closed(now, task.window_ends):
                        raise  # a lagging store: wait for it while a challenge can still come
                    # waiting on would never end, and "done" would read as "audited"
                    raise AgentError(
                        f"task {self.task_id}: the challenge window closed before the trainer's "
                        "transcript reached the store, so nothing was audited in time and the trainer is "
                        "paid as if it had been: tell the client (run this again once the store holds "
                        f"the transcript to replay it all the same) ({exc})"
                    ) from exc
            if task.status == TaskStatus.COMMITTED:
                self._maybe_challenge(task, out)
                for gid in self.game_ids():
                    self._play(gid, out)
        self._withdraw(out)
        return out

    @property
    def done(self) -> bool:
        """Nothing left to do: the task is settled or decided on, own games ended, credit withdrawn."""
        task = self.client.task(self.task_id)
        if task.status == TaskStatus.CANCELLED:
            return self.client.credit() == 0
        if task.status == TaskStatus.OPEN or self.verdict is None:
            return False
        games = self.game_ids()
        if any(self.client.game(g).phase != Phase.ENDED for g in games):
            return False
        if self.client.credit() != 0:
            return False
        if games or task.status == TaskStatus.FINALIZED:
            return True
        # no game: done unless it still means to challenge while the window is open
        return not self._wants_challenge(task) or not challenge_in_time(task, self.client.chain.now())

    # ------------------------------------------------------------------------- replay
    def _fetch(self, task: Task) -> Transcript:
        """The committed transcript, fetched once, checked against every committed value. A copy
        that an earlier run fetched and that no longer verifies is fetched again, once: its files
        are not synced, so a machine that stopped before they reached its disk leaves them cut
        short, and the store still holds the blob."""
        if self.state.get("fetched") == task.transcript_id.hex():
            try:
                return self._checked(task)
            except TranscriptError as exc:
                log.warning(
                    "task %d: the transcript fetched before no longer verifies (%s); fetching it again",
                    self.task_id, exc,
                )  # fmt: skip
        self._download(task)
        try:
            return self._checked(task)
        except TranscriptError as exc:
            raise AgentError(f"the transcript of task {self.task_id} is damaged: {exc}") from exc

    def _download(self, task: Task) -> None:
        """Fetch the blob into a directory of its own that takes the transcript's name once whole."""
        tmp = self.taskdir / ".fetching"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            fetch_directory(
                self.store, self.data_key, task.transcript_id, tmp, progress=self._mib_progress("fetch")
            )
        except BlobNotFound as exc:
            raise NotThereYet(
                f"the transcript of task {self.task_id} is not in the store yet ({exc}); trying again "
                "each round (is --store the one the trainer publishes to?)"
            ) from exc
        except StoreError as exc:
            raise AgentError(f"cannot get the transcript of task {self.task_id}: {exc}") from exc
        shutil.rmtree(self.transcript_dir, ignore_errors=True)
        tmp.rename(self.transcript_dir)
        self.state.update(fetched=task.transcript_id.hex())

    def _checked(self, task: Task) -> Transcript:
        """The fetched transcript, verified (a :class:`TranscriptError` where a file is damaged or
        missing) and held to the task's on-chain values (an :class:`AgentError` where one differs)."""
        t = Transcript(self.transcript_dir)
        t.verify()
        m = t.manifest
        checks = (
            ("spec hash", t.spec_hash, task.spec_hash),
            ("state root", bytes.fromhex(m.state_root or ""), task.state_root),
            ("log root", bytes.fromhex(m.log_root or ""), task.log_root),
            ("leaf count", m.num_leaves, task.num_leaves),
        )
        for what, theirs, onchain in checks:
            if theirs != onchain:
                raise AgentError(
                    f"the published transcript's {what} is not the one committed for task {self.task_id}"
                )
        return t

    def _replay(self, task: Task, out: list[AgentAction]) -> None:
        from game.training.engine.audit import audit

        self._fetch(task)
        progress = self.progress
        pace = _Pace(self.client, task, self.task_id)

        def tick(done: int, total: int) -> None:
            if progress is not None:
                progress("replay", done, total)
            pace.step(done, total)

        result = audit(
            self.transcript_dir,
            self.profile,
            use_log=True,
            progress=tick,
            keep_progress=self.taskdir / REPLAY_PROGRESS_DIR,
            save_every_s=self.save_every_s,
        )
        verdict = "match" if result.match else "mismatch"
        self.state.update(
            leaves=[h.hex() for h in result.leaves],
            verdict=verdict,
            first_divergent_step=result.first_divergent_step,
            scheduled=Transcript(self.transcript_dir).config.scheduled,
        )
        detail = f"{verdict} on {self.profile}, {result.corrections} corrections"
        if result.resumed_from is not None:
            detail += f" (went on from step {result.resumed_from}, saved before a restart)"
        if result.first_divergent_step is not None:
            detail += f", first divergent step {result.first_divergent_step}"
        if result.rejected_log_steps:
            detail += f"; log rejected at step {result.rejected_log_steps[0]}: {result.log_errors[0]}"
        self._emit(out, AgentAction(ACTOR, "replay", self.task_id, detail=detail))

    # ----------------------------------------------------------------------- challenge
    def _wants_challenge(self, task: Task) -> bool:
        leaves = self.leaves
        decision = decide_challenge(task.first_leaf, task.last_leaf, task.num_leaves, leaves)
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
        if self.game_ids() or not self._wants_challenge(task):
            return
        if not challenge_in_time(task, self.client.chain.now()):
            log.warning("task %d: the window closed before this auditor could challenge", self.task_id)
            return
        dispute_init = self._dispute_init(task)
        try:
            rec = self.client.challenge(self.task_id, dispute_init)
        except VerificationGameError as exc:
            log.warning("challenge of task %d refused: %s", self.task_id, exc)
            return
        gid = rec.result
        if gid is not None:
            self.state.update(games=[*self.state.get("games", []), gid])
        self._emit(
            out,
            action_from_receipt(
                ACTOR,
                "challenge",
                self.task_id,
                rec,
                game_id=gid,
                leaf_index=0 if dispute_init else None,
                detail="dispute the initial state" if dispute_init else f"[0, {task.num_leaves - 1}]",
            ),
        )

    # --------------------------------------------------------------------------- play
    def _play(self, gid: int, out: list[AgentAction]) -> None:
        g = self.client.game(gid)
        if g.phase == Phase.ENDED:
            return
        move = auditor_move(g, self.client.chain.now(), self.client.deadline(gid), self._answers())
        silent = self.strategy.silent_once_challenged
        if g.phase == Phase.PINNED and not silent:
            self._leave_evidence(gid, g, out)
        if isinstance(move, Respond) and not silent:
            self._respond(gid, g, move, out)
        elif isinstance(move, ClaimTimeout):
            self._timeout(
                gid, "trainer silent" if move.silent == "trainer" else "judge silent: game void", out
            )

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
        t = Transcript(self.transcript_dir)
        if g.dispute_init:
            path = config_path(self.evidence_dir, t.spec_hash)
            atomic_write(path, json.dumps(t.config.to_dict(), sort_keys=True).encode())
            detail = "task config for step 0"
        else:
            states = self._own_states(t, g.lo, g.hi)
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

    def _own_states(self, t: Transcript, lo: int, hi: int) -> dict[int, bytes]:
        """Own canonical states after ``lo`` and, for an asynchronous task, after each older step
        update ``hi``'s schedule computes on (by own replay with the trainer's log)."""
        if not t.config.scheduled:
            return {lo: self._own_state_bytes(t, lo)}
        from game.training.engine.scheduled import states_for
        from game.training.engine.step import StepEngine
        from game.training.task.profiles import get_profile

        try:
            wanted = {lo, *t.schedule()[hi - 1].versions}
        except RoundingLogError:  # a schedule that does not parse: the judge needs the pre-state only
            wanted = {lo}
        engine = StepEngine(t.config, get_profile(self.profile))
        return states_for(t, engine, wanted, check_leaves=False)[1]

    def _own_state_bytes(self, t: Transcript, step: int) -> bytes:
        """Own canonical state after ``step``, replayed on own profile with the trainer's log."""
        from game.training.engine.states import decode_state
        from game.training.engine.step import StepEngine
        from game.training.state.canonical import encode_state
        from game.training.task.profiles import get_profile

        engine = StepEngine(t.config, get_profile(self.profile))
        try:
            start = t.nearest_checkpoint(step)
            state = decode_state(t.load_checkpoint(start), t.config)
        except TranscriptError:
            start, state = 0, engine.init_state()
        for s in range(start + 1, step + 1):
            engine.run_step(state, s, mode="replay", log=t.read_log(s), hash_state=False)
        return encode_state(state)

    # ---------------------------------------------------------------------------- money
    def _withdraw(self, out: list[AgentAction]) -> None:
        move = decide_withdraw(self.client.credit())
        if move is None:
            return
        rec = self.client.withdraw()
        self._emit(
            out, action_from_receipt(ACTOR, "withdraw", self.task_id, rec, detail=format_wei(move.amount))
        )


class _Pace:
    """Warns, once, when the replay will not end before the challenge window closes: told early,
    the operator can move it to a faster machine or profile instead of finding out at the end.
    Only on a real-time chain (a chain with time travel runs on the tests' clock)."""

    def __init__(self, client: VerificationGameClient, task: Task, task_id: int) -> None:
        self.client, self.window_ends, self.task_id = client, task.window_ends, task_id
        self.live = not client.chain.supports_time_travel and task.window_ends > 0
        self.started = time.monotonic()
        self.looked = self.started
        self.first: int | None = None  # the first step this run replayed (a resumed one starts late)

    def step(self, done: int, total: int) -> None:
        if self.first is None:
            self.first, self.started = done, time.monotonic()
            return
        now = time.monotonic()
        if not self.live or now - self.looked < PACE_CHECK_S or done <= self.first:
            return
        self.looked = now
        rate = (done - self.first) / (now - self.started)
        try:
            chain_now = self.client.chain.now()
        except Exception:  # a look in passing: the next one may get through
            return
        ends = clock.after(chain_now, (total - done) / rate)
        if clock.is_ahead(self.window_ends, ends):
            self.live = False
            log.warning(
                "task %d: at %.2f steps a second the replay ends %s, after the challenge window "
                "closes %s: a challenge would come too late; replay on a faster machine or profile",
                self.task_id,
                rate,
                _when(int(ends), chain_now),
                _when(self.window_ends, chain_now),
            )


def _when(t: int, now: int) -> str:
    ahead = max(clock.seconds_until(now, t), 0)
    return f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(t))} (in {ahead // 3600}h {ahead % 3600 // 60}m)"


__all__ = ["AuditorAgent", "AuditorStrategy", "HonestAuditor"]
