"""Every demo scenario, played end to end on the embedded chain at CI size.

The promises checked are the protocol's: a deviating trainer is pinned at exactly its deviating
step and loses; an honest trainer wins whatever a lying auditor does; the silent side loses on its
clock; trainer and auditor are on different profiles; and the money adds up (the contract ends
empty and every balance moved by what the rules say, minus the fees its owner paid).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from game.chain.types import EndReason, Game, Outcome, Phase, Task, TaskStatus
from game.demo import run_scenario
from game.demoreport import DemoResult
from game.errors import ConfigError
from game.protocol.payouts import expected_changes
from game.scenarios import SCENARIO_NAMES, SCENARIOS, default_step, get_scenario
from game.strategies.auditors import AUDITORS, auditor_strategy
from game.strategies.trainers import DEVIATIONS, Poison, SkipStep, SteeredLog, TamperedLog, WrongLR
from game.tasks import TaskTerms
from game.training.engine.audit import audit
from game.training.engine.train import train
from game.training.task.config import TaskConfig

STEPS = 7


def tiny_config(**overrides: Any) -> TaskConfig:
    """mlp-digits, 7 steps of 8 examples: trains and replays in a fraction of a second."""
    base: dict[str, Any] = {
        "model": {"hidden": 16},
        "batch_size": 8,
        "steps": STEPS,
        "checkpoint_interval": 4,
    }
    return TaskConfig.for_preset("mlp-digits", **{**base, **overrides})


def play(name: str, tmp_path: Path, **kwargs: Any) -> DemoResult:
    return run_scenario(name, config=tiny_config(), workdir=tmp_path / name, **kwargs)


def check_money(result: DemoResult) -> None:
    # the contract keeps only the burnt half of a lost trainer's bond
    burnt = 0 if result.trainer_paid else TaskTerms().trainer_bond // 2
    assert result.contract_balance == result.burnt == burnt
    assert result.balances_ok, {k: v.to_dict() for k, v in result.balances.items()}
    for party in ("client", "trainer"):
        assert result.balances[party].gas_cost > 0  # fees are really counted, not assumed zero


# ----------------------------------------------------------------------------------------------
# Deviations, offline: each first diverges at exactly its step
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("deviation", [Poison, SkipStep, WrongLR, TamperedLog, SteeredLog])
@pytest.mark.parametrize("step", [1, 4, STEPS])
def test_deviation_first_diverges_at_its_step(deviation: Any, step: int, tmp_path: Path) -> None:
    cfg = tiny_config()
    train(cfg, "cpu-1t", tmp_path / "t", deviation=deviation(cfg, step))
    result = audit(tmp_path / "t", "noisy")
    assert not result.match
    assert result.first_divergent_step == step


def test_tampered_log_swaps_down_and_up_only(tmp_path: Path) -> None:
    from game.training.transcript.reader import Transcript

    cfg = tiny_config(log_format="packed")
    dev = TamperedLog(cfg, 3)
    train(cfg, "cpu-1t", tmp_path / "honest")
    train(cfg, "cpu-1t", tmp_path / "tampered", deviation=dev)
    honest, tampered = Transcript(tmp_path / "honest"), Transcript(tmp_path / "tampered")
    assert dev.flipped > 0
    assert honest.leaves() == tampered.leaves()  # the trainer computed honestly; only the log lies
    assert [honest.chunk_bytes(s) == tampered.chunk_bytes(s) for s in range(STEPS + 1)] == [
        s != 3 for s in range(STEPS + 1)
    ]
    h, t = honest.read_log(3), tampered.read_log(3)
    assert h.records == t.records
    a, b = h.all_trits(), t.all_trits()
    assert ((a == 1) == (b == 1)).all()  # "no entry" stays
    assert ((a == 0) == (b == 2)).all() and ((a == 2) == (b == 0)).all()
    assert int((a != b).sum()) == dev.flipped


def test_tampered_sparse_log_lies_inside_the_band_and_is_caught_by_the_state(tmp_path: Path) -> None:
    from game.training.transcript.reader import Transcript

    cfg = tiny_config()
    dev = TamperedLog(cfg, 3)
    train(cfg, "cpu-1t", tmp_path / "honest")
    train(cfg, "cpu-1t", tmp_path / "tampered", deviation=dev)
    honest, tampered = Transcript(tmp_path / "honest"), Transcript(tmp_path / "tampered")
    h, t = honest.read_log(3), tampered.read_log(3)
    assert h.records == t.records and honest.leaves() == tampered.leaves()  # only the log lies
    assert dev.flipped > 0
    assert [
        torch.equal(a.positions, b.positions) for a, b in zip(h.entries(), t.entries(), strict=True)
    ].count(False) > 0
    result = audit(tmp_path / "tampered", "noisy")
    assert (
        result.first_divergent_step == 3 and 3 not in result.rejected_log_steps
    )  # inside the band: no log error


@pytest.mark.parametrize("log_format", ["sparse", "packed"])
def test_steered_log_is_rejected_naming_step_op_and_value(log_format: str, tmp_path: Path) -> None:
    cfg = tiny_config(log_format=log_format)
    dev = SteeredLog(cfg, 3)
    train(cfg, "cpu-1t", tmp_path / "honest")
    train(cfg, "cpu-1t", tmp_path / "steered", deviation=dev)
    assert dev.steered > 0
    from game.training.transcript.reader import Transcript

    honest, steered = Transcript(tmp_path / "honest"), Transcript(tmp_path / "steered")
    assert honest.leaves()[:3] == steered.leaves()[:3] and honest.leaf(3) != steered.leaf(3)
    result = audit(tmp_path / "steered", "noisy")
    assert not result.match and result.first_divergent_step == 3
    assert result.rejected_log_steps[0] == 3
    assert re.search(
        r"log tampering at step 3, op #\d+ aten\.\S+, value \d+: .*outside", result.log_errors[0]
    )


@pytest.mark.parametrize("deviation", [Poison, WrongLR])
def test_audit_applies_the_log_only_up_to_the_first_divergent_step(
    deviation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After the states part, the trainer's later chunks describe other values: they are not
    rejected as tampered (the demo printed one "log tampering" warning a step for a poisoned batch)."""
    cfg = tiny_config()
    train(cfg, "cpu-1t", tmp_path / "t", deviation=deviation(cfg, 3))
    with caplog.at_level(logging.WARNING, logger="game.training.engine.audit"):
        result = audit(tmp_path / "t", "noisy")
    assert not result.match and result.first_divergent_step == 3
    assert all(step <= 3 for step in result.rejected_log_steps), result.rejected_log_steps
    assert len(result.log_errors) == len(result.rejected_log_steps)
    warned = [r for r in caplog.records if "log chunk is rejected" in r.getMessage()]
    assert len(warned) == len(result.rejected_log_steps)


