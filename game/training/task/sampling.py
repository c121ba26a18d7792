"""Which rows a step trains on: a pure function of (seed, step, example id).

Row ``i`` of step ``s`` is example ``(s - 1) * batch_size + i``; which dataset item that example
is, ``Task.sampling`` says:

* ``"replacement"`` (the default): each example an independent draw from the counter-based RNG,
  ``(word * n) >> 32`` over the ``n`` items, keyed like the built-in presets' batches;
* ``"epochs"``: a keyed shuffle of the whole dataset per epoch, walked epoch after epoch;
* a torch ``WeightedRandomSampler`` (with replacement): item ``j`` with probability
  ``w_j / sum(w)``, class balance's way. Torch's sampler draws with ``torch.multinomial`` from its
  generator, other items on another device or thread count; here the draw is exact integer
  arithmetic. The weights are scaled by one power of two, so that their sum is just below
  ``2**60``, and each rounded down to an integer (every step exact, so every machine gets the same
  integers; a weight below ``2**-60`` of the sum rounds to 0 and is never drawn); their running
  sums are exact in int64; two words ``u`` (64 bits) pick the item whose running sum first exceeds
  ``(u * total) >> 64``. The sampler's ``num_samples`` and ``generator`` are not used: the steps
  and the batch size say how many, the task's seed which. The integers are bound by the spec hash
  with the data (:func:`bind`).

None of them depends on the device, the thread count or how a step is split between workers.
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from game.errors import ConfigError
from game.training.numerics import rng
from game.training.task.inputs import Digest

#: Prefix of a weighted sampling's part of the data digest (its format).
WEIGHTED_FORMAT = b"vgame-weighted-v1\0"
#: The scaled weights' sum stays below ``2**(SCALE_BITS + 1)``: int64 running sums, exact.
SCALE_BITS = 60

#: A step's sampling made ready: "replacement", "epochs", or a weighted sampler's running sums.
Plan = str | Tensor


def example_ids(step: int, batch_size: int) -> Tensor:
    """Global ids of step ``step``'s examples (steps start at 1)."""
    if step < 1:
        raise ConfigError(f"step: batches exist for steps >= 1, got {step}")
    return torch.arange(batch_size, dtype=torch.int64) + (step - 1) * batch_size


def plan(sampling: Any, n: int) -> Plan:
    """``Task.sampling`` over a dataset of ``n`` items, made ready for :func:`pick` (the weighted
    sampler's integer running sums worked out once)."""
    if isinstance(sampling, str):
        return sampling
    return running_sums(weights_of(sampling), n)


def pick(seed: int, step: int, ids: Tensor, n: int, sampling: Plan) -> Tensor:
    """The dataset index of each example id (module docstring: the three samplings)."""
    if isinstance(sampling, Tensor):
        return _weighted(seed, step, ids, sampling)
    if sampling == "replacement":
        return rng.randbelow(seed, step, "data", ids, (), n)
    if sampling == "epochs":
        epochs = ids // n
        out = torch.empty_like(ids)
        for epoch in torch.unique(epochs).tolist():
            rows = epochs == epoch
            out[rows] = _epoch_order(seed, int(epoch), n)[ids[rows] - epoch * n]
        return out
    raise ConfigError(f"sampling: {sampling!r} is not replacement or epochs")


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, n: int) -> Tensor:
    """A keyed shuffle of ``range(n)`` for one epoch (the RNG's step counter holds the epoch)."""
    if not 0 <= epoch < 2**32:
        raise ConfigError(f"epoch {epoch} is past what the RNG counter holds")
    return rng.permutation(seed, epoch, "data/epoch", n)


# --------------------------------------------------------------------------------------------------
# Weighted sampling
# --------------------------------------------------------------------------------------------------


def weights_of(sampler: Any) -> np.ndarray:
    """A ``WeightedRandomSampler``'s weights as float64, checked: one finite, non-negative weight
    per item, some positive, drawn with replacement."""
    if getattr(sampler, "replacement", True) is not True:
        raise ConfigError(
            "Task.sampling: a WeightedRandomSampler without replacement draws each item at most once "
            "per pass, which depends on every draw before it; use replacement=True, or "
            "sampling='epochs' to see each item once an epoch"
        )
    w = torch.as_tensor(sampler.weights).detach().cpu().to(torch.float64).numpy()
    if w.ndim != 1 or w.size == 0:
        raise ConfigError(
            f"Task.sampling: expected one weight per item, got weights of shape {tuple(w.shape)}"
        )
    if not np.isfinite(w).all() or (w < 0).any():
        bad = int(np.flatnonzero(~np.isfinite(w) | (w < 0))[0])
        raise ConfigError(
            f"Task.sampling: weight {bad} is {float(w[bad])!r}: weights must be finite and >= 0"
        )
    if not (w > 0).any():
        raise ConfigError("Task.sampling: every weight is 0, so no item can be drawn")
    return w


def running_sums(w: np.ndarray, n: int) -> Tensor:
    """The weights ``w`` as exact integers' running sums, int64 (module docstring)."""
    if w.size != n:
        raise ConfigError(f"Task.sampling: {w.size} weights for a dataset of {n} items")
    _, exponent = math.frexp(math.fsum(w.tolist()))  # fsum: the correctly rounded sum, everywhere
    scaled = np.floor(np.ldexp(w, SCALE_BITS - exponent))  # a power of two: exact; floor: exact
    sums = np.cumsum(scaled.astype(np.int64))  # below 2**61: exact
    if sums[-1] == 0:
        raise ConfigError("Task.sampling: the weights are too unequal to draw from (all but none round to 0)")
    return torch.from_numpy(sums)


def _weighted(seed: int, step: int, ids: Tensor, sums: Tensor) -> Tensor:
    words = rng.random_u32(seed, step, "data/weighted", ids, (2,)).tolist()
    total = int(sums[-1])
    targets = torch.tensor([((hi << 32 | lo) * total) >> 64 for hi, lo in words], dtype=torch.int64)
    return torch.searchsorted(sums, targets, right=True)  # the first running sum above the target


def bind(data: Digest, sampling: Any, n: int) -> Digest:
    """The data digest with a weighted sampling's integers joined (which items a step draws is part
    of the task); the same digest for a named sampling, whose code the code digest binds."""
    if isinstance(sampling, str):
        return data
    sums = running_sums(weights_of(sampling), n)
    h = hashlib.sha256(WEIGHTED_FORMAT + bytes.fromhex(data.sha256))
    h.update(sums.numpy().astype("<i8").tobytes())
    return Digest(data.kind, h.hexdigest(), {**data.detail, "sampling": "weighted"})


__all__ = [
    "SCALE_BITS",
    "WEIGHTED_FORMAT",
    "Plan",
    "bind",
    "example_ids",
    "pick",
    "plan",
    "running_sums",
    "weights_of",
]
