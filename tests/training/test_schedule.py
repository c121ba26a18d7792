"""The application schedule of an asynchronous task (issue 45, item 3), without Ray: its chunk
envelope and rules, the parameter server's WorkPool, an update computed in pieces against one
process, and the one-process audit of a schedule with stale versions and lost updates."""

from __future__ import annotations

import dataclasses
import random
import struct
from pathlib import Path

import pytest
import torch

from game.errors import RoundingLogError, TranscriptError
from game.training.engine.audit import audit
from game.training.engine.microbatch import merge_logs
from game.training.engine.replay import replay_transcript_step
from game.training.engine.scheduled import own_checkpoints, states_for, train_scheduled
from game.training.engine.step import engine_for
from game.training.engine.train import train
from game.training.engine.update import UpdateEngine, weights_of
from game.training.log.chunks import ChunkFormatError, ChunkMismatchError
from game.training.log.formats import decode_chunk, decode_scheduled
from game.training.log.schedule import (
    Applied,
    LostUpdate,
    MicroBatchId,
    ScheduledLog,
    ScheduleEntry,
    ScheduleError,
    check_schedule,
    first_repeats,
    open_envelope,
    repeated_in,
)
from game.training.log.sparse import SparseStepLog
from game.training.ps.pool import WorkPool
from game.training.state.leaves import state_hash
from game.training.task.config import TaskConfig, load_config
from game.training.transcript.reader import Transcript, steps_on_disk
from tests.training.schedules import fake_leaf, repeating_schedule, simulated_schedule, write_unchecked
from tests.training.test_carried import _body
from tests.training.test_task_api import make_plugin
from tests.training.test_unfit_chunks import replace_chunks, short_of_its_last_record

SPEC = bytes(range(32))


def _entry(u: int = 5) -> ScheduleEntry:
    applied = (Applied(MicroBatchId(4, 1), 3), Applied(MicroBatchId(5, 0), 4))
    return ScheduleEntry(u, applied, (LostUpdate(5, b"\x07" * 32),))


def _async_cfg(**kw: object) -> TaskConfig:
    base: dict[str, object] = {
        "model": {"hidden": 16},
        "batch_size": 8,
        "steps": 10,
        "accumulate": 2,
        "max_staleness": 2,
        "checkpoint_interval": 4,
    }
    return TaskConfig.for_preset("mlp-digits", **{**base, **kw})


# ---- the envelope ---------------------------------------------------------------------------------


def test_envelope_roundTrips_andTheInnerChunkIsTheStepsLog() -> None:
    inner = SparseStepLog(5)
    inner.append(0, "aten.mm.default", 12, torch.tensor([3, 7]))
    data = ScheduledLog(_entry(), inner).encode(5, SPEC)
    entry, step_log = decode_scheduled(data, SPEC, 5)
    assert entry == _entry()
    assert step_log.encode(5, SPEC) == inner.encode(5, SPEC)
    assert decode_chunk(data, SPEC, 5).encode(5, SPEC) == inner.encode(5, SPEC)  # read_log's view


def test_envelope_cutAnywhere_orLonger_isAFormatError() -> None:
    data = ScheduledLog(_entry(), SparseStepLog(5)).encode(5, SPEC)
    for cut in range(len(data)):
        with pytest.raises(RoundingLogError):
            decode_scheduled(data[:cut], SPEC, 5)
    with pytest.raises(ChunkFormatError):
        open_envelope(data + b"\0", step=5, spec_hash=SPEC)


def test_envelope_ofAnotherStepOrTask_isAMismatch() -> None:
    data = ScheduledLog(_entry(), SparseStepLog(5)).encode(5, SPEC)
    with pytest.raises(ChunkMismatchError, match="reordered"):
        decode_scheduled(data, SPEC, 6)
    with pytest.raises(ChunkMismatchError, match="foreign"):
        decode_scheduled(data, bytes(32), 5)


def test_envelope_whoseInnerChunkNamesAnotherStep_isRefused() -> None:
    inner = SparseStepLog(4).encode(4, SPEC)
    data = _entry().envelope(SPEC, inner)
    with pytest.raises(ChunkMismatchError):
        decode_scheduled(data, SPEC, 5)


