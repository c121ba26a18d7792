"""The public way to define a task: :class:`Task` (what to train) and :func:`task` (its config keys).

A task is what a client pays for, in the terms ML code already uses (Lightning's
``fit(module, datamodule)``, Hugging Face's ``Trainer(model=..., train_dataset=...)``)::

    import torch, torch.nn.functional as F
    from game.api import Task, task

    @task(model={"hidden": 64}, lr=1e-3, batch_size=32, steps=100)
    def build(cfg):
        return Task(
            model=lambda: MyNet(cfg.model.hidden),          # built at step 0 from the task seed
            dataset=Path(__file__).parent / "train.npz",    # a Dataset, tensors or a local file
            loss=lambda model, batch: F.cross_entropy(model(batch["x"]), batch["y"]),
            optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=cfg.lr),
            scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps),
        )

A config names it by import path (``task = "mypkg.tasks:build"``) or by an entry point (group
``vgame.tasks``), and every command trains, audits, replays, calibrates and plays the game on it
with no other code. The engine applies what the config says (``accumulate`` micro-batches a step,
``clip_grad_norm``, ``seed``, ``steps``, ``batch_size``, the rounding); the task gives the code.

No torch at import (the config layer reads declarations without it); what needs torch is
imported where it is used.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from game.errors import ConfigError, TaskCodeError, VGameError
from game.training.task.declaration import Declaration
from game.training.task.inputs import Digest

if TYPE_CHECKING:
    from game.training.task.weights import Sources


class TaskConfig(Protocol):
    """What a factory reads of the config it is given (a :class:`~.config.TaskConfig`; named here
    as a protocol so that the config layer, which wraps factories, is not imported back)."""

    @property
    def task(self) -> str: ...

    @property
    def seed(self) -> int: ...

    def config_json(self) -> str: ...


log = logging.getLogger(__name__)

#: How the rows of a step are picked from the dataset (``Task.sampling``): "replacement" draws
#: every example independently (keyed by seed, step and example id); "epochs" walks a keyed
#: shuffle of the whole dataset, epoch after epoch; a ``WeightedRandomSampler`` given in their
#: place draws by its weights (:mod:`.sampling`).
SAMPLINGS = ("replacement", "epochs")


@dataclass(frozen=True)
class Task:
    """What to train: the code of a task. Every callable runs in float64 under vgame's rounding.

    * ``model``: a function that builds the model (no arguments). It runs once per process with
      torch's random initialisers served from the task seed, so every party builds the same step
      0; a stock module's own ``reset_parameters`` / Hugging Face's ``_init_weights`` just work.
    * ``dataset``: a map-style ``torch.utils.data.Dataset``, a tensor, a tuple or dict of tensors
      (rows along dim 0), or a local ``.npz``/``.safetensors``/``.pt`` file of named arrays. Its
      content is hashed into the spec (a large one streamed, item by item).
    * ``loss(model, batch) -> scalar``: ``batch`` is what ``collate`` makes of a micro-batch's items
      (default: torch's ``default_collate``), its float tensors float64 and on the rounding grid.
    * ``optimizer(model) -> torch.optim.Optimizer``: any optimizer with a ``foreach`` path (SGD,
      Adam, AdamW, RMSprop, Adagrad, ...; one built ``fused=True`` runs its foreach path: a fused
      kernel leaves no result to round). One whose ``step`` needs a closure (L-BFGS) is given one
      that runs the step's micro-batches again, in one process.
      None: the config's standard optimizer (``optimizer``, ``lr``, ``momentum``, ``weight_decay``,
      ``betas``, ``eps``).
    * ``scheduler(optimizer) -> LRScheduler``: stepped after every optimizer step, with nothing
      given; one whose step takes a metric (``ReduceLROnPlateau``) is given the step's loss (the
      mean of the losses of the micro-batches the update applies), and its state is committed
      with the step's.
    * ``init_weights``: a ``state_dict`` or a ``.safetensors``/``.pt`` file or model directory to
      fine-tune from, or a list of them (a base checkpoint and the adapter PEFT saved for it, to
      go on fine-tuning that adapter); leaf 0 is these weights on the grid. ``init_strict=False``
      lets the model's own initialisation fill the tensors they do not hold (a new head).
    * ``eval_dataset`` and ``metrics(model, batch) -> {name: value}``: reported every N steps
      (``vgame train --eval-every``); never trained on, never in the transcript.
    * ``libraries``: distributions that define the model (e.g. ``("transformers",)``): their
      installed versions are bound into the spec. A model class from an undeclared third-party
      package is refused at step 0.
    * ``poison(batch) -> batch``: what a rehearsed dishonest trainer trains on instead (demos and
      ``--rehearse``); default: another step's batch.
    """

    model: Callable[[], Any]
    dataset: Any
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Any], Any] | None = None
    scheduler: Callable[[Any], Any] | None = None
    init_weights: Sources | None = None
    init_strict: bool = True
    collate: Callable[[list[Any]], Any] | None = None
    sampling: Any = "replacement"  # a name of SAMPLINGS, or a torch WeightedRandomSampler
    eval_dataset: Any = None
    metrics: Callable[[Any, Any], Mapping[str, float]] | None = None
    libraries: tuple[str, ...] = ()
    poison: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        for name in ("model", "loss"):
            if not callable(getattr(self, name)):
                raise ConfigError(f"Task.{name}: expected a function, got {getattr(self, name)!r}")
        if _is_module(self.model):
            raise ConfigError(
                "Task.model: give a function that builds the model (model=lambda: MyNet(...)), not a "
                "built module: vgame builds it at step 0 from the task seed, the same on every "
                "machine (to start from a module's weights, pass them as init_weights)"
            )
        for name in ("optimizer", "scheduler", "collate", "metrics", "poison"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigError(f"Task.{name}: expected a function or None, got {value!r}")
        if isinstance(self.sampling, str) and self.sampling not in SAMPLINGS:
            raise ConfigError(
                f"Task.sampling: {self.sampling!r} is not one of {', '.join(SAMPLINGS)}, or a "
                "WeightedRandomSampler"
            )
        if not isinstance(self.sampling, str) and not hasattr(self.sampling, "weights"):
            raise ConfigError(
                f"Task.sampling: expected one of {', '.join(SAMPLINGS)} or a torch WeightedRandomSampler, "
                f"got {type(self.sampling).__name__} (vgame picks each step's rows itself, from the seed)"
            )
        if isinstance(self.libraries, str) or not all(isinstance(d, str) for d in self.libraries):
            raise ConfigError(
                f"Task.libraries: expected a tuple of distribution names, got {self.libraries!r}"
            )
        object.__setattr__(self, "libraries", tuple(self.libraries))


def _is_module(obj: Any) -> bool:
    return any(
        c.__module__ == "torch.nn.modules.module" and c.__name__ == "Module" for c in type(obj).__mro__
    )


@dataclass(frozen=True, eq=False)
class TaskFactory:
    """A task's build function with its declaration (sizes, own hyper-parameters, defaults).
    :func:`task` makes one; a plain ``build(cfg) -> Task`` function is wrapped in one with an empty
    declaration (:func:`as_factory`)."""

    build: Callable[[Any], Task]  # cfg (a config.TaskConfig) -> Task
    declaration: Declaration = field(default_factory=Declaration)
    _made: dict[str, Task] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, cfg: TaskConfig) -> Task:
        return self.make(cfg)

    def make(self, cfg: TaskConfig) -> Task:
        """The task for ``cfg`` (built once per config: a build may load data)."""
        key = cfg.config_json()
        with self._lock:
            made = self._made.get(key)
            if made is None:
                from game.training.dispatch.stockops import building  # torch, imported where used

                try:
                    with building(cfg.seed):  # a random split of the data: the same in every process
                        made = self.build(cfg)
                except VGameError:
                    raise
                except Exception as exc:  # the task's own code: one line, as for its loss
                    raise TaskCodeError(
                        f"task {cfg.task!r}: its build function raised {type(exc).__name__}: {exc} "
                        "(run with VGAME_DEBUG=1 for the traceback)"
                    ) from exc
                if not isinstance(made, Task):
                    raise ConfigError(
                        f"task {cfg.task!r}: its build function returned {type(made).__name__}, not a Task"
                    )
                self._made[key] = made
            return made

    def inputs(self, cfg: TaskConfig) -> tuple[Digest, Digest | None, dict[str, str]]:
        """Digests of the task's data and initial weights, and its libraries' versions."""
        from game.training.task import datasets, sampling, weights
        from game.training.task.plugins import library_versions

        made = self.make(cfg)
        dataset = datasets.as_dataset(made.dataset, "Task.dataset")
        data = sampling.bind(datasets.digest(dataset, _log_progress), made.sampling, len(dataset))
        init = weights.digest(made.init_weights) if made.init_weights is not None else None
        return data, init, library_versions(made.libraries)


def _log_progress(done: int, total: int) -> None:
    """A dataset hashed item by item says how far it is, now and then (it may take minutes)."""
    if total >= 100_000 and (done == total or done % 65536 == 0):
        log.info("hashing the task's dataset item by item: %d of %d", done, total)


def task(
    *, model: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None, **defaults: Any
) -> Callable[[Callable[[Any], Task]], TaskFactory]:
    """Declare a build function's config keys: ``model`` its sizes (a config's ``[model]`` table,
    ``--model k=v``) with their defaults, ``params`` extra keys of its own (``warmup = 100`` at the
    top of a config, read as ``cfg.params.warmup``), and defaults of the general keys (``lr``,
    ``batch_size``, ``steps``, ``accumulate``, ``clip_grad_norm``, ...). Every key a config sets must
    be declared, so a typo is an error instead of a silently ignored value."""

    def wrap(build: Callable[[Any], Task]) -> TaskFactory:
        return TaskFactory(
            build, Declaration(model=dict(model or {}), params=dict(params or {}), defaults=defaults)
        )

    return wrap


def as_factory(obj: Any, name: str) -> TaskFactory:
    """``obj`` (what a task's name points at) as a :class:`TaskFactory`: itself, or a plain build
    function wrapped with an empty declaration."""
    if isinstance(obj, TaskFactory):
        return obj
    if callable(obj) and not isinstance(obj, type):
        return TaskFactory(obj)
    raise ConfigError(
        f"task {name!r} is a {type(obj).__name__}, not a build function: point it at a function "
        "build(cfg) -> Task (decorated with @task to declare its config keys)"
    )


__all__ = ["SAMPLINGS", "Task", "TaskFactory", "as_factory", "task"]
