"""The contract's money rules: what each address gains or loses over a task, before fees.

Why here and not beside the demo: these are the rules of ``docs/contract.md``, "Money (pull
payments)", stated once from the final task and game outcomes alone, independently of the
contract's own bookkeeping; the demo (and its tests) hold every party's balance to them, so a
wrong credit anywhere shows up as a balance that does not add up.

The tables, as applied here:

* ``createTask`` escrows the payment (client: ``-payment``); ``cancel`` credits it back.
* ``commit`` takes the trainer's bond; ``challenge`` takes the auditor's bond.
* End of a game: trainer wins -> the auditor's bond to the trainer; auditor wins -> its bond back,
  plus the trainer's bond in the first game the trainer loses; void -> the auditor's bond back.
* ``finalize``: the trainer lost a game -> payment to the client; no game lost but one void ->
  payment to the client, the trainer's bond back; otherwise payment and bond to the trainer.
"""

from __future__ import annotations

from collections.abc import Sequence

from game.chain.types import Game, Outcome, Task, TaskStatus


def expected_changes(task: Task, games: Sequence[Game]) -> dict[str, int]:
    """Each (lower-case) address's balance change, before fees, that the money tables promise."""
    out: dict[str, int] = {}

    def add(addr: str, wei: int) -> None:
        out[addr.lower()] = out.get(addr.lower(), 0) + wei

    client, trainer = task.client, task.trainer
    add(client, -task.payment)
    if task.status == TaskStatus.CANCELLED:
        add(client, task.payment)
        return out
    if task.committed:
        add(trainer, -task.trainer_bond)
    first_loss = True
    for g in games:
        add(g.auditor, -task.auditor_bond)
        if g.outcome == Outcome.TRAINER_WON:
            add(trainer, task.auditor_bond)
        elif g.outcome == Outcome.AUDITOR_WON:
            add(g.auditor, task.auditor_bond + (task.trainer_bond if first_loss else 0))
            first_loss = False
        elif g.outcome == Outcome.VOID:
            add(g.auditor, task.auditor_bond)
    if task.status == TaskStatus.FINALIZED:
        if task.trainer_lost:
            add(client, task.payment)
        elif task.any_void:
            add(client, task.payment)
            add(trainer, task.trainer_bond)
        else:
            add(trainer, task.payment + task.trainer_bond)
    return out


__all__ = ["expected_changes"]