# ---- the rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("applied", "lost", "match"),
    [
        (((4, 1, 3),), (), "applies 1 micro-batches"),
        (((5, 0, 4), (4, 1, 3)), (), "fold order"),
        (((4, 1, 3), (4, 1, 3)), (), "fold order"),
        (((4, 1, 1), (5, 0, 4)), (), "outside the window"),
        (((4, 1, 3), (5, 0, 5)), (), "outside the window"),
        (((4, 2, 3), (5, 0, 4)), (), "not one of the task's"),
        (((4, 1, 3), (11, 0, 4)), (), "not one of the task's"),
        (((4, 1, 3), (5, 0, 4)), ((4, b"\0" * 32),), "lost update must be 5 or later"),
    ],
)
def test_entry_breakingARule_isAScheduleError(applied: tuple, lost: tuple, match: str) -> None:
    entry = ScheduleEntry(
        5,
        tuple(Applied(MicroBatchId(s, j), v) for s, j, v in applied),
        tuple(LostUpdate(u, leaf) for u, leaf in lost),
    )
    with pytest.raises(ScheduleError, match=match):
        entry.check(accumulate=2, steps=10, max_staleness=2)


def test_entry_withinTheRules_passes() -> None:
    _entry().check(accumulate=2, steps=10, max_staleness=2)
    ScheduleEntry.sync(5, 2).check(accumulate=2, steps=10, max_staleness=0)


def test_checkSchedule_namesAMicroBatchAppliedTwiceAndOneNever() -> None:
    entries = [ScheduleEntry.sync(u, 2) for u in range(1, 4)]
    entries[2] = ScheduleEntry(3, (Applied(MicroBatchId(2, 1), 2), Applied(MicroBatchId(3, 1), 2)))
    problems = check_schedule(entries, accumulate=2, steps=3, max_staleness=1)
    assert any("more than once, first 2.1" in p for p in problems)
    assert any("never applied, first 3.0" in p for p in problems)
    assert (
        check_schedule([*entries[:2], ScheduleEntry.sync(3, 2)], accumulate=2, steps=3, max_staleness=0) == []
    )


def test_maxStaleness_atItsDefault_leavesEverySpecHashAsItWas() -> None:
    cfg = TaskConfig.for_preset("mlp-digits")
    assert "max_staleness" not in cfg.to_dict()
    assert TaskConfig.from_dict(cfg.to_dict()).spec_hash() == cfg.spec_hash()
    other = cfg.replace(max_staleness=3)
    assert other.to_dict()["max_staleness"] == 3 and other.spec_hash() != cfg.spec_hash()
    assert TaskConfig.from_dict(other.to_dict()) == other


# ---- the pool --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_pool_randomAsyncRuns_applyEveryMicroBatchOnce_withinTheWindow(seed: int) -> None:
    rng = random.Random(seed)
    steps, accumulate, stale = rng.randint(4, 12), rng.randint(1, 3), rng.randint(1, 3)
    failovers = [(rng.randint(1, steps), rng.randint(0, 3)) for _ in range(rng.randint(0, 2))]
    entries, pool, lost = simulated_schedule(
        steps, accumulate, stale, workers=rng.randint(1, 4), seed=seed, failovers=failovers
    )
    assert check_schedule(entries, accumulate=accumulate, steps=steps, max_staleness=stale) == []
    key = lambda x: (x.update, x.leaf)  # noqa: E731
    listed = sorted((x for e in entries for x in e.lost), key=key)
    assert listed == sorted(lost, key=key)  # every lost update is in the final lineage's entries, once
    assert len(pool.leaves) == steps + 1 and not pool.hand and not pool.out


def test_pool_sync_handsOutOnlyTheDueStep_andMakesTheSyncEntries() -> None:
    entries, _, lost = simulated_schedule(5, 3, 0, workers=4, seed=1, failovers=[(2, 1)])
    assert [x.update for x in lost] == [2]
    assert [dataclasses.replace(e, lost=()) for e in entries] == [
        ScheduleEntry.sync(u, 3) for u in range(1, 6)
    ]
    assert any(e.lost for e in entries)  # the failover lost update 2; it was applied again, the same


def test_pool_rewind_cutsTheLineage_andHandsBackWhatWasLost() -> None:
    pool = WorkPool(6, 1, 2)
    pool.start(fake_leaf(0, 0))
    for u in range(1, 4):
        m = pool.next_micro()
        assert m is not None
        pool.hand_out(m)
        assert pool.returned(m, None)
        taken = pool.take()
        assert taken is not None and taken[0].update == u
        pool.confirm(fake_leaf(u, 0))
    straggler = pool.next_micro()
    assert straggler == MicroBatchId(4, 0)
    pool.hand_out(straggler)  # computed on state 3, which the failover loses
    lost = pool.rewind(1, pool.leaves[1])
    assert [x.update for x in lost] == [2, 3] and pool.latest == 1
    assert not pool.returned(straggler, None)  # its version left the lineage: handed back
    assert [pool.next_micro()] == [MicroBatchId(2, 0)]
    with pytest.raises(Exception, match="not in the lineage"):
        pool.rewind(1, fake_leaf(1, 9))


