"""What a refusal of carried state says: what changed, whose it is, and where to keep it instead.

Why a module of its own: :mod:`.carried` finds what a task carries from step to step and judges it;
the words and the fix each case is given (a non-persistent buffer, a list of losses kept for a plot,
an optimizer's attribute, anything else) change on their own.
"""

from __future__ import annotations

from typing import Any

from game.errors import CarriedStateError

NON_PERSISTENT = " (a non-persistent buffer)"  # the suffix of such a buffer's key
OPTIMIZER = "optimizer."  # the prefix of an optimizer's attribute's key
ABSENT = "(absent)"  # what a key that came or went stands for where it is not


def in_model(key: str) -> bool:
    """Whether a :func:`~.carried.carried` key is a module's or the optimizer's attribute, which a judge's
    model and optimizer, built afresh, start without (a function's data otherwise)."""
    return key.startswith(("model.", OPTIMIZER))


def refusal(
    first: dict[str, Any], now: dict[str, Any], keys: list[str], first_step: int, step: int, why: str = ""
) -> CarriedStateError:
    """The error naming what changed (``keys``) between the model's first step here
    (``first_step``) and step ``step``; ``why``: what showed it matters, where something did."""
    buffers = [k.partition(" ")[0].rpartition(".")[2] for k in keys if k.endswith(NON_PERSISTENT)]
    if buffers:
        fix = (
            f"register {', '.join(repr(b) for b in buffers)} as a persistent buffer (persistent=True, "
            "the default), which every step commits, or compute it afresh in each step"
        )
    elif all(not in_model(k) and _grown(first.get(k), now.get(k)) for k in keys):
        fix = (
            "a list or dict that only grows (losses kept for a log or a plot) is the same in every "
            "model this process builds, so the trainer cannot show it harmless; keep it on the model "
            "(self.losses = [] in its __init__, appended in the loss): a judge's model built afresh "
            "starts without it, and the trainer re-runs a step so to show it does not reach the "
            "step's work; or report values with Task.metrics"
        )
    elif all(k.startswith(OPTIMIZER) for k in keys):
        fix = (
            "keep such a value in the optimizer's per-parameter state, as a tensor or a number "
            "(self.state[p]['slow'] = p.detach().clone(); a count as self.state[p]['step'] = 0), which "
            "every step commits, or compute it afresh in each step"
        )
    else:
        fix = (
            "keep such a value in a persistent buffer (self.register_buffer('calls', "
            "torch.zeros((), dtype=torch.long)), updated in place), or compute it afresh in each step"
        )
    shown = "; ".join(
        f"{k}: {_shown(first.get(k, ABSENT))} at step {first_step}, {_shown(now.get(k, ABSENT))} now"
        for k in keys[:3]
    )
    more = f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""
    return CarriedStateError(
        f"step {step}: the task's {_whose(keys)} carries Python state from step to step, outside the "
        f"state a step commits ({shown}{more}){why}. A judge re-running a step from its committed "
        "state, or an auditor starting from a checkpoint, starts without it, and would rule an honest "
        f"step wrong: {fix}"
    )


def _grown(first: Any, now: Any) -> bool:
    """Whether a list's or dict's stand-in (:func:`~.carried._value`) only gained entries at its end."""
    if not (isinstance(first, tuple) and isinstance(now, tuple) and len(first) == len(now) == 2):
        return False
    if first[0] != now[0] or first[0] not in ("list", "dict"):
        return False
    return len(now[1]) > len(first[1]) and now[1][: len(first[1])] == first[1]


def _whose(keys: list[str]) -> str:
    """Who carries what ``keys`` name: the model, the optimizer or the loss, or several."""
    who = {
        "model" if k.startswith("model.") else "optimizer" if k.startswith(OPTIMIZER) else "loss"
        for k in keys
    }
    names = [w for w in ("model", "optimizer", "loss") if w in who]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["ABSENT", "NON_PERSISTENT", "OPTIMIZER", "in_model", "refusal"]
