"""How far from a rounding midpoint each party accepts a direction the trainer's log gives.

The judge's ruling is the rule: a sparse log's entry is accepted where its value lies within
``16 B`` of a midpoint, a packed log's correction within ``4 B`` (``B << widen``, ``widen`` 4 and
2; :mod:`.bandcheck`). Each party measures ``d`` and ``B`` on its own machine, and two machines
disagree a little on both (:mod:`.bandcheck`'s docstring): their ``d`` by ``delta <= B / 16``, and
their ``B`` by up to 2x, where the tensor's largest value sits on a power of two and ``e(S)`` differs
by one binade. So a single threshold would leave an edge that a trainer can aim at: an entry just
past ``16 B`` on the auditor's machine and just inside it on the judge's. The auditor refuses the
chunk and disputes the step, the judge accepts it and rules for the trainer, and the honest auditor
loses its bond. Hence three reaches, by who checks (:data:`Checks`):

* ``judge``: ``B << widen``, the rule.
* ``audit``: ``(B << (widen + 1)) + B / 8``, an auditor deciding whether to dispute. An entry it
  refuses has ``d_A > 2**(widen+1) B_A + B_A / 8``, so on the judge's machine
  ``d_J >= d_A - B_A / 16 > 2**(widen+1) B_A >= 2**widen B_J``: the judge refuses it too. An entry
  it accepts and the judge would refuse is left alone (the auditor replays it with the log and agrees
  where the trainer's state matches). That is the price: a trainer may choose the side of values
  out to about ``33 B`` (``9 B`` in a packed log) where nobody disputes, against ``16 B`` (``4 B``)
  by the rule. Either way it chooses only between a value's two grid neighbours.
* ``rebuild``: ``B << (widen + 3)``, a party rebuilding states that both sides agreed on (the
  judge's pre-state without the auditor's evidence, a client's final model). It accepts every entry
  an auditor accepted: ``d_J <= d_A + B_A / 16 <= 2**(widen+2) B_J + B_J / 2``. Where the agreed
  state was computed without the log (the auditor refused the chunk), the committed leaf tells: a
  rebuilding replay whose state with the log misses its leaf runs that step again without it
  (``game.training.engine.replay.replay_forward``).
"""

from __future__ import annotations

from typing import Literal, TypeVar

from torch import Tensor

#: Who checks a log's entries: the judge's ruling, an auditor deciding whether to dispute, or a
#: rebuild of agreed states.
Checks = Literal["judge", "audit", "rebuild"]
CHECKS: tuple[Checks, ...] = ("judge", "audit", "rebuild")

_T = TypeVar("_T", Tensor, int)


def reach(band: _T, widen: int, checks: Checks = "judge") -> _T:
    """The farthest an accepted entry may lie from its midpoint, in ``band``'s units (float64 ulps of
    the value), for a log whose rule is ``B << widen`` (module docstring)."""
    if checks == "judge":
        return band << widen
    if checks == "audit":
        return (band << (widen + 1)) + (band >> 3)
    if checks == "rebuild":
        return band << (widen + 3)
    raise ValueError(f"checks: {checks!r} is not one of {', '.join(CHECKS)}")


__all__ = ["CHECKS", "Checks", "reach"]