@pytest.mark.parametrize("deviation", [Poison, SkipStep, WrongLR, TamperedLog, SteeredLog])
@pytest.mark.parametrize("step", [0, STEPS + 1])
def test_deviation_step_must_be_a_training_step(deviation: Any, step: int) -> None:
    with pytest.raises(ConfigError, match=rf"1\.\.{STEPS}"):
        deviation(tiny_config(), step)


def test_wrong_lr_refuses_a_factor_of_one() -> None:
    with pytest.raises(ConfigError, match="factor"):
        WrongLR(tiny_config(), 2, factor=1.0)


# ----------------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------------


def test_registry_names_every_required_scenario() -> None:
    assert set(SCENARIO_NAMES) == {
        "honest",
        "poison",
        "skip-step",
        "wrong-lr",
        "tampered-log",
        "steer",
        "withhold",
        "false-alarm",
        "trainer-timeout",
        "auditor-timeout",
    }
    for s in SCENARIOS.values():
        assert s.pins_step == (s.deviation is not None and s.ends_by == "ruling")


def test_everyScenario_namesADeviationAndAnAuditorStrategyThatExist() -> None:
    for s in SCENARIOS.values():
        if s.deviation is not None:
            assert s.deviation in DEVIATIONS
        assert s.make_auditor(seed=1).name == s.auditor_strategy
    assert AUDITORS.names() == ("honest", "lying", "silent-after-challenge")


def test_unknown_auditor_strategy_is_a_clear_error() -> None:
    with pytest.raises(
        ConfigError, match=r"^auditor strategy 'sly' is not one of honest, lying, silent-after-challenge$"
    ):
        auditor_strategy("sly")


