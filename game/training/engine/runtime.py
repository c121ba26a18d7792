"""A task made ready to train: the model at step 0, the optimizer, each step's batch, the loss.

The step engine trains every task, a preset or a user's, through :class:`TaskRuntime`, so the rules
that make a step replayable live here once, whatever the task's code:

* the model is built on the CPU in float64 with torch's random initialisers served from the task
  seed (:mod:`game.training.dispatch.initmode`), then given the task's initial weights if it has
  any; a model class from a third-party package the task does not declare is refused (its version
  would not be bound into the spec);
* the optimizer is the task's (checked: never fused, foreach where it can) or the config's
  standard one, and its scheduler is rebuilt at any step by stepping it from step 0;
* a step's batch is a pure function of (seed, step): which rows (:func:`.sampling.pick`), collated
  (a collate that augments draws served randomness: :func:`~game.training.dispatch.stockops.collating`),
  and cut into ``accumulate`` micro-batches along dim 0.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
from torch import Tensor, nn

from game.errors import ConfigError, TaskCodeError, VGameError
from game.training.dispatch.initmode import init_module
from game.training.dispatch.stockops import collating
from game.training.state import schedstate
from game.training.state.tensors import TrainState, step_scheduler
from game.training.task import datasets, sampling, weights
from game.training.task.config import TaskConfig, factory_of
from game.training.task.define import Task, TaskFactory
from game.training.task.optimizers import checked, required_arguments, standard_optimizer
from game.training.task.presets import PRESETS

log = logging.getLogger(__name__)

#: Packages whose model classes need no declaration: torch itself and vgame's own presets.
ALWAYS_BOUND = frozenset({"torch", "game"})


@dataclass(frozen=True)
class Batch:
    """One step's (or micro-batch's) rows: ``data`` as the task's collate made it (a tuple, a dict,
    a tensor), and the global ids of its examples, which key its randomness."""

    data: Any
    example_ids: Tensor  # int64 [rows]

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on ``device`` (the engine moves batches; tasks build them on CPU)."""
        return Batch(datasets.map_tensors(self.data, lambda t: t.to(device)), self.example_ids.to(device))

    def __len__(self) -> int:
        return int(self.example_ids.numel())

    @property
    def inputs(self) -> Any:
        """The first of an (inputs, targets) pair."""
        return self.data[0]

    @property
    def targets(self) -> Any:
        """The second of an (inputs, targets) pair."""
        return self.data[1]


