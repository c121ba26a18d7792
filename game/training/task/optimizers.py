"""Optimizers a task trains with: the standard ones a config names, and the checks every one passes.

Why foreach and never fused: the engine rounds every result of the update, and a ``foreach``
optimizer does its update as a handful of ``_foreach_*`` ATen ops over the list of all tensors, each
rounded tensor by tensor (on gpt-shakespeare some 200 fewer dispatched ops a step than one op per
tensor). A fused optimizer does the whole update inside one kernel and leaves no result to round,
so its update differs from machine to machine where nothing can log it. A task's optimizer built
``fused=True`` (nanoGPT asks for it wherever CUDA is) therefore runs its foreach path: the same
update rule, torch's own code for it, and the same on every machine whether the build function
asked for fused there or not; it was refused at step 0. An optimizer with no foreach path
(SparseAdam), and a group the foreach path refuses (``differentiable``, an ``lr`` given as a
tensor), runs its per-tensor loop. One whose ``step`` needs an argument (LBFGS's closure: it
evaluates the loss again inside a step, as often as its line search asks) is refused when the task
is built: the engine runs a step as one forward and backward pass and calls ``step()`` with
nothing, which stopped at step 1 with torch's ``TypeError``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from game.errors import ConfigError

if TYPE_CHECKING:
    from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)


def standard_optimizer(cfg: TaskConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` names, with the config's hyper-parameters. AdamW decays
    matrices only (nanoGPT's grouping: linear weights and embeddings, not biases or norms)."""
    params = list(model.parameters())
    common: dict[str, Any] = {"lr": cfg.lr, "foreach": True}
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=False, **common
        )
    if cfg.optimizer == "adamw":
        named = list(model.named_parameters())
        groups = [
            {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, betas=cfg.betas, eps=cfg.eps, fused=False, **common)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(
            params, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, fused=False, **common
        )
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(
            params, momentum=cfg.momentum, eps=cfg.eps, weight_decay=cfg.weight_decay, **common
        )
    if cfg.optimizer == "adagrad":
        return torch.optim.Adagrad(params, eps=cfg.eps, weight_decay=cfg.weight_decay, fused=False, **common)
    raise ConfigError(f"optimizer: {cfg.optimizer!r} is not supported")  # validate() prevents this


@functools.cache
def required_arguments(method: Any) -> tuple[str, ...]:
    """The arguments ``method`` (a class's, ``self`` aside) cannot be called without: the engine
    calls an optimizer's step with none (L-BFGS's with a closure) and a scheduler's with none (one
    taking a metric with the step's loss). Read once a method: the engine asks every step."""
    params = list(inspect.signature(method).parameters.values())[1:]
    kinds = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )
    return tuple(p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer``'s step needs a closure that evaluates the loss again (L-BFGS): the
    engine gives it one that runs the step's micro-batches (:mod:`game.training.engine.step`)."""
    return required_arguments(type(optimizer).step) == ("closure",)


def _list_ops_take(group: dict[str, Any]) -> bool:
    """Whether torch's foreach path takes a group's settings: not a ``differentiable`` one (list ops
    have no autograd formulas) nor one with a tensor hyperparameter (an ``lr`` as a tensor, as
    ``torch.compile`` recipes give it, is refused there without ``capturable``). Such a group keeps
    its per-tensor loop, whose ops are rounded one tensor at a time: torch's own default for it."""
    if group.get("differentiable"):
        return False
    values = [v for v in group.values() if not isinstance(v, list)]  # its params are a list
    values += [x for v in values if isinstance(v, tuple) for x in v]  # betas
    return not any(isinstance(v, torch.Tensor) for v in values)


def checked(optimizer: Any, model: nn.Module, cfg: TaskConfig) -> torch.optim.Optimizer:
    """``optimizer`` (what a task's factory built) made safe to round: a torch optimizer over this
    model's parameters, never fused, foreach wherever it has a foreach path (a fused one is switched
    to it: module docstring)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        several = isinstance(optimizer, list | tuple) and optimizer
        raise ConfigError(
            f"Task.optimizer: returned {type(optimizer).__name__}, not a torch.optim.Optimizer"
            + (
                ": a step updates the model with one optimizer; give it a param group per part "
                "(torch.optim.Adam([{'params': model.G.parameters(), 'lr': 2e-4}, {'params': "
                "model.D.parameters()}])), and for two networks trained against each other (a GAN) "
                "one loss whose parts reach only their own network (README, 'A step updates the "
                "model with one optimizer')"
                if several
                else ""
            )
        )
    needs = required_arguments(type(optimizer).step)
    if needs == ("closure",) and cfg.scheduled:
        raise ConfigError(
            f"Task.optimizer: {type(optimizer).__name__}.step evaluates the loss again inside a step, and an "
            "update of stale gradients (max_staleness > 0) has no loss to evaluate: use an optimizer "
            "whose step takes none (SGD, Adam, AdamW, ...)"
        )
    if needs and needs != ("closure",):
        raise ConfigError(
            f"Task.optimizer: {type(optimizer).__name__}.step needs {', '.join(needs)}, and vgame calls step() "
            "with nothing (or, for L-BFGS, a closure that evaluates the step's loss again): use an "
            "optimizer whose step takes none (SGD, Adam, AdamW, RMSprop, Adagrad, ...)"
        )
    own = {id(p) for p in model.parameters()}
    fused = False
    for group in optimizer.param_groups:
        if group.get("fused"):  # read by step() each call: the same update as list ops
            group["fused"], group["foreach"], fused = False, True, True
        if group.get("capturable"):
            raise ConfigError(f"Task.optimizer: {type(optimizer).__name__}(capturable=True) is not supported")
        if "foreach" in group and group["foreach"] is not True and _list_ops_take(group):
            group["foreach"] = True  # the same update, as a few list ops instead of one per tensor
        for p in group["params"]:
            if id(p) not in own:
                raise ConfigError("Task.optimizer: it updates a tensor that is not a parameter of the model")
    if "foreach" in optimizer.defaults and _list_ops_take(optimizer.defaults):
        optimizer.defaults["foreach"] = True
    if optimizer.defaults.get("fused"):  # a group added later (add_param_group) takes these
        optimizer.defaults["fused"] = False
    if fused:
        log.info(
            "Task.optimizer: %s(fused=True) runs its foreach path, the same update as list ops vgame "
            "rounds (a fused kernel leaves no result to round)",
            type(optimizer).__name__,
        )
    lrs = {float(g["lr"]) for g in optimizer.param_groups if "lr" in g}
    if lrs and not any(math.isclose(lr, cfg.lr, rel_tol=1e-12) for lr in lrs):
        log.warning(
            "the task's optimizer starts at lr %s but the config says lr = %s: does its build function "
            "read cfg.lr? (--lr changes only what the task reads)",
            ", ".join(f"{lr:g}" for lr in sorted(lrs)),
            cfg.lr,
        )
    return optimizer


__all__ = ["checked", "needs_closure", "required_arguments", "standard_optimizer"]
