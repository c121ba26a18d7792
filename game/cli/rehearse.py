"""``vgame node trainer --rehearse NAME@S``: a trainer that cheats on purpose, to try one's own
auditor and judge against it across processes, on a testnet.

Why here, in the command line: the dishonest trainers live in :mod:`game.strategies`, which no
product code imports (the nodes, the agents: import-linter's contract 3). The CLI resolves the name
to a deviation and hands it to the trainer agent through the hook the agent has for it
(:class:`~game.training.engine.train.Deviation`), with the name, which the agent keeps in its state
and its actions. The names are the demo's scenarios that change one step ``S`` of the trainer's
(``vgame demo --help``), so a rehearsal plays across processes what ``vgame demo -s NAME`` plays
in one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from game.errors import ConfigError
from game.scenarios import SCENARIOS, default_step

if TYPE_CHECKING:
    from game.training.engine.train import Deviation
    from game.training.task.config import TaskConfig

#: Every deviation a trainer node can rehearse: the scenarios whose trainer deviates at a step S
#: and otherwise plays the game (a trainer that falls silent or withholds its transcript is no
#: deviation of its training: the product's node does neither).
REHEARSALS: tuple[str, ...] = tuple(
    s.name
    for s in SCENARIOS.values()
    if s.deviation is not None and s.silent_after_challenge is None and not s.withholds
)


@dataclass(frozen=True)
class Rehearsal:
    """One deviation at one step: ``poison@8``."""

    name: str  # one of REHEARSALS
    step: int  # the deviating step S, 1..steps

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.step}"

    def deviation(self, cfg: TaskConfig) -> Deviation:
        """The trainer's deviation for the task ``cfg`` (torch is imported here, not before)."""
        made = SCENARIOS.get(self.name).make_deviation(cfg, self.step)
        assert made is not None  # every name in REHEARSALS has a deviation
        return made

    def banner(self, task_id: int) -> str:
        """The line a rehearsing node starts with (stderr, also under ``--json``)."""
        what = SCENARIOS.get(self.name).summary.split(";")[0].replace("step S", f"step {self.step}")
        return (
            f"REHEARSAL {self.spec}: this trainer cheats on task {task_id} on purpose ({what}). An honest "
            "auditor will challenge it and the trainer will lose its bond and its payment: run it only "
            "against your own auditor, on a testnet."
        )


def parse_rehearsal(text: str, cfg: TaskConfig) -> Rehearsal:
    """``--rehearse NAME@S`` for the task ``cfg``, or one :class:`ConfigError` line naming the valid
    choices: an unknown name, a step that is not a whole number, or one outside the task's steps."""
    name, at, step_text = text.strip().partition("@")
    valid = f"valid: {', '.join(f'{n}@S' for n in REHEARSALS)}, with S a step of the task, 1..{cfg.steps}"
    if name not in REHEARSALS:
        raise ConfigError(f"--rehearse {text}: no deviation is called {name!r}; {valid}")
    if not at or not step_text.isdecimal():
        raise ConfigError(
            f"--rehearse {text}: give the step where the trainer deviates after the @, "
            f"e.g. {name}@{default_step(cfg)}; {valid}"
        )
    step = int(step_text)
    if not 1 <= step <= cfg.steps:
        raise ConfigError(f"--rehearse {text}: the task has steps 1..{cfg.steps}, not {step}; {valid}")
    return Rehearsal(name, step)


__all__ = ["REHEARSALS", "Rehearsal", "parse_rehearsal"]
