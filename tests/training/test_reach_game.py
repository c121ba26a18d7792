"""A trainer that lists values between the judge's reach and an auditor's (16 to 32 bands from their
midpoints; ``game.training.numerics.reach``), end to end through a transcript.

Steered: its step-2 state is computed with those directions. The auditor accepts them and agrees
(it no longer disputes what a judge on another machine might accept); the judge's rule refuses
them; a rebuild of the agreed states through step 2 replays them, as the auditor did.

Honest, with the steered chunk in place of its own: the auditor accepts the chunk, replays it with
the log, finds another state and disputes step 2, which the judge rules against the trainer; a
rebuild of the agreed states replays step 2 without the log, as the committed leaf says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from game.evidence import PreStateEvidenceError
from game.judgeupdate import judged_step, rebuilt_state
from game.strategies.trainers import SteeredLog
from game.training.engine.audit import audit
from game.training.engine.replay import replayed
from game.training.engine.states import decode_state
from game.training.engine.step import engine_for
from game.training.engine.train import train
from game.training.log.formats import ChunkLog
from game.training.log.sparse import SparseStepLog
from game.training.numerics import bandcheck, rounding
from game.training.numerics.bandfile import Band
from game.training.numerics.reach import reach
from game.training.state.leafhash import leaf_of
from game.training.state.tensors import TrainState
from game.training.task.config import TaskConfig
from game.training.transcript.reader import Transcript
from tests.training.test_unfit_chunks import replace_chunks

STEPS, STEERED = 4, 2
TRAINER, AUDITOR = "cpu-1t", "splitk-16"


class SteeredPastTheRule(SteeredLog):
    """:class:`SteeredLog`, its values between 16 and 32 bands from their midpoints."""

    def steer(self, step_log: ChunkLog | None, x: Tensor, r: Tensor, bits: int, band: Band) -> None:
        """List up to ``per_tensor`` such values whose nearest neighbour is even: they go to the odd
        one, in the state and in the log."""
        assert isinstance(step_log, SparseStepLog)
        xf = rounding._int_view(x.detach()).reshape(-1)
        geo = bandcheck.geometry(xf, bits, band)
        between = geo.off & (geo.distance > reach(geo.band, 4, "judge")) & (geo.distance <= geo.band << 5)
        cand = between.nonzero().squeeze(1)
        even, odd = bandcheck._neighbours(xf, cand, bits)
        flat = r.view(-1)
        at_even = flat.index_select(0, cand).view(torch.int64) == even.view(torch.int64)
        pick = cand[at_even][: self.per_tensor]
        if pick.numel() == 0:
            return
        flat.index_copy_(0, pick, odd[at_even][: self.per_tensor])
        last = step_log.pop()
        positions = torch.cat([last.positions, pick.to(last.positions.device)]).unique()
        step_log.append(last.record.op_index, last.record.op_name, last.record.count, positions)
        self.steered += int(pick.numel())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cfg = TaskConfig.for_preset("mlp-digits", steps=STEPS, batch_size=8, model={"hidden": 16})
    root = tmp_path_factory.mktemp("reach")
    steered = SteeredPastTheRule(cfg, STEERED)
    train(cfg, TRAINER, root / "steered", deviation=steered)
    assert steered.steered > 0
    train(cfg, TRAINER, root / "honest")
    replace_chunks(root / "honest", {STEERED: Transcript(root / "steered").chunk_bytes(STEERED)})
    return {"steered": root / "steered", "swapped": root / "honest"}


def _start(t: Transcript, starts: list[int]) -> TrainState:
    starts.append(1)
    return decode_state(t.load_checkpoint(0), t.config)


def test_anAuditorOnOtherHardware_acceptsWhatOnlyTheJudgesRuleRefuses_andAgrees(
    runs: dict[str, Path],
) -> None:
    """Before, it refused step 2's chunk and disputed the step: a judge on other hardware could
    accept the chunk and rule for the trainer, the honest auditor's bond lost."""
    result = audit(runs["steered"], AUDITOR)
    assert result.rejected_log_steps == () and result.first_divergent_step is None
    ruling = judged_step(runs["steered"], STEERED, TRAINER)
    assert ruling.rejected.startswith("log rejected") and not ruling.matches_transcript