def test_unknown_scenario_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"unknown scenario 'nope'.*poison"):
        get_scenario("nope")


def test_default_deviating_step_is_inside_the_run() -> None:
    for steps in (1, 2, 7, 50):
        assert 1 <= default_step(tiny_config(steps=steps)) <= steps
    dev = get_scenario("poison").make_deviation(tiny_config(), None)
    assert isinstance(dev, Poison) and 1 < dev.step < STEPS


def test_trainer_and_auditor_must_differ(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="different profiles"):
        play("honest", tmp_path, trainer_profile="noisy", auditor_profile="noisy")


def test_deviating_step_given_to_an_honest_scenario_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no deviating step"):
        play("honest", tmp_path, poison_step=2)


# ----------------------------------------------------------------------------------------------
# Every scenario, end to end
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_scenario_ends_as_the_rules_promise(name: str, tmp_path: Path) -> None:
    scenario = get_scenario(name)
    seen: list[Any] = []
    bars: set[str] = set()
    result = play(name, tmp_path, on_action=seen.append, progress=lambda label, done, total: bars.add(label))

    assert result.winner == scenario.winner
    assert result.trainer_paid == (scenario.winner == "trainer")
    assert result.trainer_profile != result.auditor_profile
    assert result.judge_profile not in (result.trainer_profile, result.auditor_profile)
    check_money(result)
    assert {"train", "replay"} <= bars
    assert [a.tx_hash for a in seen if a.tx_hash] == [a.tx_hash for a in result.actions if a.tx_hash]
    assert result.transactions == len({a.tx_hash for a in seen if a.tx_hash})

    if scenario.ends_by is None:
        assert result.games == () and result.moves == 0
        return
    bisections = [g for g in result.games if not g.availability]
    assert len(bisections) == 1
    game = bisections[0]
    assert result.end_reason == game.reason == scenario.ends_by
    assert game.winner == scenario.winner
    if scenario.pins_step:
        assert result.deviation_step == default_step(tiny_config())
        assert result.disputed_step == result.deviation_step
        rules = [a for a in result.actions if a.what == "rule"]
        assert [(a.actor, a.leaf_index) for a in rules] == [("judge", result.deviation_step)]
    demands = [g for g in result.games if g.availability]
    assert result.demands == len(demands)
    if scenario.withholds:  # the whole log was read off the chain, every piece posted by the trainer
        assert [g.outcome for g in demands] == ["answered"] * (STEPS + 1)
    else:
        assert demands == []
    if scenario.ends_by == "timeout":
        timeouts = [a for a in result.actions if a.what == "timeout"]
        assert [a.actor for a in timeouts] == [scenario.winner]  # the waiting side ends it
        assert not any(a.what == "rule" for a in result.actions)


def test_silent_trainer_sends_nothing_after_the_challenge(tmp_path: Path) -> None:
    result = play("trainer-timeout", tmp_path)
    whats = [(a.actor, a.what) for a in result.actions if a.what != "idle"]
    after = whats[whats.index(("auditor", "challenge")) :]
    assert not any(actor == "trainer" for actor, _ in after)
    # the winning auditor settles what the silent trainer would have, to claim its reward
    assert ("auditor", "finalize") in after and ("auditor", "claim") in after


def test_silent_auditor_never_answers(tmp_path: Path) -> None:
    result = play("auditor-timeout", tmp_path)
    assert not any(a.what == "respond" for a in result.actions)
    assert [a.what for a in result.actions if a.actor == "trainer" and a.game_id is not None] == [
        "reveal",
        "timeout",
    ]


@pytest.mark.parametrize("step", [1, 2, 5, STEPS])
def test_poison_pins_exactly_the_poisoned_step(step: int, tmp_path: Path) -> None:
    result = play("poison", tmp_path, poison_step=step)
    assert result.deviation_step == step
    assert result.disputed_step == step
    assert result.winner == "auditor"
    check_money(result)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_false_alarm_trainer_wins_whatever_path_the_liar_takes(seed: int, tmp_path: Path) -> None:
    result = play("false-alarm", tmp_path, auditor_seed=seed)
    assert result.winner == "trainer"
    assert result.trainer_paid
    assert result.disputed_step is not None and 1 <= result.disputed_step <= STEPS
    check_money(result)


