"""A trainer's true states committed with log chunks that do not fit them: the auditor runs those
steps without the log, and every rebuild of a state through them (an auditor's after a rejected
chunk, its evidence for the judge, the judge's own) runs them the same way, so a later step's cheat
is still found. The judge never rules for such a chunk (``game.judgeupdate.rerun_step``).

Two kinds of chunk: one that does not decode (another step's chunk: nothing of the step ran) and
one that decodes but does not fit (its last record taken away: the step raises part way, its
state half-updated, so a rebuild starts again from the checkpoint)."""

from __future__ import annotations

from pathlib import Path

import pytest

from game.judgeupdate import rerun_step
from game.merkle import merkle_root
from game.strategies.trainers import Poison
from game.training.engine.audit import audit
from game.training.engine.replay import replay_step, replayed, state_after
from game.training.engine.states import decode_state
from game.training.engine.step import engine_for
from game.training.engine.train import train
from game.training.log.chunks import chunk_hash
from game.training.log.sparse import SparseStepLog
from game.training.state.canonical import encode_state
from game.training.state.leaves import state_hash
from game.training.state.tensors import TrainState
from game.training.task.config import TaskConfig
from game.training.transcript.reader import Transcript

STEPS = 6
NOT_DECODING, NOT_FITTING, CHEAT = 2, 3, 5


def replace_chunks(out: Path, chunks: dict[int, bytes]) -> None:
    """Put each of ``chunks`` in place of its step's chunk, with the chunk hashes and the log root
    to match: the transcript verifies, and only a replay meets the chunks."""
    t = Transcript(out)
    hashes = t.chunk_hashes()
    for step, data in chunks.items():
        t.chunk_path(step).write_bytes(data)
        hashes[step] = chunk_hash(data)
    (out / "chunk_hashes.bin").write_bytes(b"".join(hashes))
    manifest = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(manifest.replace(t.manifest.log_root or "", merkle_root(hashes).hex()))
    Transcript(out).verify()


def short_of_its_last_record(data: bytes, spec_hash: bytes, step: int) -> bytes:
    """Step ``step``'s sparse chunk ``data`` with its last record taken away."""
    step_log = SparseStepLog.decode(data, step=step, spec_hash=spec_hash)
    step_log.pop()
    return step_log.encode(step, spec_hash)


@pytest.fixture(scope="module")
def unfit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with one checkpoint before its last step (step 0), chunks 2 and 3 that do not fit
    their true states, and a poisoned step 5."""
    cfg = TaskConfig.for_preset(
        "mlp-digits", steps=STEPS, batch_size=8, checkpoint_interval=STEPS, model={"hidden": 16}
    )
    out = tmp_path_factory.mktemp("unfit") / "t"
    train(cfg, "cpu-1t", out, deviation=Poison(cfg, CHEAT))
    t = Transcript(out)
    assert t.checkpoint_steps() == [0, STEPS]
    replace_chunks(
        out,
        {
            NOT_DECODING: t.chunk_bytes(NOT_DECODING - 1),
            NOT_FITTING: short_of_its_last_record(t.chunk_bytes(NOT_FITTING), t.spec_hash, NOT_FITTING),
        },
    )
    return out


def test_audit_runsEveryUnfitChunksStepWithoutIt_andStillFindsTheLaterCheat(unfit: Path) -> None:
    """Before, the second rejected chunk's rebuild of the trainer's state replayed the first one
    with its log and raised: the audit stopped short of step 5's cheat."""
    result = audit(unfit, "cpu-1t")
    assert result.rejected_log_steps == (NOT_DECODING, NOT_FITTING)
    assert "reordered" in result.log_errors[0]
    assert result.first_divergent_step == CHEAT
    assert result.leaves[:CHEAT] == tuple(Transcript(unfit).leaves()[:CHEAT])


def test_stateAfter_goesThroughUnfitChunks_toTheCommittedLeaf(unfit: Path) -> None:
    t = Transcript(unfit)
    engine = engine_for(t.config, "cpu-1t")
    state = state_after(t, engine, CHEAT - 1)  # checks every leaf on the way
    assert state.step == CHEAT - 1 and state_hash(state) == t.leaf(CHEAT - 1)


def test_replayed_startsAgain_onceForTheChunkThatDoesNotFit(unfit: Path) -> None:
    t = Transcript(unfit)
    engine = engine_for(t.config, "cpu-1t")
    starts = []

    def start() -> TrainState:
        starts.append(1)
        return decode_state(t.load_checkpoint(0), t.config)

    state = replayed(t, engine, start, CHEAT - 1)
    assert state_hash(state) == t.leaf(CHEAT - 1)
    assert len(starts) == 2  # the chunk that does not decode costs no start; the one that does not fit, one