# ---- an update in pieces ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "overrides"),
    [
        ("mlp-digits", {"accumulate": 4}),
        ("gpt-shakespeare", {"accumulate": 2, "model": {"n_layer": 1, "n_embd": 32}, "batch_size": 4}),
        ("cnn-digits", {"accumulate": 2, "batch_size": 8}),  # BatchNorm: the last micro-batch's buffers
        ("mlp-digits", {"accumulate": 2, "log_format": "packed", "clip_grad_norm": 0.5}),
    ],
)
def test_updateInPieces_isOneProcessesStep_leafAndChunkBytes(task: str, overrides: dict) -> None:
    cfg = TaskConfig.for_preset(task, steps=2, **overrides)
    spec = cfg.spec_hash()
    one = engine_for(cfg, "cpu-1t")
    s1 = one.init_state()
    ue = UpdateEngine(engine_for(cfg, "cpu-1t"))
    s2, s3 = ue.engine.init_state(), ue.engine.init_state()
    for step in (1, 2):
        want = one.run_step(s1, step, mode="record")
        entry = ScheduleEntry.sync(step, cfg.accumulate)
        w2 = weights_of(s2)
        whole, _, _ = ue.run_update(s2, [(a, w2) for a in entry.applied], mode="record")
        w3 = weights_of(s3)
        parts = [ue.record_micro(a, w3) for a in entry.applied]  # as the workers
        server = ue.record_apply(s3, [p[0] for p in parts])  # as the server
        merged = merge_logs(cfg.log_format, step, [p[1] for p in parts] + [server])
        assert want.leaf == state_hash(s2) == state_hash(s3)
        assert want.log is not None and whole is not None
        assert want.log.encode(step, spec) == whole.encode(step, spec) == merged.encode(step, spec)


# ---- training and auditing by a schedule -----------------------------------------------------------


def test_syncSchedule_inOneProcess_isTrain(tmp_path: Path) -> None:
    cfg = _async_cfg(max_staleness=0, steps=6)
    ref = train(cfg, "cpu-1t", tmp_path / "train")
    t = train_scheduled(cfg, "cpu-1t", tmp_path / "sched", [ScheduleEntry.sync(u, 2) for u in range(1, 7)])
    assert (t.manifest.state_root, t.manifest.log_root) == (ref.state_root.hex(), ref.log_root.hex())


@pytest.fixture(scope="module")
def async_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[TaskConfig, list[ScheduleEntry], Path]:
    cfg = _async_cfg()
    entries, _, _ = simulated_schedule(cfg.steps, 2, 2, workers=3, seed=7, failovers=[(5, 2)])
    out = tmp_path_factory.mktemp("async") / "t"
    train_scheduled(cfg, "cpu-1t", out, entries)
    return cfg, entries, out


def test_asyncTranscript_carriesItsScheduleAndLostUpdates_andVerifies(async_run: tuple) -> None:
    cfg, entries, out = async_run
    t = Transcript(out)
    t.verify()
    assert t.schedule() == entries
    assert any(v < e.update - 1 for e in entries for v in e.versions)  # stale gradients were applied
    assert any(e.lost for e in entries)  # and the failover's lost updates are listed
    for v in own_checkpoints(entries, cfg):  # states used across a checkpoint keep a file
        t.load_checkpoint(v)


@pytest.mark.parametrize("profile", ["cpu-2t", "noisy", "splitk-16"])
def test_asyncTranscript_auditsBitExact_onAnotherProfile(async_run: tuple, profile: str) -> None:
    _, _, out = async_run
    result = audit(out, profile)
    assert result.match and result.first_divergent_step is None
    assert result.schedule_errors == () and result.rejected_log_steps == ()


