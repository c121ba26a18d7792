"""An auditor's replay: the committed transcript fetched, held to the chain's values, and replayed.

Apart from :mod:`auditor_node.agent` (what is due now: challenge, play, claim, withdraw) because this
is the long work of one of its steps, with failure modes of its own: the transcript is gigabytes at
paper size, a copy fetched before a crash may be cut short (it is fetched again, once), a transcript
that is not the one committed or does not open under the task's key is the trainer's fault
(:class:`~auditor_node.availability.TranscriptUnusable`), and a replay too slow for the challenge
window is said early (:class:`_Pace`). The agent's own state after a step, handed to the judge as
evidence, is a replay too (:meth:`TranscriptReplay.state_after`). It is handed the agent as the
shared :class:`~game.agents.TaskAgent`, so it never imports :mod:`auditor_node.agent`.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from auditor_node.availability import TranscriptUnusable
from game import clock
from game.agents import AgentAction, NotThereYet, TaskAgent
from game.chain.client import VerificationGameClient
from game.chain.types import Task
from game.errors import RoundingLogError, TranscriptError
from game.store.archive import fetch_directory
from game.store.blobs import BlobNotFound
from game.store.sealing import StoreError
from game.training.transcript.reader import Transcript

log = logging.getLogger(__name__)

TRANSCRIPT_DIR = "transcript"
#: Where the replay keeps its progress, so that a node restarted after a crash goes on from there.
REPLAY_PROGRESS_DIR = "replay-progress"
#: Seconds of replay between two looks at its pace against the challenge window.
PACE_CHECK_S = 60.0


class TranscriptReplay:
    """One auditor's copy of its task's transcript: fetched once, checked, replayed on its profile."""

    def __init__(self, agent: TaskAgent) -> None:
        self.agent = agent

    @property
    def transcript_dir(self) -> Path:
        return self.agent.taskdir / TRANSCRIPT_DIR

    def fetch(self, task: Task) -> Transcript:
        """The committed transcript, fetched once, checked against every committed value. A copy
        that an earlier run fetched and that no longer verifies is fetched again, once: its files
        are not synced, so a machine that stopped before they reached its disk leaves them cut
        short, and the store still holds the blob."""
        agent = self.agent
        if agent.state.get("fetched") == task.transcript_id.hex():
            try:
                return self._checked(task)
            except TranscriptError as exc:
                log.warning(
                    "task %d: the transcript fetched before no longer verifies (%s); fetching it again",
                    agent.task_id, exc,
                )  # fmt: skip
        self._download(task)
        try:
            return self._checked(task)
        except TranscriptError as exc:
            raise TranscriptUnusable(f"the transcript of task {agent.task_id} is damaged: {exc}") from exc

    def _download(self, task: Task) -> None:
        """Fetch the blob into a directory of its own that takes the transcript's name once whole."""
        agent = self.agent
        tmp = agent.taskdir / ".fetching"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            fetch_directory(
                agent.store, agent.data_key, task.transcript_id, tmp, progress=agent._mib_progress("fetch")
            )
        except BlobNotFound as exc:
            raise NotThereYet(
                f"the transcript of task {agent.task_id} is not in the store yet ({exc}); trying again "
                "each round (is --store the one the trainer publishes to?)"
            ) from exc
        except StoreError as exc:  # the key is the task's (checked first): the blob does not open
            raise TranscriptUnusable(
                f"the transcript of task {agent.task_id} does not open under the task's data key: {exc}"
            ) from exc
        shutil.rmtree(self.transcript_dir, ignore_errors=True)
        tmp.rename(self.transcript_dir)
        agent.state.update(fetched=task.transcript_id.hex())

    def _checked(self, task: Task) -> Transcript:
        """The fetched transcript, verified (a :class:`TranscriptError` where a file is damaged or
        missing) and held to the task's on-chain values (a :class:`TranscriptUnusable` where one
        differs: the trainer published another transcript than the one it committed to)."""
        t = Transcript(self.transcript_dir, spec_hash=task.spec_hash)  # nothing else loaded
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
                raise TranscriptUnusable(
                    f"the published transcript's {what} is not the one committed for task {self.agent.task_id}"
                )
        return t

    def run(self, task: Task, out: list[AgentAction], *, save_every_s: float) -> None:
        """Fetch, check and replay with the trainer's log; the leaves and the verdict go to the
        agent's state (``save_every_s``: wall time between two saves of the replay's progress)."""
        from game.training.engine.audit import audit

        agent = self.agent
        self.fetch(task)
        progress = agent.progress
        pace = _Pace(agent.client, task, agent.task_id)

        def tick(done: int, total: int) -> None:
            if progress is not None:
                progress("replay", done, total)
            pace.step(done, total)

        result = audit(
            self.transcript_dir,
            agent.profile,
            use_log=True,
            progress=tick,
            keep_progress=agent.taskdir / REPLAY_PROGRESS_DIR,
            save_every_s=save_every_s,
        )
        verdict = "match" if result.match else "mismatch"
        agent.state.update(
            leaves=[h.hex() for h in result.leaves],
            verdict=verdict,
            first_divergent_step=result.first_divergent_step,
            scheduled=Transcript(self.transcript_dir).config.scheduled,
        )
        detail = f"{verdict} on {agent.profile}, {result.corrections} corrections"
        if result.resumed_from is not None:
            detail += f" (went on from step {result.resumed_from}, saved before a restart)"
        if result.first_divergent_step is not None:
            detail += f", first divergent step {result.first_divergent_step}"
        if result.rejected_log_steps:
            detail += f"; log rejected at step {result.rejected_log_steps[0]}: {result.log_errors[0]}"
        agent._emit(out, AgentAction(agent.ACTOR, "replay", agent.task_id, detail=detail))

    def states(self, t: Transcript, lo: int, hi: int) -> dict[int, bytes]:
        """Own canonical states after ``lo`` and, for an asynchronous task, after each older step
        update ``hi``'s schedule computes on (by own replay with the trainer's log)."""
        if not t.config.scheduled:
            return {lo: self.state_after(t, lo)}
        from game.training.dispatch.profiles import get_profile
        from game.training.engine.scheduled import states_for
        from game.training.engine.step import StepEngine

        try:  # the pinned update's entry alone: another update's, broken, is no matter here
            entry = t.update_entry(hi)
            wanted = {lo, *(entry.versions if entry is not None else ())}
        except RoundingLogError:  # its schedule does not parse: the judge needs the pre-state only
            wanted = {lo}
        engine = StepEngine(t.config, get_profile(self.agent.profile), checks="audit")  # as the audit ran
        return states_for(t, engine, wanted, check_leaves=False)[1]

    def state_after(self, t: Transcript, step: int) -> bytes:
        """Own canonical state after ``step``, replayed on own profile with the trainer's log (a
        step whose chunk does not decode or fit without it, as the audit ran it)."""
        from game.training.dispatch.profiles import get_profile
        from game.training.engine.replay import own_start, replayed
        from game.training.engine.step import StepEngine
        from game.training.state.canonical import encode_state

        engine = StepEngine(t.config, get_profile(self.agent.profile), checks="audit")  # as the audit ran
        return encode_state(replayed(t, engine, own_start(t, engine, step), step, check_leaves=False))


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


__all__ = ["PACE_CHECK_S", "REPLAY_PROGRESS_DIR", "TRANSCRIPT_DIR", "TranscriptReplay"]
