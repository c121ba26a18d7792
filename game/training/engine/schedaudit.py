"""The auditor's replay of an asynchronous task (Algorithm 3 by the application schedule).

Update ``u`` is re-run as its chunk's entry says: each listed micro-batch's gradients on the state
of its version, folded in the entry's order, applied to state ``u - 1``, with the chunk's log. The
replay keeps each version's weights until the last update that names it
(:func:`~game.training.log.schedule.last_uses`). As in :mod:`.audit`, the next updates' logs are
read on threads while an update runs, the log is applied up to the first divergent update, and a
chunk whose log does not decode or does not fit the computation is the trainer's fault at that
update (it is re-run without the log, as the judge re-runs it). An entry that breaks the task's
rules on its own (a version outside the staleness window, the wrong number of micro-batches) is the
trainer's fault too: the judge posts a hash no state has for it, so the auditor's own leaves from
that update on are such hashes (:func:`rejected_schedule_leaf`), and a game pins it. So is the
first update that applies a micro-batch an earlier update applied (the judge takes the earlier
update's chunk as its witness, :mod:`game.judgeupdate`); with none applied twice, none was left
out. Each such finding is also in ``schedule_errors``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from game.errors import RoundingLogError
from game.training.engine.auditprogress import DEFAULT_EVERY_S, AuditProgress, ProgressSaver
from game.training.engine.auditresult import AuditResult
from game.training.engine.scheduled import check_entry, run_entry, states_for
from game.training.engine.states import decode_state
from game.training.engine.step import engine_for
from game.training.engine.train import ProgressFn
from game.training.engine.update import UpdateEngine, Weights, weights_of
from game.training.log.schedule import MicroBatchId, ScheduleEntry, ScheduleError, check_schedule, last_uses
from game.training.state.canonical import encode_state
from game.training.state.leaves import LeafHasher, PendingLeaf, state_hash
from game.training.task.config import TaskConfig
from game.training.transcript.readahead import ReadAhead
from game.training.transcript.reader import Transcript

log = logging.getLogger(__name__)


def rejected_schedule_leaf(update: int) -> bytes:
    """The auditor's own leaf for an update whose entry breaks the rules, and every one after it:
    domain-separated, so it equals no state hash."""
    return hashlib.sha256(b"vgame-rejected-schedule-v1\0" + update.to_bytes(8, "little")).digest()


def checked_entries(
    cfg: TaskConfig, entry_of: Callable[[int], ScheduleEntry | None]
) -> tuple[list[ScheduleEntry | None], list[str]]:
    """Every update's schedule entry (``entry_of(u)``, None for a plain chunk; it may raise
    :class:`RoundingLogError` for an envelope that does not parse), held to the task's rules: each
    entry on its own, no micro-batch applied twice, and, where every entry passes, the schedule
    whole. An entry that breaks a rule is None (a replay stops at the first), and what it broke is
    among the findings, which come second. One rule for a replay from the transcript and from the log on-chain."""
    entries: list[ScheduleEntry | None] = []
    errors: list[str] = []
    applied_by: dict[MicroBatchId, int] = {}
    for u in range(1, cfg.steps + 1):
        try:
            entry = entry_of(u)
            if entry is None:
                raise RoundingLogError(f"update {u}: the chunk carries no schedule")
            check_entry(entry, cfg)
            again = [a.micro for a in entry.applied if a.micro in applied_by]
            if again:
                raise ScheduleError(
                    f"update {u}: micro-batch {again[0]} was applied by update {applied_by[again[0]]} already"
                )
            applied_by.update((a.micro, u) for a in entry.applied)
            entries.append(entry)
        except RoundingLogError as exc:  # a ScheduleError, or an envelope that does not parse
            errors.append(str(exc))
            entries.append(None)
    good = [e for e in entries if e is not None]
    if len(good) == len(entries):
        errors += check_schedule(
            good, accumulate=cfg.accumulate, steps=cfg.steps, max_staleness=cfg.max_staleness
        )
    return entries, errors


def audit_scheduled(
    t: Transcript,
    profile: str,
    *,
    use_log: bool = True,
    progress: ProgressFn | None = None,
    keep_progress: Path | str | None = None,
    save_every_s: float = DEFAULT_EVERY_S,
) -> AuditResult:
    """Replay the verified transcript ``t`` of an asynchronous task on ``profile`` (see the module).
    ``keep_progress``: as :func:`~.audit.audit`'s; a save keeps, beside the state, the weights of
    every older state the later updates compute on."""
    cfg = t.config
    assert t.manifest.state_root is not None
    trainer_root = bytes.fromhex(t.manifest.state_root)
    engine = engine_for(cfg, profile, checks="audit")
    ue = UpdateEngine(engine)
    entries, errors = checked_entries(cfg, t.update_entry)  # the logs are decoded when replayed
    uses = last_uses([e for e in entries if e is not None])
    saver = None if keep_progress is None else ProgressSaver(Path(keep_progress), save_every_s)
    saved = None if saver is None else saver.load(trainer_root, profile, use_log)
    resumed_from: int | None = None
    if saved is None:
        state = engine.init_state()
        leaves = [state_hash(state)]
        first_div: int | None = None if leaves[0] == t.leaf(0) else 0
        kept: dict[int, Weights] = {0: weights_of(state)}
        corrections = 0
        rejected: list[int] = []
        log_errors: list[str] = []
    else:
        done, state_bytes, kept = saved
        state = decode_state(state_bytes, cfg)
        leaves, first_div, corrections = list(done.leaves), done.first_divergent_step, done.corrections
        rejected, log_errors = list(done.rejected_log_steps), list(done.log_errors)
        resumed_from = done.step
        log.info("audit: going on from update %d, saved in %s", done.step, keep_progress)
    before: PendingLeaf | None = None  # the state the update starts from, its bytes kept
    with LeafHasher() as hasher, ReadAhead(t, t.steps, pin=engine.pins_logs) as logs:
        for u, entry in enumerate(entries, start=1):
            if u < len(leaves):  # replayed before the save it goes on from
                continue
            if entry is None:  # the trainer's fault here, and nothing after it can be computed
                log.warning("update %d: its schedule entry breaks the task's rules; the replay stops", u)
                leaves += [rejected_schedule_leaf(v) for v in range(u, t.steps + 1)]
                first_div = u if first_div is None else first_div
                break
            with_log = use_log and first_div is None
            try:  # a log read here that does not decode is rejected as one that does not fit
                corrections += run_entry(ue, state, entry, logs.read_log(u) if with_log else None, kept)
            except RoundingLogError as exc:
                if not with_log:
                    raise
                log.warning("update %d: the trainer's log chunk is rejected: %s", u, exc)
                rejected.append(u)
                log_errors.append(str(exc))
                # The trainer's state up to here: the auditor's own, whose leaf matched, where its
                # bytes were kept, else rebuilt from the trainer's checkpoint.
                if before is not None and before.keeps_bytes:
                    state = decode_state(before.state_bytes(), cfg)
                else:
                    state = states_for(t, engine, [u - 1])[0]
                run_entry(ue, state, entry, None, kept)
            before = None  # let go before the next bytes are taken (a GPU would hold both)
            before = hasher.submit(state)
            leaves.append(before.leaf())
            if first_div is None and leaves[-1] != t.leaf(u):
                first_div = u
                log.info("audit: first divergent update %d", u)
            if uses.get(u, 0) > u:
                kept[u] = weights_of(state)
            for v in [v for v in kept if uses.get(v, 0) <= u]:
                del kept[v]
            if saver is not None and saver.due() and u < t.steps:
                done_so_far = AuditProgress(
                    trainer_root, profile, use_log, tuple(leaves), corrections, first_div,
                    tuple(rejected), tuple(log_errors),
                )  # fmt: skip
                saver.save(done_so_far, encode_state(state), kept)
            if progress is not None:
                progress(u, t.steps)
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
        schedule_errors=tuple(errors),
    )


__all__ = ["audit_scheduled", "checked_entries", "rejected_schedule_leaf"]