def test_asyncUpdate_replayedAlone_fromItsVersions_matchesItsLeaf(async_run: tuple) -> None:
    cfg, entries, out = async_run
    stale = next(e for e in entries if e.versions[0] < e.update - 1 and e.update > cfg.checkpoint_interval)
    result = replay_transcript_step(out, stale.update, "noisy")
    assert result.matches_transcript
    state, found = states_for(
        Transcript(out), engine_for(cfg, "splitk-16"), {stale.update - 1, *stale.versions}
    )
    assert state.step == stale.update - 1 and set(found) == {stale.update - 1, *stale.versions}


def _rewrite(out: Path, update: int, entry: ScheduleEntry) -> None:
    """Replace ``update``'s schedule entry and fix the hashes and the manifest's log root, so the
    transcript verifies and only replaying shows the lie."""
    t = Transcript(out)
    _, inner = open_envelope(t.chunk_bytes(update), step=update, spec_hash=t.spec_hash)
    replace_chunks(out, {update: entry.envelope(t.spec_hash, inner)})


def test_asyncTranscript_withAnEntryThatLies_divergesAtThatUpdate(async_run: tuple, tmp_path: Path) -> None:
    import shutil

    _, entries, out = async_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    target = next(e for e in entries if e.update >= 3 and any(a.version > e.update - 3 for a in e.applied))
    first = target.applied[0]
    other = first.version - 1 if first.version > target.update - 3 else first.version + 1
    lie = dataclasses.replace(target, applied=(Applied(first.micro, other), *target.applied[1:]))
    _rewrite(copy, target.update, lie)
    result = audit(copy, "cpu-2t")
    assert not result.match and result.first_divergent_step == target.update


def _out_of_the_rules(async_run: tuple, tmp_path: Path, u: int) -> Path:
    """A copy of the run whose update ``u`` applies every micro-batch from version 0 (outside the
    staleness window)."""
    import shutil

    _, entries, out = async_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    bad = dataclasses.replace(
        entries[u - 1], applied=tuple(Applied(a.micro, 0) for a in entries[u - 1].applied)
    )
    _rewrite(copy, u, bad)
    return copy


def test_asyncTranscript_withAnEntryOutOfTheRules_isPinnedThere(async_run: tuple, tmp_path: Path) -> None:
    u = 8
    result = audit(_out_of_the_rules(async_run, tmp_path, u), "cpu-2t")
    assert result.first_divergent_step == u and not result.match
    assert any("outside the window" in e for e in result.schedule_errors)


def test_asyncTranscript_withAnEntryOutOfTheRules_andTheAuditorsMarksCommitted_isNoMatch(
    async_run: tuple, tmp_path: Path
) -> None:
    """From a broken schedule on, the auditor's leaves are a public mark (``rejected_schedule_leaf``).
    A trainer that commits those marks as its leaves had its root equal the auditor's: "match", no
    challenge, and the trainer paid for a final leaf no model hashes to."""
    from game.merkle import merkle_root
    from game.training.engine.schedaudit import rejected_schedule_leaf

    u = 8
    copy = _out_of_the_rules(async_run, tmp_path, u)
    t = Transcript(copy)
    leaves = [*t.leaves()[:u], *(rejected_schedule_leaf(v) for v in range(u, t.steps + 1))]
    (copy / "leaves.bin").write_bytes(b"".join(leaves))
    manifest = (copy / "manifest.json").read_text()
    (copy / "manifest.json").write_text(manifest.replace(t.manifest.state_root, merkle_root(leaves).hex()))
    Transcript(copy).verify()

    result = audit(copy, "cpu-2t")
    assert result.auditor_state_root == result.trainer_state_root  # the marks, committed
    assert not result.match and result.first_divergent_step == u and result.schedule_errors


def test_asyncTranscript_whoseLogDoesNotDecode_isReplayedWithoutIt_andTheJudgeRulesAgainstIt(
    async_run: tuple, tmp_path: Path
) -> None:
    """An update whose entry keeps the rules but whose inner log does not decode (here, the inner
    chunk of another update) is no broken schedule: the auditor re-runs it without the log and its
    leaves go on (not the rejected-schedule hash from there on). The judge never rules for such a
    log: it posts a hash no state has, not what the update computes without the log, which other
    hardware computes otherwise."""
    import shutil

    from game.judgeupdate import rerun_update
    from game.training.engine.schedaudit import rejected_schedule_leaf

    cfg, entries, out = async_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    u = 6
    t = Transcript(copy)
    _, other = open_envelope(t.chunk_bytes(u - 1), step=u - 1, spec_hash=t.spec_hash)
    replace_chunks(copy, {u: entries[u - 1].envelope(t.spec_hash, other)})
    t = Transcript(copy)
    t.verify()

    engine = engine_for(cfg, "cpu-1t")
    _, found = states_for(t, engine, {u - 2, u - 1, *entries[u - 2].versions, *entries[u - 1].versions})
    judged, why = rerun_update(engine, found[u - 1], found, t.chunk_bytes(u), u)
    assert why.startswith("log does not decode or fit")
    result = audit(copy, "cpu-1t")
    assert result.rejected_log_steps == (u,) and result.schedule_errors == ()
    assert result.match and result.leaves[u] == t.leaf(u) != judged
    assert rejected_schedule_leaf(u) not in result.leaves
    honest, _ = rerun_update(engine, found[u - 2], found, t.chunk_bytes(u - 1), u - 1)
    assert honest == t.leaf(u - 1)


