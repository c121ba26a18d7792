"""Stock PyTorch in a training step: its random functions, dropout and attention served the same on
every device, for one micro-batch (issue 43: "stock PyTorch just works, or fails at step 1").

A model written against stock torch (``nn.Dropout``, ``F.scaled_dot_product_attention``,
``torch.rand``) draws from torch's generator and lets torch pick kernels per device, so an auditor
on other hardware ran other ops on other bits and reported "log tampering" at step 1. Inside
:class:`StockOps`, a ``TorchFunctionMode`` serves those calls where they are made, above autograd
(so forward and backward are the same ATen ops everywhere): the random draws from the counter RNG,
keyed per example (the rule: :mod:`~game.training.dispatch.draws`), the rest written out with
ordinary ops (:mod:`~game.training.dispatch.torchnn`, :mod:`~game.training.dispatch.torchrandom`).
What still reaches ATen and draws, or runs a fused or per-device kernel, is refused by the step's
interceptor at its first call (``OpClass.REFUSED``, :class:`~game.errors.UnsupportedOpError`).

Python's and numpy's global generators (``random.random``, ``np.random.rand``: Wav2Vec2's SpecAugment
masks come from numpy's) are seeded for the micro-batch from the task's seed, the step and the
micro-batch's index (:func:`global_seed`), and put back as they were after it: their algorithm
(the Mersenne Twister) gives the same words on every machine, so a trainer's and an auditor's
masks are the same. Their uniform and integer draws are exact; a normal or exponential draw goes
through the machine's libm, whose last bit may differ by machine (draw those from torch, served
here). A generator made there without a seed (numpy's ``default_rng()``, Python's ``random.Random()``)
takes its seed from the micro-batch's too (:class:`SeededGlobals`); it drew it from the operating
system.

torch's default dtype is float64 inside, the dtype the step computes the model in: a tensor the
model makes without a dtype (``torch.full((), torch.finfo(torch.float64).min)``, ``torch.zeros(n)``
for a buffer it then multiplies with its activations) is float64 too, as it would be float32 beside
float32 activations. It was float32, and such a model (XGLM) stopped with torch's own error.

What the mode cannot see: calls made *inside* another Python-level torch function (torch pops a
function mode while it handles a call; ``nn.init.kaiming_uniform_`` and
``F.multi_head_attention_forward`` are served whole for that reason), and so calls in autograd's
backward (``Tensor.backward`` and ``torch.autograd.backward`` are torch functions), except
activation checkpointing's recomputed forward, which is served with the draws its forward took
(:mod:`.checkpointing`). Autocast is refused on entry: a float16 or bfloat16
result is not rounded, and another device computes it otherwise. ``torch.compile``'d code runs
eagerly inside (``torch.compiler.set_stance("force_eager")`` where dynamo is loaded), so that its
ops reach the interceptor and this mode instead of a fused kernel.

Cost: the mode is one Python call per torch function (a dict lookup, then the call); the engine
may leave it off after a step that served nothing (:attr:`StockOps.served`), since anything the
mode would have served then reaches ATen and is refused, not replayed wrongly.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.random.bit_generator as bit_generator
import torch
from torch import Tensor
from torch.optim import optimizer as torch_optimizer

from game.errors import UnsupportedOpError
from game.training.dispatch import (
    counts,
    gammas,
    products,
    tieorder,
    torchnn,
    torchrandom,
    vectorsigns,
    writeorder,
)
from game.training.dispatch.checkpointing import ServedCheckpoint
from game.training.dispatch.draws import Draws, ServingMode

#: The handler modules, imported for their registrations (``draws.SERVED``).
HANDLERS = (counts, gammas, products, tieorder, torchnn, torchrandom, vectorsigns, writeorder)

AUTOCAST_FIX = (
    "autocast is on: its float16/bfloat16 results are not rounded to the grid and another device "
    "computes them otherwise; train in float64 (vgame rounds to the task's grid itself)"
)


def global_seed(seed: int, step: int, micro_batch: int) -> bytes:
    """The 32 bytes that seed Python's and numpy's global generators for one micro-batch."""
    return hashlib.sha256(f"vgame/global-generators/{seed}/{step}/{micro_batch}".encode()).digest()


#: The global through which numpy's ``SeedSequence`` draws its entropy when given none (not in
#: numpy's stubs, hence by name).
_ENTROPY = "randbits"


#: Whether this thread's global generators are held for a step (:func:`globals_held`).
_HELD = threading.local()


def _words() -> tuple[Any, Any]:
    """Python's and numpy's global generators' states."""
    return random.getstate(), np.random.get_state()