class TaskRuntime:
    """One task's code, ready for the step engine (module docstring: the rules)."""

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.factory: TaskFactory = PRESETS.get(cfg.task) if cfg.builtin else factory_of(cfg.task)
        self.task: Task = self.factory.make(cfg)
        self.dataset = datasets.as_dataset(self.task.dataset, "Task.dataset")
        self.sampling = sampling.plan(self.task.sampling, len(self.dataset))
        self._eval = (
            datasets.as_dataset(self.task.eval_dataset, "Task.eval_dataset")
            if self.task.eval_dataset is not None
            else None
        )

    # ---- step 0 -------------------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        """The model at step 0: float64, on the CPU, train mode, not yet on the grid: the task's
        factory run with torch's initialisers served from the seed (:func:`init_module`), then
        the task's initial weights, if any."""
        task = self.task
        model = init_module(task.model, self.cfg.seed)
        self._check_libraries(model)
        if task.init_weights is not None:
            weights.apply(model, task.init_weights, strict=task.init_strict)
        return model.train()

    @functools.cached_property
    def libraries(self) -> frozenset[str]:
        """Top-level import names of the libraries a model may be built from, its own code aside:
        torch, vgame and those the task declares (their versions are bound)."""
        return frozenset(ALWAYS_BOUND | _import_names(self.task.libraries))

    def _check_libraries(self, model: nn.Module) -> None:
        """Refuse a model built from classes of a package whose version the spec does not bind."""
        allowed = set(self.libraries)
        if not self.cfg.builtin:
            code = self.cfg.inputs().code
            if code is not None:
                allowed.add(str(code.detail.get("name")))
        foreign: dict[str, str] = {}
        for module in model.modules():
            top = type(module).__module__.partition(".")[0]
            if top not in allowed and top != "builtins":
                foreign.setdefault(top, type(module).__name__)
        if foreign:
            dists = sorted({d for top in foreign for d in _distributions(top)} or foreign)
            raise ConfigError(
                "Task.model: the model is built from "
                + ", ".join(f"{cls} of {top}" for top, cls in sorted(foreign.items()))
                + f", whose version the spec would not bind: add libraries={tuple(dists)!r} to the Task"
            )

    def build_optimizer(self, model: nn.Module) -> tuple[torch.optim.Optimizer, Any]:
        """The optimizer over ``model`` (the task's, checked, or the config's standard one) and the
        task's LR scheduler (None when it has none)."""
        task = self.task
        opt = (
            checked(task.optimizer(model), model, self.cfg)
            if task.optimizer
            else standard_optimizer(self.cfg, model)
        )
        scheduler = None
        if task.scheduler is not None:
            scheduler = task.scheduler(opt)
            step = getattr(type(scheduler), "step", None)
            needs = required_arguments(step) if callable(step) else ("a step method",)
            if len(needs) > 1 or not callable(step):
                raise ConfigError(
                    f"Task.scheduler: {type(scheduler).__name__} is not a scheduler stepped once a step "
                    f"with nothing or the step's loss given (its step needs {', '.join(needs)}): use a "
                    "schedule of the step instead"
                )
        return opt, scheduler

    @staticmethod
    def advance_scheduler(state: TrainState, steps: int) -> None:
        """Step a fresh state's scheduler ``steps`` times: where it stands after that many training
        steps (its schedule is a function of the step). One stepped with the loss is not: its state
        comes with the checkpoint's (:mod:`~game.training.state.schedstate`)."""
        if state.scheduler is None or steps <= 0 or schedstate.takes_metric(state.scheduler):
            return
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": on purpose here
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(steps):
                step_scheduler(state)

    # ---- steps --------------------------------------------------------------------------------

    def batch(self, step: int) -> Batch:
        """Step ``step``'s rows on the CPU (``step >= 1``), a pure function of (seed, step)."""
        cfg = self.cfg
        ids = sampling.example_ids(step, cfg.batch_size)
        index = sampling.pick(cfg.seed, step, ids, len(self.dataset), self.sampling)
        with collating(cfg.seed, step, ids, bits=cfg.bits):  # an augmenting collate's draws
            data = datasets.collate_rows(self.dataset, index, self.task.collate)
        rows = datasets.first_dim(data)
        if rows != cfg.batch_size:
            raise ConfigError(
                f"Task.collate: a batch of {cfg.batch_size} items collated to a leading dimension of {rows}"
            )
        return Batch(data, ids)

    def micro_batches(self, batch: Batch) -> list[Batch]:
        """``batch`` cut into the config's ``accumulate`` micro-batches, in order."""
        parts = self.cfg.accumulate
        if parts == 1:
            return [batch]
        datas = datasets.split_rows(batch.data, parts, len(batch))
        each = len(batch) // parts
        return [Batch(d, batch.example_ids[j * each : (j + 1) * each]) for j, d in enumerate(datas)]

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        """The task's loss on one micro-batch: a float64 scalar. An exception of the task's own
        code (not one of vgame's, such as a refused op) is a :class:`TaskCodeError`."""
        try:
            loss = self.task.loss(model, batch.data)
        except VGameError:
            raise
        except Exception as exc:
            raise TaskCodeError(
                f"the task's loss (its model's forward) raised {type(exc).__name__}: {exc}{_dtype_hint(exc)} "
                "(run with VGAME_DEBUG=1 for the traceback)"
            ) from exc
        if not isinstance(loss, Tensor) or loss.dim() != 0:
            raise ConfigError(f"Task.loss: expected a scalar tensor, got {_describe(loss)}{_loss_hint(loss)}")
        return loss

    def poison(self, batch: Batch, step: int) -> Batch:
        """The data a rehearsed dishonest trainer trains on at ``step`` instead: the task's poison,
        or else the rows of a step that never comes (same shapes and ids, other data)."""
        if self.task.poison is not None:
            return Batch(self.task.poison(batch.data), batch.example_ids)
        return Batch(self.batch(step + self.cfg.steps).data, batch.example_ids)

    # ---- evaluation ---------------------------------------------------------------------------

    @property
    def has_eval(self) -> bool:
        return self._eval is not None

    def eval_batch(self, size: int = 256) -> Batch:
        """``size`` held-out rows at evenly spaced indices (all of them if fewer)."""
        if self._eval is None:
            raise ConfigError("this task has no eval_dataset")
        n = len(self._eval)
        size = min(size, n)
        index = torch.arange(size, dtype=torch.int64) * n // max(size, 1)
        ids = torch.arange(size)
        with collating(self.cfg.seed, 0, ids, bits=self.cfg.bits):  # step 0: no training step's
            return Batch(datasets.collate_rows(self._eval, index, self.task.collate), ids)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, size: int = 256) -> dict[str, float]:
        """The task's metrics on :meth:`eval_batch` in eval mode (its loss when it has no metrics);
        the model is put back in train mode."""
        batch = self.eval_batch(size)
        device = next(model.parameters()).device
        batch = Batch(
            datasets.map_tensors(
                batch.data, lambda t: t.to(device, torch.float64) if t.is_floating_point() else t.to(device)
            ),
            batch.example_ids,
        )
        was_training = model.training
        model.eval()
        try:
            if self.task.metrics is not None:
                return {str(k): float(v) for k, v in self.task.metrics(model, batch.data).items()}
            return {"loss": float(self.loss(model, batch))}
        finally:
            model.train(was_training)