def _short_update(t: Transcript, entries: list[ScheduleEntry], u: int) -> bytes:
    """Update ``u``'s chunk with its inner log short of its last record: it decodes, and the update
    raises part way."""
    _, inner = open_envelope(t.chunk_bytes(u), step=u, spec_hash=t.spec_hash)
    return entries[u - 1].envelope(t.spec_hash, short_of_its_last_record(inner, t.spec_hash, u))


def test_asyncTranscript_withLogsThatDoNotFit_auditsAndRebuildsThroughThem(
    async_run: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Update 5's log decodes but does not fit (its last record gone: the update raises part way)
    and update 6's does not decode, both of true states: the audit runs each without its log, from
    its own kept state before it (no rebuild from a checkpoint), and a rebuild from checkpoint 4
    goes through both (starting again once, for update 5's log)."""
    import shutil

    from game.training.engine import schedaudit

    def no_rebuild(*_: object, **__: object) -> None:
        raise AssertionError("rebuilt from a checkpoint")

    cfg, entries, out = async_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    t = Transcript(copy)
    _, other = open_envelope(t.chunk_bytes(4), step=4, spec_hash=t.spec_hash)
    replace_chunks(
        copy,
        {
            5: _short_update(t, entries, 5),
            6: entries[5].envelope(t.spec_hash, other),
        },
    )
    t = Transcript(copy)
    t.verify()

    with monkeypatch.context() as patched:
        patched.setattr(schedaudit, "states_for", no_rebuild)
        result = audit(copy, "cpu-1t")
    assert result.rejected_log_steps == (5, 6) and result.schedule_errors == ()
    assert result.match
    state, found = states_for(t, engine_for(cfg, "cpu-1t"), [5, 7])  # every leaf checked on the way
    assert state.step == 7 and set(found) == {5, 7}


@pytest.mark.parametrize("checkpoint", ["missing", "altered"])
def test_asyncAudit_ofALogThatDoesNotFitAtUpdate1_withoutAUsableCheckpoint0_goesOn(
    async_run: tuple, tmp_path: Path, checkpoint: str
) -> None:
    """Update 1's pre-state has no kept bytes, so the audit rebuilds it (``states_for``), which
    loaded the trainer's checkpoint 0: missing or altered (nothing checks the checkpoints before a
    replay), the audit raised. The task's initial state stands in for it now, and a later
    checkpoint that does not load is passed over for an earlier one."""
    import shutil

    cfg, entries, out = async_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    t = Transcript(copy)
    replace_chunks(copy, {1: _short_update(t, entries, 1)})
    later = max(t.checkpoint_steps())
    for ckpt in (0, later):
        if checkpoint == "missing":
            t.paths.checkpoint(ckpt).unlink()
        else:
            t.paths.checkpoint(ckpt).write_bytes(b"not the state")
    result = audit(copy, "cpu-1t")
    assert result.rejected_log_steps == (1,) and result.match
    state, found = states_for(Transcript(copy), engine_for(cfg, "cpu-1t"), [later])  # every leaf checked
    assert state.step == later and set(found) == {later}


def test_firstRepeats_namesEachUpdateThatAppliesAMicroBatchAgain_andTheFirstThatAppliedIt() -> None:
    entries, _, _ = simulated_schedule(10, 2, 2, workers=3, seed=7)
    assert first_repeats(entries) == {}
    bad, micro, w = repeating_schedule(entries, 6)
    assert first_repeats(bad) == {6: (micro, w)}
    assert repeated_in(bad[5], bad[w - 1]) == micro and repeated_in(bad[5], bad[4 if w != 5 else 3]) is None


def test_asyncTranscript_applyingAMicroBatchTwice_isPinnedAtTheRepeat(
    async_run: tuple, tmp_path: Path
) -> None:
    """Every update, re-run alone, is what the trainer computed; the repeat is still its fault at the
    update that repeats (so a game can pin it), and the micro-batch it left out needs no rule."""
    cfg, entries, _ = async_run
    bad, micro, w = repeating_schedule(entries, 7)
    out = tmp_path / "t"
    write_unchecked(cfg, "cpu-1t", out, bad)
    Transcript(out).verify()
    result = audit(out, "cpu-2t")
    assert not result.match and result.first_divergent_step == 7
    assert f"micro-batch {micro} was applied by update {w} already" in " ".join(result.schedule_errors)
    assert result.leaves[:7] == tuple(Transcript(out).leaves()[:7])


def test_train_ofAnAsyncTask_inOneProcess_writesTheSyncScheduleAndAudits(tmp_path: Path) -> None:
    cfg = _async_cfg(steps=5)
    train(cfg, "cpu-1t", tmp_path / "t")
    t = Transcript(tmp_path / "t")
    assert t.schedule() == [ScheduleEntry.sync(u, 2) for u in range(1, 6)]
    assert audit(tmp_path / "t", "noisy").match


def test_train_ofAnAsyncTask_stoppedMidway_goesOnFromItsLastUpdate_toTheSameRoots(tmp_path: Path) -> None:
    cfg = _async_cfg(steps=9)
    whole = train(cfg, "cpu-1t", tmp_path / "whole")

    class Stop(Exception):
        pass

    def stop_at_6(done: int, total: int) -> None:
        if done == 6:
            raise Stop

    with pytest.raises(Stop):
        train(cfg, "cpu-1t", tmp_path / "t", progress=stop_at_6)
    assert steps_on_disk(tmp_path / "t") == 7
    again = train(cfg, "cpu-1t", tmp_path / "t")
    assert again.resumed_from == 6 and again.steps_run == 3
    assert (again.state_root, again.log_root) == (whole.state_root, whole.log_root)
    with pytest.raises(TranscriptError, match="not 'cpu-2t'"):  # a run goes on where it started
        (tmp_path / "t" / "manifest.json").write_text(
            (tmp_path / "t" / "manifest.json").read_text().replace('"complete": true', '"complete": false')
        )
        train(cfg, "cpu-2t", tmp_path / "t")


def test_envelopeHeader_layoutIsTheDocumented(async_run: tuple) -> None:
    _, entries, out = async_run
    t = Transcript(out)
    data = t.chunk_bytes(3)
    magic = b"vgame-sched-v1\0"
    assert data.startswith(magic)
    step, spec = struct.unpack_from("<Q32s", data, len(magic))
    (count,) = struct.unpack_from("<I", data, len(magic) + 40)
    assert (step, spec, count) == (3, t.spec_hash, len(entries[2].applied))


#: A model whose construction runs inexact ops: registering a parametrization evaluates it once.
PARAMETRIZED = _body(
    "        return self.b(torch.tanh(self.a(x)))",
    "        nn.utils.parametrize.register_parametrization(self.a, 'weight', Standardized())\n",
    before=(
        "class Standardized(nn.Module):\n"
        "    def forward(self, w):\n"
        "        return (w - w.mean(1, keepdim=True)) / (w.std(1, keepdim=True) + 1e-5)\n\n\n"
    ),
)


def test_aModelWhoseConstructionRoundsOps_trainsAsynchronously_auditsAndIsJudgedAlike(tmp_path: Path) -> None:
    """A scratch model was built on its first use, inside the update's interceptor, so its
    construction's ops (a parametrization evaluated as it is registered) went into the log of the
    first update it ran: the trainer's update 1 and no other, but every judge's update, whose
    scratch model is new. The judge's re-run of update 3 failed, ruling the honest trainer wrong.
    Built before the interceptor now: the audit on ``noisy`` and the judge's re-runs agree."""
    make_plugin(tmp_path, PARAMETRIZED)
    cfg = load_config(tmp_path / "task.toml").replace(
        steps=4, max_staleness=1, accumulate=2, checkpoint_interval=1
    )
    result = train(cfg, "cpu-1t", tmp_path / "t")
    report = audit(tmp_path / "t", "noisy")
    assert report.match and report.trainer_state_root == result.state_root
    for step in (1, 3, 4):
        assert replay_transcript_step(tmp_path / "t", step, "noisy").matches_transcript