def _put_words(words: tuple[Any, Any]) -> None:
    random.setstate(words[0])
    np.random.set_state(words[1])


class SeededGlobals:
    """Python's and numpy's global generators seeded from ``state`` (32 bytes) for a scope, and every
    generator made there without a seed given one from it, all put back after the scope.

    Why the last: a generator made without a seed (numpy's ``default_rng()``, ``PCG64()`` or
    ``RandomState()``, Python's ``random.Random()``) draws its seed from the operating system, so a
    model or a collate that makes one inside a step drew other numbers on every run, and an honest
    trainer's audit failed with nothing naming the cause. The seed is taken where both ask for it
    (numpy's ``SeedSequence`` entropy, ``numpy.random.bit_generator.randbits``, and
    ``random.Random.seed`` given none), not where a name points: code that imported ``default_rng``
    by name before the step is served too. Python's ``random.seed()`` is a method bound when
    ``random`` was imported, so the module's name is served as well (one imported by name before
    the step, ``from random import seed``, is not). Only the scope's own thread is: another thread's
    generators (the transcript writer's, ``tempfile``'s names) keep the operating system's seeds.
    The words are the same on every machine (PCG64's, the Mersenne Twister's). Inside
    :func:`globals_held` the generators' states are left to it to put back."""

    def __init__(self, state: bytes) -> None:
        self.state = state
        self._saved: tuple[Any, ...] | None = None
        self._words: tuple[Any, Any] | None = None  # the generators' states, unless held

    def __enter__(self) -> SeededGlobals:
        randbits, seed, module_seed = getattr(bit_generator, _ENTROPY), random.Random.seed, random.seed
        self._saved = (randbits, seed, module_seed)
        self._words = None if getattr(_HELD, "on", False) else _words()
        random.seed(int.from_bytes(self.state, "big"))
        np.random.seed(np.frombuffer(self.state, dtype="<u4"))
        owner, state, made = threading.get_ident(), self.state, list[random.Random]()

        def entropy(k: int) -> int:  # made at the first ask: most scopes make no unseeded generator
            if not made:
                made.append(random.Random(hashlib.sha256(b"vgame/unseeded/" + state).digest()))
            return made[0].getrandbits(k)

        def served_randbits(k: int) -> int:
            return entropy(k) if threading.get_ident() == owner else randbits(k)

        def served_seed(self: random.Random, a: Any = None, version: int = 2) -> None:
            if a is None and threading.get_ident() == owner:
                a = entropy(256)
            seed(self, a, version)

        def served_module_seed(a: Any = None, version: int = 2) -> None:  # ``random.seed``: bound at import
            served_seed(getattr(module_seed, "__self__"), a, version)  # noqa: B009 (typeshed: a function)

        setattr(bit_generator, _ENTROPY, served_randbits)
        random.Random.seed = served_seed  # type: ignore[method-assign]
        random.seed = served_module_seed
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._saved is not None:
            setattr(bit_generator, _ENTROPY, self._saved[0])
            random.Random.seed = self._saved[1]  # type: ignore[method-assign]
            random.seed = self._saved[2]
            self._saved = None
        if self._words is not None:
            _put_words(self._words)
            self._words = None


@contextlib.contextmanager
def globals_held() -> Iterator[None]:
    """Python's and numpy's global generators saved once on entry and put back once on exit, for
    the :class:`SeededGlobals` scopes this thread enters meanwhile: each seeds them as before, and
    leaves them as its draws left them for the next, which seeds them again.

    Why: a step enters three such scopes (its collate, each micro-batch, its update), and numpy
    copies its generator's 624 words one by one: saving them costs some 40 us and putting them back
    44 us, a tenth of a millisecond a scope, 5% of a small model's recorded step. Held for the
    step (:meth:`~game.training.engine.step.StepEngine.run_step`), they are saved and put back once;
    nothing draws from them between the scopes but vgame's own code, which draws from the counter
    RNG. Held already (a judge's rerun inside a step), this holds nothing more."""
    if getattr(_HELD, "on", False):
        yield
        return
    words = _words()
    _HELD.on = True
    try:
        yield
    finally:
        _HELD.on = False
        _put_words(words)


def collate_seed(seed: int, step: int) -> bytes:
    """The 32 bytes that seed Python's and numpy's global generators for step ``step``'s collate."""
    return hashlib.sha256(f"vgame/collate/{seed}/{step}".encode()).digest()