# ----------------------------------------------------------------------------------------------
# The money rules, on their own
# ----------------------------------------------------------------------------------------------

CLIENT, TRAINER, JUDGE, AUD1, AUD2 = (f"0x{i:040x}" for i in range(1, 6))
PAY, TBOND, ABOND = 1000, 300, 70


def _task(status: TaskStatus, *, lost: bool = False, void: bool = False, accepted: bool = True) -> Task:
    z = b"\0" * 32
    committed = status not in (TaskStatus.OPEN, TaskStatus.ACCEPTED, TaskStatus.CANCELLED)
    return Task(
        CLIENT,
        60,
        60,
        status,
        lost,
        void,
        TRAINER,
        9,  # numLeaves, fixed at creation
        0,
        JUDGE,
        60,
        1_000 if committed else 0,  # windowEnds: set by the commit
        TBOND,
        ABOND,
        PAY,
        600,  # commitWindow
        500 if accepted else 0,  # commitBy: set by the accept
        0,
        z,
        z,
        z,
        z,
        z,
        z,
        z,
    )


def _game(auditor: str, outcome: Outcome) -> Game:
    z = b"\0" * 32
    return Game(
        0, 1, 0, 0, 0, Phase.ENDED, auditor, 1, False, False, 0, 0, outcome, EndReason.RULING, False, z, z, z
    )


def test_expected_changes_follow_the_contract_tables() -> None:
    fin = TaskStatus.FINALIZED
    honest = expected_changes(_task(fin), [])
    assert honest == {CLIENT.lower(): -PAY, TRAINER.lower(): PAY}
    # two winners share the unburnt half (150 each, the cap is 70): the client gets the rest
    lost = expected_changes(
        _task(fin, lost=True), [_game(AUD1, Outcome.AUDITOR_WON), _game(AUD2, Outcome.AUDITOR_WON)]
    )
    pool = TBOND - TBOND // 2
    share = min(ABOND, pool // 2)
    assert lost == {
        CLIENT.lower(): pool - 2 * share,
        TRAINER.lower(): -TBOND,
        AUD1.lower(): share,
        AUD2.lower(): share,
    }
    assert sum(lost.values()) == -(TBOND // 2)  # the burnt half leaves everyone's books
    # a void game (the judge silent) stops nothing: the trainer is paid
    void = expected_changes(_task(fin, void=True), [_game(AUD1, Outcome.VOID)])
    assert void == {CLIENT.lower(): -PAY, TRAINER.lower(): PAY, AUD1.lower(): 0}
    answered = expected_changes(_task(fin), [_game(AUD1, Outcome.ANSWERED)])
    assert answered == {CLIENT.lower(): -PAY, TRAINER.lower(): PAY, AUD1.lower(): 0}
    won = expected_changes(_task(fin), [_game(AUD1, Outcome.TRAINER_WON)])
    assert won == {CLIENT.lower(): -PAY, TRAINER.lower(): PAY + ABOND, AUD1.lower(): -ABOND}
    cancelled = expected_changes(_task(TaskStatus.CANCELLED, accepted=False), [])
    assert cancelled == {CLIENT.lower(): 0}
    # accepted, then the commit window passed: the client takes the trainer's bond
    late = expected_changes(_task(TaskStatus.CANCELLED), [])
    assert late == {CLIENT.lower(): TBOND, TRAINER.lower(): -TBOND}
    # the leaf count is fixed at creation: a task never accepted has one, and no trainer bond paid
    uncommitted = expected_changes(_task(TaskStatus.OPEN, accepted=False), [])
    assert uncommitted == {CLIENT.lower(): -PAY}


def test_injected_text_is_pinned_on_the_character_gpt(tmp_path: Path) -> None:
    cfg = TaskConfig.for_preset(
        "gpt-shakespeare", steps=4, batch_size=2, model={"n_layer": 1, "n_embd": 16, "block_size": 8}
    )
    result = run_scenario("poison", config=cfg, poison_step=3, workdir=tmp_path)
    assert (result.preset, result.disputed_step, result.winner) == ("gpt-shakespeare", 3, "auditor")
    check_money(result)
