"""A task's training state built or read back: step 0 from the task's code, or a checkpoint's
canonical bytes put into the task's model.

Why in the engine: the model, the optimizer and the scheduler are the task's code (its runtime,
:mod:`.runtime`); the bytes' layout is the state room's (:mod:`game.training.state.checkpoint`).
``encode_state(decode_state(b, cfg)) == b`` for every valid ``b``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from game.errors import TrainingError
from game.training.engine.runtime import TaskRuntime, runtime_for
from game.training.numerics import rounding
from game.training.state.checkpoint import CheckpointError, parse_state
from game.training.state.tensors import Precision, TrainState, move_state, persistent_buffers
from game.training.task.config import TaskConfig


def fresh_state(
    cfg: TaskConfig, *, device: str | torch.device = "cpu", precision: Precision = "fp64"
) -> TrainState:
    """The step-0 state: the task's model (built on CPU), rounded to the grid, on ``device``, with
    its optimizer and scheduler.

    fp64 state is rounded onto the ``cfg.bits`` grid; fp32 (the plain baseline) is converted.
    """
    runtime = runtime_for(cfg)
    model = runtime.build_model()
    with torch.no_grad():
        if precision == "fp64":
            model = model.to(torch.float64)
            for t in list(model.parameters()) + list(persistent_buffers(model).values()):
                if t.dtype == torch.float64:
                    rounding.round_(t.data, cfg.bits)
        elif precision == "fp32":
            model = model.to(torch.float32)
        else:
            raise TrainingError(f"precision: {precision!r} is not fp64 or fp32")
    model = model.to(device)
    model.train()
    optimizer, scheduler = runtime.build_optimizer(model)
    return TrainState(model=model, optimizer=optimizer, step=0, scheduler=scheduler)


def decode_state(data: bytes, cfg: TaskConfig, *, device: str | torch.device = "cpu") -> TrainState:
    """Rebuild the state from canonical bytes: model and optimizer from the preset, values loaded."""
    step, tensors = parse_state(data)
    state = fresh_state(cfg, device="cpu")
    state.step = step
    expected: dict[str, Tensor] = {f"param/{n}": p for n, p in state.model.named_parameters()}
    expected.update({f"buffer/{n}": b for n, b in persistent_buffers(state.model).items()})
    model_names = {n for n in tensors if not n.startswith("optim/")}
    missing, extra = sorted(set(expected) - model_names), sorted(model_names - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"state bytes do not fit task {cfg.task!r}: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    with torch.no_grad():
        for name, target in expected.items():
            src = tensors[name]
            if tuple(src.shape) != tuple(target.shape):
                raise CheckpointError(
                    f"{name}: shape {tuple(src.shape)} in the bytes, model has {tuple(target.shape)}"
                )
            if src.is_floating_point() != target.is_floating_point():
                raise CheckpointError(f"{name}: dtype {src.dtype} in the bytes, model has {target.dtype}")
            target.copy_(src.to(target.dtype))
    _load_optimizer(state, {n: t for n, t in tensors.items() if n.startswith("optim/")})
    TaskRuntime.advance_scheduler(state.scheduler, step)
    if torch.device(device) != torch.device("cpu"):
        move_state(state, device)
    return state


def _load_optimizer(state: TrainState, tensors: dict[str, Tensor]) -> None:
    params = dict(state.model.named_parameters())
    index: dict[int, int] = {}
    for group in state.optimizer.param_groups:
        for p in group["params"]:
            index[id(p)] = len(index)
    per_param: dict[int, dict[str, Tensor]] = {}
    for name, t in tensors.items():
        pname, sep, key = name[len("optim/") :].rpartition("/")
        if not sep or pname not in params:
            raise CheckpointError(f"{name}: names no parameter of model {state.model.__class__.__name__}")
        p = params[pname]
        if t.dim() > 0 and tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(f"{name}: shape {tuple(t.shape)}, parameter has {tuple(p.shape)}")
        per_param.setdefault(index[id(p)], {})[key] = t
    sd = state.optimizer.state_dict()
    sd["state"] = per_param
    try:
        state.optimizer.load_state_dict(sd)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"optimizer state does not load: {exc}") from exc


__all__ = ["decode_state", "fresh_state"]
