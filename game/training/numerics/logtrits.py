"""The rounding log's trits: the trainer's log direction and the auditor's correction (Algorithms 1, 3).

Apart from :mod:`~game.training.numerics.rounding` (the grid itself) because only the packed log
uses them: from the dropped bits of a float64 follow, with the same integer analysis as
:func:`~game.training.numerics.rounding.rnd`, the log trit (distance to the chosen grid point
against an *integer* threshold derived from ``tau``; ANCHORS.md: the paper's decimal exponent made
tau drift from 5 % to 98 %) and the two bracketing grid points that :func:`rev` chooses between.
"""

from __future__ import annotations

import torch

from game.training.numerics.rounding import (
    _TAU_SCALE,
    RoundingInputError,
    _flat,
    _grid,
    _odd,
    _rare_lanes,
    _round_fast_,
    _slow,
    _tau_fixed,
)

TRIT_DOWN = 0
TRIT_IGNORE = 1
TRIT_UP = 2


def log_threshold(bits: int, tau: float) -> int:
    """``floor(tau * step)`` in float64 ulps of a normal value: its distance ``d`` to the chosen grid
    point exceeds ``tau * step`` exactly when ``d > threshold`` (tau is a multiple of 2**-62)."""
    return _tau_fixed(tau) >> (_TAU_SCALE - _grid(bits).k0)


def round_and_log(x: torch.Tensor, bits: int, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Trainer kernel: ``(rnd(x), trits)`` from one analysis of ``x``'s bits.

    Trit 2 (up) when ``rnd(x) > x`` and ``|x - rnd(x)| > tau * ulp(x)``, 0 (down) for ``rnd(x) < x`` and
    the same, else 1 (ignore; also on-grid values, ±inf and NaN). Trits are uint8 shaped like ``x``.
    """
    g = _grid(bits)
    tau_fixed = _tau_fixed(tau)
    threshold = log_threshold(bits, tau)
    xf = _flat(x)
    scratch = torch.empty_like(xf)
    rare = _rare_lanes(xf, g, scratch)
    r = xf & (g.step - 1)
    out = _odd(xf, g)
    up = torch.add(r, out, out=scratch) > g.half  # r > half, or a tie whose lower neighbour is odd
    # Distance to the chosen grid point exceeds the threshold  <=>  threshold < r < step - threshold
    # (threshold < half, so this holds on both rounding sides; it implies r != 0, i.e. off the grid).
    logged = r.sub_(g.half).abs_() < (g.half - threshold)
    _round_fast_(out, xf, g)
    if rare is not None:
        slow, sign = _slow(xf, rare, g, tau_fixed=tau_fixed, brackets=False, frac=False)
        assert slow.far is not None
        out.index_copy_(0, rare, slow.rounded | sign)
        up.index_copy_(0, rare, slow.up)
        logged.index_copy_(0, rare, slow.off & slow.far)
    value_up = up.logical_xor_(xf < 0)  # magnitude up on a negative value is a value down
    trits = (~logged).view(torch.uint8) + (logged & value_up).view(torch.uint8) * 2
    return out.view(torch.float64).view(x.shape), trits.view(x.shape)


def _changes(up: torch.Tensor, off: torch.Tensor, trits: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """Lanes where the logged direction overrides own rounding (flip the magnitude direction there).

    ``trits`` hold 0..2 (checked by the caller), so bit 1 means "up" and ``t + 1`` is odd exactly for
    0 and 2: two cheap uint8 ops instead of comparisons. A logged value-direction is a magnitude
    direction XOR the sign.
    """
    logged = ((trits + 1) & 1).view(torch.bool) & off
    want_mag_up = (trits >> 1).view(torch.bool) ^ neg
    return logged & (want_mag_up ^ up)


def round_with_log(x: torch.Tensor, bits: int, trits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Auditor kernel: ``(rev(x, bits, trits), number of values moved to the trainer's side)``.

    See :func:`round_with_log_changes`, which also says *where* values moved.
    """
    out, change = round_with_log_changes(x, bits, trits)
    return out, int(change.count_nonzero())


def round_with_log_changes(
    x: torch.Tensor, bits: int, trits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Auditor kernel: ``rev(x, bits, trits)`` and the mask of the values moved to the trainer's side.

    Where ``x`` is off the grid and the trit asks for the other side than ``rnd(x)`` went (own rounding up
    but trit 0, or own down but trit 2), the result is the adjacent grid value on the asked side: exactly
    one grid step from ``rnd(x)``, across binade and overflow boundaries. Trit 1 keeps own rounding;
    ``trits`` must be uint8 (or any integer dtype) with values 0..2, shaped like ``x``. Returns the
    rounded tensor and the flat bool mask of the values moved (the band check looks at those).
    """
    g = _grid(bits)
    xf = _flat(x)
    if not isinstance(trits, torch.Tensor) or trits.shape != x.shape:
        got = tuple(trits.shape) if isinstance(trits, torch.Tensor) else type(trits).__name__
        raise RoundingInputError(f"trits must be a tensor shaped like x {tuple(x.shape)}, got {got}")
    t = trits.to(device=x.device, dtype=torch.uint8).reshape(-1)
    if t.numel() and int(t.max()) > TRIT_UP:
        raise RoundingInputError(f"trits must be 0 (down), 1 (ignore) or 2 (up), got {int(t.max())}")
    neg = xf < 0
    scratch = torch.empty_like(xf)
    rare = _rare_lanes(xf, g, scratch)
    r = xf & (g.step - 1)
    up = torch.add(r, _odd(xf, g), out=scratch) > g.half
    change = _changes(up, r != 0, t, neg)
    # lo (signed pattern, magnitude rounded down) plus one step where the magnitude ends up above.
    out = torch.sub(xf, r, out=r).add_(scratch.copy_(up ^ change).bitwise_left_shift_(g.k0))
    if rare is not None:
        slow, sign = _slow(xf, rare, g, tau_fixed=None, brackets=True, frac=False)
        assert slow.lo is not None and slow.hi is not None
        s_change = _changes(slow.up, slow.off, t.index_select(0, rare), neg.index_select(0, rare))
        s_mag = torch.where(s_change, torch.where(slow.up, slow.lo, slow.hi), slow.rounded)
        out.index_copy_(0, rare, s_mag | sign)
        change.index_copy_(0, rare, s_change)
    return out.view(torch.float64).view(x.shape), change


def rev(x: torch.Tensor, bits: int, direction: torch.Tensor) -> torch.Tensor:
    """Algorithm 3's correction: :func:`rnd`, moved one grid step where ``direction`` disagrees."""
    return round_with_log(x, bits, direction)[0]
