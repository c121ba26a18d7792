"""The contract's money rules: what each address gains or loses over a task, before fees.

Why here and not beside the demo: these are the rules of ``docs/contract.md``, "Money (pull
payments)", stated once from the final task and game outcomes alone, independently of the
contract's own bookkeeping; the demo (and its tests) hold every party's balance to them, so a
wrong credit anywhere shows up as a balance that does not add up.

The tables, as applied here:

* ``createTask`` escrows the payment (client: ``-payment``); ``accept`` takes the trainer's bond.
* ``cancel`` credits the payment back; after an accept whose commit window passed, the trainer's
  bond too (the trainer did not deliver).
* ``challenge`` and ``challengeData`` take the auditor's bond. End of a game: trainer wins -> the
  auditor's bond to the trainer; auditor wins, void (the judge silent) or answered (the demanded
  chunk posted) -> the auditor's bond back.
* ``finalize``: no game lost -> payment and bond to the trainer (a void game stops nothing); a game
  lost -> the bond is forfeited (:func:`forfeit_split`): half burnt, each AuditorWon game's auditor a
  share (``claimReward``, counted here as claimed), the client the payment and the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from game.chain.types import Game, Outcome, Task, TaskStatus


@dataclass(frozen=True)
class ForfeitSplit:
    """How a lost task's trainer bond is divided at ``finalize``."""

    share: int  # each AuditorWon game's reward (claimReward)
    burnt: int  # locked in the contract for good
    to_client: int  # the rest, with the payment


def forfeit_split(trainer_bond: int, auditor_bond: int, wins: int) -> ForfeitSplit:
    """The contract's ``_forfeit``: ``floor(B / 2)`` burnt; the rest split evenly among the ``wins``
    winning games, at most one auditor bond each; the client gets what the shares leave.

    Why this shape (docs/contract.md "Money"): the contract cannot tell the auditor who caught a liar
    from the liar's own sybils, nor stop a sybil's game from ending first (the trainer chooses when
    it loses), so every winning game is paid the same share, at the end; the burnt half is what a
    liar loses whatever sybils it runs, and the cap keeps the honest auditor's share whole (its bond
    again) until the liar runs more sybils than the unburnt half can pay in full."""
    if wins < 1:
        raise ValueError("a forfeited bond needs at least one game the auditor won")
    burnt = trainer_bond // 2
    pool = trainer_bond - burnt
    share = min(auditor_bond, pool // wins)
    return ForfeitSplit(share=share, burnt=burnt, to_client=pool - share * wins)


def expected_changes(task: Task, games: Sequence[Game]) -> dict[str, int]:
    """Each (lower-case) address's balance change, before fees, that the money tables promise."""
    out: dict[str, int] = {}

    def add(addr: str, wei: int) -> None:
        out[addr.lower()] = out.get(addr.lower(), 0) + wei

    client, trainer = task.client, task.trainer
    add(client, -task.payment)
    if task.accepted:
        add(trainer, -task.trainer_bond)
    if task.status == TaskStatus.CANCELLED:
        add(client, task.payment + (task.trainer_bond if task.accepted else 0))
        return out
    wins = [g for g in games if g.outcome == Outcome.AUDITOR_WON]
    for g in games:
        add(g.auditor, -task.auditor_bond)
        if g.outcome == Outcome.TRAINER_WON:
            add(trainer, task.auditor_bond)
        elif g.outcome != Outcome.NONE:  # AuditorWon, Void, Answered: the bond goes back
            add(g.auditor, task.auditor_bond)
    if task.status == TaskStatus.FINALIZED:
        if not task.trainer_lost:
            add(trainer, task.payment + task.trainer_bond)
        else:
            split = forfeit_split(task.trainer_bond, task.auditor_bond, len(wins))
            add(client, task.payment + split.to_client)
            for g in wins:
                add(g.auditor, split.share)
    return out


__all__ = ["ForfeitSplit", "expected_changes", "forfeit_split"]
