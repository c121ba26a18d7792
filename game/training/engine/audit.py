"""The auditor's loop (Algorithm 3): re-train on its own profile with the trainer's log, compare roots.

Every step the auditor reaches is hashed one step late on a thread of its own
(:class:`~game.training.state.leaves.LeafHasher`) and compared with the trainer's leaf, and the
next step's log chunk is read on another while a step runs
(:class:`~game.training.transcript.readahead.ReadAhead`); the log is
applied up to the first divergent step, and a chunk that does not fit the computation is the
trainer's fault. Progress is saved while it runs (:mod:`.auditprogress`), so a crashed audit goes
on from its last save.
"""

from __future__ import annotations

import logging
from pathlib import Path

from game.errors import RoundingLogError
from game.training.engine.auditprogress import DEFAULT_EVERY_S, AuditProgress, ProgressSaver
from game.training.engine.auditresult import AuditResult
from game.training.engine.memory import trimmed
from game.training.engine.replay import own_start, replayed
from game.training.engine.schedaudit import audit_scheduled
from game.training.engine.states import decode_state
from game.training.engine.step import StepResult, engine_for
from game.training.engine.train import ProgressFn
from game.training.state.canonical import encode_streamed
from game.training.state.leaves import LeafHasher, PendingLeaf, state_hash
from game.training.transcript.readahead import ReadAhead
from game.training.transcript.reader import Transcript

log = logging.getLogger(__name__)


@trimmed()  # a node idles on after: give the replay's memory back
def audit(
    transcript_dir: Path | str,
    profile: str,
    *,
    use_log: bool = True,
    progress: ProgressFn | None = None,
    keep_progress: Path | str | None = None,
    save_every_s: float = DEFAULT_EVERY_S,
) -> AuditResult:
    """Algorithm 3: re-train on ``profile`` (with the trainer's log unless ``use_log`` is False).

    The log is applied up to the first divergent step. A chunk that does not fit the computation
    there is the trainer's fault (``rejected_log_steps``); after that step the auditor's states are
    its own, the trainer's log describes other values, and the later steps run without it (a
    chunk rejected there would only repeat the divergence, not point at the log).

    With ``keep_progress`` (a directory this process holds alone), the audit saves its progress
    there every ``save_every_s`` seconds and, run again after a crash, goes on from the last save
    (:mod:`game.training.engine.auditprogress`); the saved progress is removed once the audit ends."""
    t = Transcript(transcript_dir)
    t.verify()
    if t.config.scheduled:  # an asynchronous task: replayed by its schedule
        return audit_scheduled(
            t,
            profile,
            use_log=use_log,
            progress=progress,
            keep_progress=keep_progress,
            save_every_s=save_every_s,
        )
    assert t.manifest.state_root is not None
    trainer_root = bytes.fromhex(t.manifest.state_root)
    engine = engine_for(t.config, profile, checks="audit")
    saver = None if keep_progress is None else ProgressSaver(Path(keep_progress), save_every_s)
    saved = None if saver is None else saver.load(trainer_root, profile, use_log)
    if saved is None:
        state = engine.init_state()
        leaves = [state_hash(state)]
        first_div = None if leaves[0] == t.leaf(0) else 0
        corrections = 0
        rejected: list[int] = []
        log_errors: list[str] = []
        resumed_from = None
    else:
        done, state_bytes, _ = saved
        state = decode_state(state_bytes, t.config)
        leaves = list(done.leaves)
        first_div = done.first_divergent_step
        corrections = done.corrections
        rejected = list(done.rejected_log_steps)
        log_errors = list(done.log_errors)
        resumed_from = done.step
        log.info("audit: going on from step %d, saved in %s", done.step, keep_progress)
    pending: PendingLeaf | None = None  # the last step's leaf, hashed while this step runs

    def settle(p: PendingLeaf) -> bool:
        """Take the leaf of step ``p.step``; True when that step is the first divergent one."""
        nonlocal first_div
        leaves.append(p.leaf())
        if first_div is not None or leaves[-1] == t.leaf(p.step):
            return False
        first_div = p.step
        log.info(
            "audit: first divergent step %d%s",
            p.step,
            "; the later steps run without the trainer's log" if use_log and p.step < t.steps else "",
        )
        return True

    with LeafHasher() as hasher, ReadAhead(t, t.steps, pin=engine.pins_logs) as logs:
        for step in range(len(leaves), t.steps + 1):
            if pending is not None and pending.ready:  # hashed at once: no state kept to go back to
                settle(pending)
                pending = None
            before = pending  # the state this step starts from, as the hasher took it
            with_log = use_log and first_div is None
            result: StepResult | None = None
            failed: Exception | None = None  # raised by a step run with the log, not yet judged
            try:
                result = engine.run_step(
                    state,
                    step,
                    mode="replay" if with_log else "round",
                    log=logs.read_log(step) if with_log else None,
                    hash_state=False,
                )
            except Exception as exc:
                if not with_log:
                    raise
                failed = exc
            if pending is not None and settle(pending) and with_log:
                # The step before this one diverged, so this one must run without the trainer's
                # log (it describes other values), whatever it raised: again, from its pre-state.
                state = decode_state(pending.state_bytes(), t.config)
                result = engine.run_step(state, step, mode="round", hash_state=False)
                failed = None
            pending = None
            if failed is not None:
                if not isinstance(failed, RoundingLogError):
                    raise failed
                # The chunk does not fit the computation (a tampered log): that step is the
                # trainer's fault; run it without the log so the auditor still has its leaves.
                log.warning("step %d: the trainer's log chunk is rejected: %s", step, failed)
                rejected.append(step)
                log_errors.append(str(failed))
                # The trainer's state up to here: the auditor's own, whose leaf matched, where its
                # bytes were kept, else rebuilt from a checkpoint of the trainer's (or the start).
                if before is not None and before.keeps_bytes:
                    state = decode_state(before.state_bytes(), t.config)
                else:
                    state = replayed(t, engine, own_start(t, engine, step - 1), step - 1)
                result = engine.run_step(state, step, mode="round", hash_state=False)
            assert result is not None
            corrections += result.corrections
            before = None  # its bytes go before the next state's are taken (a GPU holds both else)
            pending = hasher.submit(state)
            if saver is not None and saver.due() and step < t.steps:
                settle(pending)  # the leaf now, not a step late: the saved state is one already judged
                kept = pending.buffer.data if pending.buffer is not None else encode_streamed(state)
                pending = None
                done_so_far = AuditProgress(
                    trainer_root, profile, use_log, tuple(leaves), corrections, first_div,
                    tuple(rejected), tuple(log_errors),
                )  # fmt: skip
                saver.save(done_so_far, kept)
            if progress is not None:
                progress(step, t.steps)
        if pending is not None:
            settle(pending)
    if saver is not None:
        saver.clear()
    return AuditResult.of_leaves(
        trainer_root,
        leaves,
        first_divergent_step=first_div,
        steps=t.steps,
        corrections=corrections,
        profile=profile,
        rejected_log_steps=rejected,
        log_errors=log_errors,
        resumed_from=resumed_from,
    )


__all__ = ["AuditResult", "audit"]