@contextlib.contextmanager
def collating(seed: int, step: int, example_ids: Tensor, *, bits: int = 32) -> Iterator[Counter[str]]:
    """Serve the randomness of a task's collate function (and its dataset's items) for step
    ``step``'s batch; yields the served calls by name.

    Why: a collate that augments (noise, mixup, a random crop) drew from torch's and numpy's
    unseeded generators, so an auditor, or a judge, collated another batch and an honest trainer
    failed its audit at step 1 with nothing naming the cause. Here torch's random functions are
    served from the counter RNG under the prefix ``collate`` (keyed per example, as a step's are;
    never the step's own draws), and Python's and numpy's global generators are seeded for the step
    (:func:`collate_seed`) and put back after it. The batch is rounded to the grid afterwards."""
    mode = ServingMode(Draws(seed, step, "collate", micro_batch=0, example_ids=example_ids, bits=bits))
    with SeededGlobals(collate_seed(seed, step)), mode:
        yield mode.handled


def build_seed(seed: int) -> bytes:
    """The 32 bytes that seed Python's and numpy's global generators while a task is built."""
    return hashlib.sha256(f"vgame/build/{seed}".encode()).digest()


@contextlib.contextmanager
def building(seed: int) -> Iterator[Counter[str]]:
    """Serve the randomness of a task's build function (:class:`~game.training.task.define.TaskFactory`)
    for the task's ``seed``; yields the served calls by name.

    Why: a build that splits its data at random (``random_split(ds, [0.9, 0.1])``, a
    ``np.random.permutation`` of the rows) drew from unseeded generators, so each process trained
    on another subset: the trainer trained, and every auditor was refused with "this machine's
    inputs are not the task's". Here torch's random functions come from the counter RNG under the
    purpose ``build/...`` (53-bit uniforms, exact normals) and Python's and numpy's global
    generators, and any generator made without a seed (``np.random.default_rng()``), are seeded
    from the task's seed (:func:`build_seed`): the same split in every process, on every machine,
    and another with another seed."""
    mode = ServingMode(Draws(seed, 0, "build"))
    with SeededGlobals(build_seed(seed)), mode:
        yield mode.handled


def items_seed() -> bytes:
    """The 32 bytes that seed Python's and numpy's global generators while the data digest reads a
    dataset's items."""
    return hashlib.sha256(b"vgame/items").digest()


@contextlib.contextmanager
def reading_items() -> Iterator[Callable[[Any, int], Any]]:
    """Serve the randomness of a dataset's ``__getitem__`` while the data digest reads its items
    (:func:`~game.training.task.datasets.digest`); yields ``read(dataset, index)``, which reads one
    with its draws served.

    Why: a dataset that augments its items (a random flip or crop, noise: torchvision's habit) drew
    from torch's, Python's and numpy's unseeded generators while its content was hashed, so the
    digest, and with it the spec hash, came out otherwise in every process: the trainer trained, and
    every auditor was refused with "this machine's inputs are not the task's". Here item ``i``'s
    torch draws come from the counter RNG under the purpose ``item/{i}/...`` (53-bit uniforms,
    exact normals: no grid, nothing is rounded), and the global generators are seeded once for the
    scope (:func:`items_seed`), not from the task's seed, since the digest names the data, whatever
    task trains on it: the same items read in the same order read the same on every machine and in
    every process. Seeding numpy's generator costs some 20 us, longer than reading a small item, so
    it is not done per item. A training step's batch draws its own (:func:`collating`)."""

    def read(dataset: Any, index: int) -> Any:
        with ServingMode(Draws(0, 0, f"item/{index}")):
            return dataset[index]

    with SeededGlobals(items_seed()):
        yield read


def update_seed(seed: int, step: int) -> bytes:
    """The 32 bytes that seed Python's and numpy's global generators for step ``step``'s update."""
    return hashlib.sha256(f"vgame/update/{seed}/{step}".encode()).digest()