def test_aRebuildOfTheAgreedStates_replaysWhatTheAuditorAccepted(runs: dict[str, Path]) -> None:
    t = Transcript(runs["steered"])
    want = t.leaf(STEPS - 1)
    data = rebuilt_state(t, engine_for(t.config, AUDITOR, checks="rebuild"), STEPS - 1, want)
    assert leaf_of(data) == want
    with pytest.raises(PreStateEvidenceError, match="does not reproduce"):
        rebuilt_state(t, engine_for(t.config, AUDITOR), STEPS - 1, want)  # by the judge's rule


def test_aChunkTheAuditorReplaysToAnotherState_isDisputed_andRuledAgainst(runs: dict[str, Path]) -> None:
    result = audit(runs["swapped"], AUDITOR)
    assert result.rejected_log_steps == () and result.first_divergent_step == STEERED
    assert judged_step(runs["swapped"], STEERED, AUDITOR).rejected.startswith("log rejected")


def test_aRebuild_runsAStepWithoutItsLog_whereTheLeafSaysTheStateWasComputedSo(runs: dict[str, Path]) -> None:
    """With the log, step 2's state misses its leaf: the rebuild starts again once, step 2 without
    the log, and reaches the agreed state."""
    t = Transcript(runs["swapped"])
    engine = engine_for(t.config, AUDITOR, checks="rebuild")
    starts: list[int] = []
    state = replayed(t, engine, lambda: _start(t, starts), STEPS, check_leaves=False)
    assert len(starts) == 2
    from game.training.state.leaves import state_hash

    assert state_hash(state) == t.leaf(STEPS)


def test_anAsynchronousRebuild_runsAnUpdateWithoutItsLog_whereTheLeafSaysTheStateWasComputedSo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``scheduled.states_for`` as ``replay.replay_forward``: an update whose state with its log
    misses its leaf (here made so after the update ran) runs again without the log in a rebuild;
    the judge's rule, checking leaves, says the transcript disagrees."""
    from game.errors import TranscriptError
    from game.training.engine import scheduled
    from game.training.state.leaves import state_hash
    from tests.training.schedules import simulated_schedule

    cfg = TaskConfig.for_preset(
        "mlp-digits", model={"hidden": 16}, batch_size=8, steps=6, accumulate=2, max_staleness=2,
        checkpoint_interval=6,
    )  # fmt: skip
    entries, _, _ = simulated_schedule(cfg.steps, 2, 2, workers=3, seed=7)
    scheduled.train_scheduled(cfg, TRAINER, tmp_path / "t", entries)
    t = Transcript(tmp_path / "t")
    honest_run = scheduled.run_entry
    runs: list[tuple[int, bool]] = []

    def other_state_with_the_log(
        ue: Any, state: TrainState, entry: Any, step_log: Any, versions: Any
    ) -> None:
        honest_run(ue, state, entry, step_log, versions)
        runs.append((entry.update, step_log is not None))
        if entry.update == STEERED and step_log is not None:
            with torch.no_grad():
                next(state.model.parameters()).view(-1)[0] *= 2  # still on the grid

    monkeypatch.setattr(scheduled, "run_entry", other_state_with_the_log)
    state, found = scheduled.states_for(
        t, engine_for(cfg, AUDITOR, checks="rebuild"), [5], check_leaves=False
    )
    assert state_hash(state) == t.leaf(5) and leaf_of(found[5]) == t.leaf(5)
    again = [(1, True), (STEERED, False)]  # from checkpoint 0 again, update 2 without its log
    assert runs == [(1, True), (STEERED, True), *again, *[(u, True) for u in range(STEERED + 1, 6)]]
    with pytest.raises(TranscriptError, match=f"does not reproduce leaf {STEERED}"):
        scheduled.states_for(t, engine_for(cfg, AUDITOR), [5])
