"""Activation checkpointing in a step: the forward recomputed in the backward pass draws what the
forward drew, so a checkpointed model trains as the same model without checkpointing, bit for bit,
on every machine. Before, the recomputed dropout reached ATen (the serving mode is popped during
``Tensor.backward``) and the step was refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import Tensor, nn

from game.training.dispatch.initmode import init_module
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.profiles import get_profile
from game.training.dispatch.stockops import StockOps
from game.training.log.formats import new_step_log
from tests.training.test_task_api import trains_and_audits

SEED, BITS = 5, 32
IDS = torch.arange(6)
X = torch.randn(6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 4, (6,), generator=torch.Generator().manual_seed(2))


class Net(nn.Module):
    """Two dropouts, one inside a checkpointed segment and one after it (whose draw must not move)."""

    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.drop, self.after = nn.Dropout(0.3), nn.Dropout(0.2)
        self.reentrant = reentrant  # None: not checkpointed

    def segment(self, h: Tensor) -> Tensor:
        return self.drop(torch.tanh(self.b(h)))

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.a(x))
        if self.reentrant is None:
            h = self.segment(h)
        else:
            h = torch_checkpoint.checkpoint(self.segment, h, use_reentrant=self.reentrant)
        return self.c(self.after(h))


def _train(
    build: Callable[[], nn.Module], loss: Callable[[nn.Module], Tensor], steps: int = 3
) -> list[Tensor]:
    """``steps`` SGD steps recorded through the C++ front on ``cpu-1t`` and replayed through the
    Python mode on ``noisy``, each step's log used up; the parameters after them (equal both ways)."""
    logs = [new_step_log("sparse", s + 1) for s in range(steps)]
    results = []
    for profile, mode in (("cpu-1t", "record"), ("noisy", "replay")):
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
        for s in range(steps):
            rm = RoundingMode(
                bits=BITS, tau=0.25, mode=mode, profile=get_profile(profile), step=s + 1, log=logs[s]
            )
            with StockOps(SEED, s + 1, 0, IDS, bits=BITS), rm:
                opt.zero_grad()
                loss(model).backward()
                opt.step()
            if mode == "replay":
                rm.finish()
        results.append([p.detach().clone() for p in model.parameters()])
    recorded, replayed = results
    assert all(torch.equal(a, b) for a, b in zip(recorded, replayed, strict=True))
    return recorded


def _net_loss(model: nn.Module) -> Tensor:
    return nn.functional.cross_entropy(model(X), Y)


@pytest.mark.parametrize("reentrant", [True, False])
def test_aCheckpointedSegmentWithDropout_trainsAsWithoutCheckpointing(reentrant: bool) -> None:
    plain = _train(lambda: init_module(lambda: Net(None), seed=3), _net_loss)
    checkpointed = _train(lambda: init_module(lambda: Net(reentrant), seed=3), _net_loss)
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed, strict=True))
    assert torch_checkpoint.CheckpointFunction.__name__ == "CheckpointFunction"  # put back after the step


def test_theRecomputedDraws_areTheForwards_andTheDrawsAfterThemDoNotMove() -> None:
    model = init_module(lambda: Net(True), seed=3)
    with StockOps(SEED, 1, 0, IDS, bits=BITS) as ops:
        h = torch.tanh(model.a(X))
        out = torch_checkpoint.checkpoint(model.segment, h, use_reentrant=True)
        drawn = ops.drawn
        seen: list[Tensor] = []
        model.drop.register_forward_hook(lambda _m, _i, o: seen.append(o.detach() != 0))
        out.sum().backward()  # the segment recomputed here, with the mode popped by torch
        assert ops.drawn == drawn  # the recomputation took no new ordinal
    assert len(seen) == 1 and torch.equal(seen[0], (out.detach() != 0))


@pytest.mark.parametrize("reentrant", [False, True])
def test_huggingFaceActivationCheckpointing_withDropout_trainsAsWithout(reentrant: bool) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=32,
        n_positions=8,
        n_embd=16,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
    )
    tokens = torch.randint(0, 32, (6, 8), generator=torch.Generator().manual_seed(4))

    def build(checkpointed: bool) -> nn.Module:
        model = init_module(lambda: transformers.GPT2LMHeadModel(config), seed=3).train()
        if checkpointed:  # Hugging Face's default is use_reentrant=False
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": reentrant}
            )
            assert model.is_activation_checkpointing
        return model

    def loss(model: nn.Module) -> Tensor:
        return model(input_ids=tokens, labels=tokens).loss

    plain = _train(lambda: build(False), loss, steps=2)
    checkpointed = _train(lambda: build(True), loss, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed, strict=True))


CHECKPOINTED_TASK = """
from pathlib import Path
import torch, torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from game.api import Task, task

HERE = Path(__file__).parent


class Net(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 3)
        self.drop = nn.Dropout(0.25)

    def segment(self, h):
        return self.drop(torch.tanh(self.b(h)))

    def forward(self, x):
        return self.c(checkpoint(self.segment, torch.tanh(self.a(x)), use_reentrant=False))


@task(model={"hidden": 8}, lr=0.05, batch_size=8, steps=3, optimizer="adam")
def build(cfg):
    return Task(
        model=lambda: Net(cfg.model.hidden),
        dataset=HERE / "data.npz",
        loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]),
    )
"""


def test_aUsersCheckpointedTask_trainsAndAuditsOnAnotherProfile(tmp_path: Path) -> None:
    """Through the engine: ``vgame train``'s path records it, an auditor on ``noisy`` agrees."""
    trains_and_audits(tmp_path, CHECKPOINTED_TASK)


def test_anotherThreadsCheckpoint_duringAStep_isNotServedWithTheStepsDraws() -> None:
    """The swap is process-wide, but only a backward pass's recomputation is served: another
    thread's forward through a checkpoint (outside any step) draws nothing of the step's."""
    import threading

    model = init_module(lambda: Net(True), seed=3)
    done: list[Tensor] = []
    with StockOps(SEED, 1, 0, IDS, bits=BITS) as ops:
        h = torch.tanh(model.a(X))
        before = (ops.drawn, dict(ops.served))
        worker = threading.Thread(
            target=lambda: done.append(
                torch_checkpoint.checkpoint(model.segment, h.detach(), use_reentrant=True)
            )
        )
        worker.start()
        worker.join()
        assert (ops.drawn, dict(ops.served)) == before
    assert len(done) == 1 and done[0].shape == (6, 16)