def draws_nothing(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer``'s step is one of torch's own, which draw nothing: its class is
    ``torch.optim``'s (not a task's subclass), its ``step`` is not replaced on the instance, and no
    step hook is registered on it or globally (a hook may draw)."""
    return (
        type(optimizer).__module__.startswith("torch.optim.")
        and "step" not in vars(optimizer)
        and not optimizer._optimizer_step_pre_hooks
        and not optimizer._optimizer_step_post_hooks
        and not torch_optimizer._global_optimizer_pre_hooks
        and not torch_optimizer._global_optimizer_post_hooks
    )


@contextlib.contextmanager
def updating(
    seed: int, step: int, *, bits: int = 32, optimizer: torch.optim.Optimizer | None = None
) -> Iterator[Counter[str]]:
    """Serve what step ``step``'s update (the clipping and the optimizer's step) calls of torch's
    random functions and of the other served functions; yields the served calls by name.

    Why: an optimizer of a task's own that draws in its step (DP-SGD's Gaussian noise on the
    summed gradients, Langevin dynamics' noise on the update, a perturbed update) drew from torch's
    generator, which is refused in a step: it could not train at all. Here those draws come from the
    counter RNG under the prefix ``update`` (one stream each: an update has no examples; never a
    micro-batch's draws), and Python's and numpy's global generators are seeded for the update
    (:func:`update_seed`). Every worker that applies the update (each data-parallel rank, a
    parameter server) draws the same. Torch's default dtype is left as it is (a micro-batch sets
    float64): torch's optimizers make their step counters in it, float32, and the state commits
    them so.

    Given the ``optimizer`` and :func:`draws_nothing` of it, no function mode is entered (the
    globals are still seeded): the mode sees each torch call, and torch's Adam makes seven a
    parameter in its step (attribute reads, ``item``, ``is_complex``), 1,074 a GPT-2-shape step,
    about 1 ms of host time that a GPU step waits for (issue 46). A draw that reached ATen there
    would still be refused by the step's interceptor, not drawn."""
    served: Counter[str] = Counter()
    with SeededGlobals(update_seed(seed, step)):
        if optimizer is not None and draws_nothing(optimizer):
            yield served
            return
        mode = ServingMode(Draws(seed, step, "update", bits=bits))
        with mode:
            yield mode.handled


class StockOps:
    """Serve stock torch's random functions, dropout and attention for one micro-batch of a step.

    ``seed``: the task's; ``step``: the step (1-based); ``micro_batch``: the micro-batch's index in
    the step (0 without accumulation; keys the draws that are not per example); ``example_ids``:
    the micro-batch rows' example ids, in row order; ``bits``: the task's grid. Enter it around the
    micro-batch's forward and backward, inside the step's interceptor (a fresh one per micro-batch:
    the draws' ordinals start at 0).
    """

    def __init__(
        self, seed: int, step: int, micro_batch: int, example_ids: Tensor, *, bits: int = 32
    ) -> None:
        self.draws = Draws(seed, step, "torch", micro_batch=micro_batch, example_ids=example_ids, bits=bits)
        self._mode = ServingMode(self.draws)
        self._stance: contextlib.AbstractContextManager[Any] | None = None
        self._globals = SeededGlobals(global_seed(seed, step, micro_batch))
        self._dtype: torch.dtype | None = None
        self._checkpoint = ServedCheckpoint(self._mode)

    @property
    def served(self) -> Counter[str]:
        """Calls the mode served, by function name (also those that drew nothing, e.g. dropout in
        eval mode): empty after a step means the model calls none of them."""
        return self._mode.handled

    @property
    def drawn(self) -> int:
        """Draws taken so far (the next draw's ordinal)."""
        return self.draws.ordinal

    def __enter__(self) -> StockOps:
        for device in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device):
                raise UnsupportedOpError(AUTOCAST_FIX, op="torch.autocast", fix=AUTOCAST_FIX)
        if "torch._dynamo" in sys.modules:  # compiled code runs eagerly: its ops are seen one by one
            self._stance = torch.compiler.set_stance("force_eager")
            self._stance.__enter__()
        self._globals.__enter__()
        self._dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # the step's dtype: a model's own factories make it too
        try:
            self._mode.__enter__()
        except BaseException:
            self._put_back()
            raise
        self._checkpoint.__enter__()
        return self

    def _put_back(self) -> None:
        """The global generators and torch's default dtype as they were before :meth:`__enter__`."""
        self._globals.__exit__()
        if self._dtype is not None:
            torch.set_default_dtype(self._dtype)
            self._dtype = None

    def __exit__(self, *exc: Any) -> None:
        self._checkpoint.__exit__(*exc)
        self._mode.__exit__(*exc)
        self._put_back()
        if self._stance is not None:
            self._stance.__exit__(*exc)
            self._stance = None


__all__ = [
    "AUTOCAST_FIX",
    "HANDLERS",
    "SeededGlobals",
    "StockOps",
    "build_seed",
    "building",
    "collate_seed",
    "collating",
    "global_seed",
    "globals_held",
    "items_seed",
    "reading_items",
    "update_seed",
    "updating",
]