def test_audit_afterARejectedChunk_goesOnFromItsOwnKeptState(
    unfit: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state a rejected step starts from is the auditor's own (its leaf matched), whose bytes
    the leaf hasher kept: no replay from the trainer's checkpoint, which would cost each rejected
    chunk up to a checkpoint interval of steps."""
    from game.training.engine import audit as audit_module

    def no_rebuild(*_: object, **__: object) -> None:
        raise AssertionError("rebuilt from the checkpoint")

    monkeypatch.setattr(audit_module, "replayed", no_rebuild)
    result = audit(unfit, "cpu-1t")
    assert result.rejected_log_steps == (NOT_DECODING, NOT_FITTING)
    assert result.first_divergent_step == CHEAT


@pytest.mark.parametrize("step", [NOT_DECODING, NOT_FITTING])
def test_judge_rulesAgainstAChunkThatDoesNotDecodeOrFit_onEveryProfile(unfit: Path, step: int) -> None:
    """Run without the log, such a step reaches the trainer's leaf on the trainer's own profile and
    another leaf on the noisy one (values near a midpoint round otherwise there). The judge used to
    rule on that run: a judge on the trainer's hardware found for the trainer against an honest
    auditor on the noisy profile, whose leaf differed. Now the ruling is the same hash on every
    profile, and no state's; an honest chunk before it still gives the trainer's leaf."""
    t = Transcript(unfit)
    pre = encode_state(state_after(t, engine_for(t.config, "cpu-1t"), step - 1))
    without = {p: replay_step(engine_for(t.config, p), pre, step, None).leaf for p in ("cpu-1t", "noisy")}
    assert without["cpu-1t"] == t.leaf(step) != without["noisy"]  # what the old ruling hung on

    rulings = {p: rerun_step(engine_for(t.config, p), pre, t.chunk_bytes(step), step) for p in without}
    assert len(set(rulings.values())) == 1
    (leaf, note), *_ = rulings.values()
    assert leaf not in (t.leaf(step), *without.values())
    assert note.startswith("log does not decode or fit")

    before = encode_state(state_after(t, engine_for(t.config, "cpu-1t"), 0))
    for p in without:
        assert rerun_step(engine_for(t.config, p), before, t.chunk_bytes(1), 1) == (t.leaf(1), "")


def test_replayStep_givesWhatTheJudgePosts_forAChunkItRulesAgainst_andSaysWhy(unfit: Path) -> None:
    """``vgame replay-step`` is the judge's primitive: on a chunk that does not fit it used to raise
    (``error:``), where the judge posts the rejected-log hash; now it gives that hash and the reason,
    and a step with an honest chunk still its leaf."""
    import subprocess
    import sys

    from game.api import replay_step

    t = Transcript(unfit)
    pre = state_after(t, engine_for(t.config, "splitk-16"), NOT_FITTING - 1)
    judged = rerun_step(engine_for(t.config, "splitk-16"), pre, t.chunk_bytes(NOT_FITTING), NOT_FITTING)
    result = replay_step(unfit, NOT_FITTING, "splitk-16")
    assert (result.state_hash, result.rejected) == judged and not result.matches_transcript
    honest = replay_step(unfit, 1, "splitk-16")
    assert honest.matches_transcript and honest.rejected == ""

    args = ["replay-step", "--transcript", str(unfit), "--step", str(NOT_FITTING), "--profile", "splitk-16"]
    r = subprocess.run([sys.executable, "-m", "game.cli", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert f"state hash {judged[0].hex()}" in said
    assert "the judge rules against the trainer's chunk: log does not decode or fit" in said
    assert f"differs from the transcript's leaf {NOT_FITTING}" in said


@pytest.mark.parametrize("checkpoint", ["missing", "altered"])
def test_audit_ofAChunkThatDoesNotFitAtStep1_withoutAUsableCheckpoint0_startsFromItsOwnInitialState(
    unfit: Path, tmp_path: Path, checkpoint: str
) -> None:
    """Step 1's pre-state has no kept bytes, so the audit rebuilds it. It rebuilt it from the
    trainer's checkpoint 0, which nothing made the trainer publish (or publish intact): the audit
    raised, a node restarted raised again, and the cheat at step 5 went unchallenged. The state a
    party whose leaves matched rebuilds from is now the latest checkpoint that loads, else its own
    initial state."""
    import shutil

    out = tmp_path / "t"
    shutil.copytree(unfit, out)
    t = Transcript(out)
    replace_chunks(out, {1: short_of_its_last_record(t.chunk_bytes(1), t.spec_hash, 1)})
    if checkpoint == "missing":
        t.paths.checkpoint(0).unlink()
    else:
        t.paths.checkpoint(0).write_bytes(b"not the state")
    result = audit(out, "cpu-1t")
    assert result.rejected_log_steps == (1, NOT_DECODING, NOT_FITTING)
    assert result.first_divergent_step == CHEAT
    assert result.leaves[:CHEAT] == tuple(Transcript(out).leaves()[:CHEAT])
