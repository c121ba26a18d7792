"""A task's training state built or read back: step 0 from the task's code, or a checkpoint's
canonical bytes put into the task's model.

Why in the engine: the model, the optimizer and the scheduler are the task's code (its runtime,
:mod:`.runtime`); the bytes' layout is the state room's (:mod:`game.training.state.checkpoint`).
``encode_state(decode_state(b, cfg)) == b`` for every valid ``b``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from game.errors import StateReloadError, TrainingError
from game.training.engine.runtime import TaskRuntime, runtime_for
from game.training.numerics import rounding
from game.training.state import optstate, schedstate
from game.training.state.canonical import encode_state
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
    model_names = {n for n in tensors if not n.startswith(("optim/", schedstate.PREFIX))}
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
    sched = {n: t for n, t in tensors.items() if n.startswith(schedstate.PREFIX)}
    schedstate.load(state.scheduler, state.optimizer, sched)
    TaskRuntime.advance_scheduler(state, step)  # a schedule of the step (one with the loss: loaded)
    if torch.device(device) != torch.device("cpu"):
        move_state(state, device)
    return state


def _load_optimizer(state: TrainState, tensors: dict[str, Tensor]) -> None:
    params = dict(state.model.named_parameters())
    index: dict[int, int] = {}
    for group in state.optimizer.param_groups:
        for p in group["params"]:
            index[id(p)] = len(index)
    committed: dict[str, dict[str, Tensor]] = {}
    for name, t in tensors.items():
        pname, sep, key = name[len("optim/") :].rpartition("/")
        if not sep or pname not in params:
            raise CheckpointError(f"{name}: names no parameter of model {state.model.__class__.__name__}")
        committed.setdefault(pname, {})[key] = t
    per_param = {index[id(params[p])]: optstate.decode(p, entries) for p, entries in committed.items()}
    sd = state.optimizer.state_dict()
    sd["state"] = per_param
    try:
        state.optimizer.load_state_dict(sd)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"optimizer state does not load: {exc}") from exc
    by_index = [p for group in state.optimizer.param_groups for p in group["params"]]
    for i, entries in per_param.items():
        optstate.keep_dtypes(state.optimizer.state[by_index[i]], entries)


def check_reloads(saved: bytes, cfg: TaskConfig) -> None:
    """Refuse a state whose committed bytes ``saved`` do not come back as they were (decoded into
    a model and an optimizer built afresh, encoded again), naming the tensors lost, new or changed.

    Why: a judge, or an auditor starting from a checkpoint, runs a step from those bytes. An
    optimizer of the task's own whose ``load_state_dict`` loses what its step keeps (a wrapper that
    hands it to an inner optimizer, which puts a new ``state`` dict in place of the one the wrapper
    shares), or a module whose ``_load_from_state_dict`` skips a buffer, trains and audits from
    step 1 in one process, and every later step is ruled against the honest trainer. The trainer
    runs this once, on the state after the first step or update it records (the optimizer's state
    exists then)."""
    again = encode_state(decode_state(saved, cfg))
    if again == saved:
        return
    step, was = parse_state(saved)
    now = parse_state(again)[1]
    lost, came = sorted(was.keys() - now.keys()), sorted(now.keys() - was.keys())
    differ = sorted(
        k for k in was.keys() & now.keys() if was[k].dtype != now[k].dtype or not torch.equal(was[k], now[k])
    )
    where = "; ".join(
        f"{what}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
        for what, keys in (("lost", lost), ("new", came), ("other values or dtypes", differ))
        if keys
    )
    raise StateReloadError(
        f"step {step}: the state does not come back as it was from the bytes a step commits "
        f"(decoded into a model and an optimizer built afresh, then encoded again: {where or 'other bytes'}). "
        "A judge re-running a step from its committed state, or an auditor starting from a checkpoint, "
        "would start from another state and rule an honest step wrong: an optimizer of the task's own "
        "must keep everything its step uses in its own self.state (per parameter, tensors or numbers), loaded back "
        "by torch's load_state_dict (a wrapper: subclass the optimizer instead, or share the inner "
        "optimizer's state again after load_state_dict)"
    )


__all__ = ["check_reloads", "decode_state", "fresh_state"]
