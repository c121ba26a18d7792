"""The demo's scenarios: who cheats how, who lies or falls silent, and who must win.

Why a registry: ``vgame demo --scenario NAME``, the scenario tests and the README all name the same
cases, so each is defined once here with the outcome the rules promise. A scenario only *describes*
a run (the trainer's deviation from :mod:`game.deviations`, the auditor's strategy, which party
falls silent once challenged, the expected winner and whether the game pins the deviating step);
:mod:`game.demo` plays it. This module imports no torch, so ``vgame --help`` can list the scenarios.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from game.errors import ConfigError

if TYPE_CHECKING:
    from game.training.engine.train import Deviation
    from game.training.task.config import TaskConfig


Party = Literal["trainer", "auditor"]
DeviationFactory = Callable[["TaskConfig", int], "Deviation"]


@dataclass(frozen=True)
class Scenario:
    """One demo case and the outcome the contract's rules promise for it."""

    name: str
    summary: str  # one line for --help and the verdict panel
    winner: Literal["trainer", "auditor"]  # who must win (the only game, or the task when no game)
    deviation: str | None = None  # class in game.deviations: the trainer's deviation at step S
    auditor_strategy: str = "honest"  # AuditorAgent strategy: honest | lying | silent-after-challenge
    silent_after_challenge: Party | None = None  # the demo stops stepping it once a game is open
    pins_step: bool = False  # the game is pinned at exactly S (the deviating step)
    ends_by: str | None = "ruling"  # how the game ends: "ruling" | "timeout" (None: no game)

    @property
    def takes_step(self) -> bool:
        """Whether ``--poison-step`` (the deviating step S) means anything here."""
        return self.deviation is not None

    def make_deviation(self, cfg: TaskConfig, step: int | None) -> Deviation | None:
        """The trainer's deviation for the task ``cfg``, at ``step`` (default: the middle step)."""
        if self.deviation is None:
            return None
        from game import deviations  # torch: only when a run is really built

        factory: DeviationFactory = getattr(deviations, self.deviation)
        return factory(cfg, default_step(cfg) if step is None else step)


def default_step(cfg: TaskConfig) -> int:
    """The deviating step when none is given: the middle of the run (never the first or last)."""
    return max(1, (cfg.steps + 1) // 2)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
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
}

SCENARIO_NAMES: tuple[str, ...] = tuple(SCENARIOS)


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``, or a ConfigError listing the valid names."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ConfigError(f"unknown scenario {name!r}; valid: {', '.join(SCENARIO_NAMES)}") from None


__all__ = [
    "SCENARIOS",
    "SCENARIO_NAMES",
    "DeviationFactory",
    "Scenario",
    "default_step",
    "get_scenario",
]