def _dtype_hint(exc: Exception) -> str:
    """What to do about a float32/float64 mix that the model's own code refused (``nn.LSTM`` checks
    its input's dtype in Python, where vgame cannot widen the call, and torch's advice to convert
    the model to float32 does not hold in a step)."""
    text = str(exc)
    if not (
        re.search(r"\b(float32|Float|float)\b", text) and re.search(r"\b(float64|Double|double)\b", text)
    ):
        return ""
    return (
        ". In a step the model's parameters are float64 (each result rounded to the float32 grid): "
        "cast to their dtype (x.to(self.weight.dtype)) rather than to float32"
    )


def _describe(x: Any) -> str:
    return f"a tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__


def _scalar(x: Any) -> bool:
    return isinstance(x, Tensor) and x.dim() == 0


def _loss_hint(loss: Any) -> str:
    """How to hand over a loss returned with metrics (``(loss, logs)``, ``{"loss": ...}``, a
    model's output with ``.loss``), where one is: the step trains on one value, and metrics are the
    task's ``metrics`` function's, on the eval set; or one left unreduced, shaped, or a number."""
    if isinstance(loss, Mapping) and _scalar(loss.get("loss")):
        pick = '["loss"]'
    elif _scalar(getattr(loss, "loss", None)):
        pick = ".loss"
    elif isinstance(loss, tuple | list) and loss and _scalar(loss[0]):
        pick = "[0]"
    elif isinstance(loss, Tensor) and loss.is_floating_point() and loss.numel() > 1:
        return (
            ": one loss per example or element (reduction='none'); reduce it to the one value the step "
            "trains on (loss.mean(), or the loss function's reduction='mean')"
        )
    elif isinstance(loss, Tensor) and loss.is_floating_point() and loss.numel() == 1:
        return ": one value with dimensions; take it as a scalar (loss.reshape(()) or loss.squeeze())"
    elif isinstance(loss, float | int):
        return (
            ": a Python number, which has no gradient (float(loss) or loss.item() cut it from the "
            "model); return the tensor"
        )
    else:
        return ""
    return (
        f": it holds one at {pick}; return that alone (loss=lambda m, b: my_loss(m, b){pick}), and report "
        "metrics with Task.metrics (on the eval_dataset, every --eval-every steps)"
    )


@functools.cache
def _packages() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def _import_names(dists: tuple[str, ...]) -> set[str]:
    """Top-level import names the distributions ``dists`` provide (``transformers`` -> ``transformers``)."""
    wanted = {d.lower().replace("_", "-") for d in dists}
    names = {
        top for top, owners in _packages().items() if {o.lower().replace("_", "-") for o in owners} & wanted
    }
    return names | {d.replace("-", "_") for d in dists}


def _distributions(top: str) -> list[str]:
    return list(_packages().get(top, []))


_lock = threading.Lock()
_runtimes: dict[str, TaskRuntime] = {}


def runtime_for(cfg: TaskConfig) -> TaskRuntime:
    """The runtime of ``cfg`` (one per config a process: a task's build may load its data)."""
    key = cfg.config_json()
    with _lock:
        found = _runtimes.get(key)
        if found is None:
            found = _runtimes[key] = TaskRuntime(cfg)
        return found


__all__ = ["ALWAYS_BOUND", "Batch", "TaskRuntime", "runtime_for"]
