"""The demo's scenarios: who cheats how, who lies or falls silent, and who must win.

Why a registry: ``vgame demo --scenario NAME``, the scenario tests and the README all name the same
cases, so each is defined once here with the outcome the rules promise. A scenario only *describes*
a run (the trainer's deviation from :mod:`game.strategies.trainers`, whether its node withholds
the transcript (:mod:`game.strategies.withholding`), the auditor's strategy from
:mod:`game.strategies.auditors`, which party falls silent once challenged, the expected winner and
whether the game pins the deviating step);
:mod:`game.demo` plays it. This module imports no torch, so ``vgame --help`` can list the scenarios.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from game.registry import Registry

if TYPE_CHECKING:
    from auditor_node.agent import AuditorStrategy
    from game.training.engine.train import Deviation
    from game.training.task.config import TaskConfig
    from trainer_node.agent import TrainerAgent


Party = Literal["trainer", "auditor"]


@dataclass(frozen=True)
class Scenario:
    """One demo case and the outcome the contract's rules promise for it."""

    name: str
    summary: str  # one line for --help and the verdict panel
    winner: Literal["trainer", "auditor"]  # who must win (the only game, or the task when no game)
    deviation: str | None = None  # name in game.strategies.trainers.DEVIATIONS: the deviation at step S
    auditor_strategy: str = "honest"  # name in game.strategies.auditors.AUDITORS: honest | lying | ...
    silent_after_challenge: Party | None = None  # the demo stops stepping it once a game is open
    pins_step: bool = False  # the game is pinned at exactly S (the deviating step)
    ends_by: str | None = "ruling"  # how the game ends: "ruling" | "timeout" (None: no game)
    withholds: bool = False  # the trainer seals its transcript under a key nobody holds

    @property
    def takes_step(self) -> bool:
        """Whether ``--poison-step`` (the deviating step S) means anything here."""
        return self.deviation is not None

    def make_deviation(self, cfg: TaskConfig, step: int | None) -> Deviation | None:
        """The trainer's deviation for the task ``cfg``, at ``step`` (default: the middle step)."""
        if self.deviation is None:
            return None
        from game.strategies.trainers import DEVIATIONS  # torch: only when a run is really built

        return DEVIATIONS.get(self.deviation)(cfg, default_step(cfg) if step is None else step)

    def trainer_class(self) -> type[TrainerAgent]:
        """The trainer node: the product's, or one that withholds its transcript."""
        if self.withholds:
            from game.strategies.withholding import WithholdingTrainer

            return WithholdingTrainer
        from trainer_node.agent import TrainerAgent

        return TrainerAgent

    def make_auditor(self, seed: int = 0) -> AuditorStrategy:
        """The auditor's strategy (``seed`` drives a lying one's answers)."""
        from game.strategies.auditors import auditor_strategy

        return auditor_strategy(self.auditor_strategy, seed)


def default_step(cfg: TaskConfig) -> int:
    """The deviating step when none is given: the middle of the run (never the first or last)."""
    return max(1, (cfg.steps + 1) // 2)


SCENARIOS: Registry[Scenario] = Registry(
    "scenario",
    [
        (s.name, s)
        for s in (
            Scenario(
                "honest",
                "an honest trainer: the roots match, nobody challenges, the trainer is paid after the window",
                winner="trainer",
                ends_by=None,
            ),
            Scenario(
                "poison",
                "the trainer trains step S on poisoned examples; the game pins step S, the auditor wins",
                winner="auditor",
                deviation="Poison",
                pins_step=True,
            ),
            Scenario(
                "skip-step",
                "the trainer skips step S; the game pins step S, the auditor wins",
                winner="auditor",
                deviation="SkipStep",
                pins_step=True,
            ),
            Scenario(
                "wrong-lr",
                "the trainer uses 10x the learning rate from step S on; the game pins step S",
                winner="auditor",
                deviation="WrongLR",
                pins_step=True,
            ),
            Scenario(
                "tampered-log",
                "the trainer publishes a tampered rounding log for step S; the game pins step S",
                winner="auditor",
                deviation="TamperedLog",
                pins_step=True,
            ),
            Scenario(
                "steer",
                "the trainer rounds values far outside their band the other way in step S and logs it; "
                "the band check rejects the log, the game pins step S, the auditor wins",
                winner="auditor",
                deviation="SteeredLog",
                pins_step=True,
            ),
            Scenario(
                "withhold",
                "the trainer poisons step S and withholds its transcript, answering every demand for "
                "its log; the auditor reads the log off the chain piece by piece, replays it and wins "
                "at step S",
                winner="auditor",
                deviation="Poison",
                pins_step=True,
                withholds=True,
            ),
            Scenario(
                "false-alarm",
                "an honest trainer and a lying auditor that challenges anyway; the trainer wins",
                winner="trainer",
                auditor_strategy="lying",
            ),
            Scenario(
                "trainer-timeout",
                "a poisoning trainer falls silent once challenged; the auditor wins on the trainer's clock",
                winner="auditor",
                deviation="Poison",
                silent_after_challenge="trainer",
                ends_by="timeout",
            ),
            Scenario(
                "auditor-timeout",
                "a lying auditor challenges an honest trainer, then falls silent; the trainer wins on the clock",
                winner="trainer",
                auditor_strategy="silent-after-challenge",
                ends_by="timeout",
            ),
        )
    ],
)
SCENARIO_NAMES: tuple[str, ...] = SCENARIOS.names()


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``, or a ConfigError listing the valid names."""
    return SCENARIOS.get(name)


__all__ = [
    "SCENARIOS",
    "SCENARIO_NAMES",
    "Scenario",
    "default_step",
    "get_scenario",
]
