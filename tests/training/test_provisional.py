"""A throwaway forward pass at construction: allowed while nothing of it is kept.

Why: a model that runs a dummy input through its layers to size the next one (or to materialise a
lazy module) was refused at its first convolution, though the values never reach its state. Now an
inexact op's results at construction are provisional: the model is refused, naming the op and the
tensor, only where such a value reaches its state or leaves torch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from game.errors import ConfigError, UnsupportedOpError
from game.training.dispatch.initmode import init_module
from tests.training.test_task_api import trains_and_audits


class Sized(nn.Module):
    """Convolutions, BatchNorm and pooling, then a linear layer sized by a dummy pass (or told)."""

    def __init__(self, told: int | None = None, *, bn_eval: bool = True) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 6, 3)
        )
        if told is None:
            if bn_eval:
                self.features.eval()
            with torch.no_grad():
                told = self.features(torch.zeros(1, 1, 8, 8)).flatten(1).shape[1]
            self.features.train()
        self.head = nn.Linear(told, 3)


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_aDummyPassThatSizesALayer_passes_andBuildsTheModelItWouldWithoutIt() -> None:
    sized = _state(init_module(Sized, seed=7))
    told = _state(init_module(lambda: Sized(told=24), seed=7))
    assert sized.keys() == told.keys() and sized["head.weight"].shape == (3, 24)
    assert all(torch.equal(sized[k], told[k]) for k in sized)  # nothing of the pass was kept


def test_aDummyPassInTrainingMode_isRefused_namingTheRunningStatistics() -> None:
    with pytest.raises(
        UnsupportedOpError, match=r"aten\.convolution.*reached features\.1\.running_mean"
    ) as caught:
        init_module(lambda: Sized(bn_eval=False), seed=7)
    assert "eval mode" in str(caught.value)


class Keeps(nn.Module):
    """Keeps what ``keep`` makes of a dummy pass through a linear layer."""

    def __init__(self, keep: Callable[[nn.Module, Tensor], None]) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        with torch.no_grad():
            keep(self, self.lin(torch.ones(2, 4)))


@pytest.mark.parametrize(
    ("keep", "where"),
    [
        (lambda m, y: m.register_buffer("stats", y.mean(0)), "stats"),  # a buffer
        (lambda m, y: setattr(m, "table", y * 2), "table"),  # a plain tensor attribute
        (lambda m, y: setattr(m, "tables", [y]), r"tables\[0\]"),  # in a list
        (lambda m, y: m.lin.weight[0].copy_(y[0]), r"lin\.weight"),  # a write into a slice of a parameter
        (lambda m, y: setattr(m.lin.bias, "data", y[0].clone()), r"lin\.bias"),  # through .data
    ],
)
def test_aDummyPassValueKept_isRefused_namingTheOpAndTheTensor(
    keep: Callable[[nn.Module, Tensor], None], where: str
) -> None:
    with pytest.raises(UnsupportedOpError, match=rf"aten\.addmm.*reached {where}, so"):
        init_module(lambda: Keeps(keep), seed=7)


_CACHE: dict[str, Tensor] = {}


@pytest.mark.parametrize(
    "keep",
    [
        lambda m, y: setattr(m, "scale", lambda x: x * y),  # in a closure the forward calls
        lambda m, y: _CACHE.setdefault("y", y),  # in a module-level cache
        lambda m, y: setattr(m, "helper", type("Helper", (), {"table": y})()),  # in an object the model holds
    ],
)
def test_aDummyPassValueKeptOutsideTheModel_isRefused(keep: Callable[[nn.Module, Tensor], None]) -> None:
    try:
        with pytest.raises(UnsupportedOpError, match=r"aten\.addmm.*kept outside the model's parameters"):
            init_module(lambda: Keeps(keep), seed=7)
    finally:
        _CACHE.clear()


@pytest.mark.parametrize(
    ("leak", "how"),
    [
        (lambda m, y: float(y.sum()), r"item\(\)"),
        (lambda m, y: y.tolist(), r"Tensor\.tolist"),
        (lambda m, y: y.numpy(), r"Tensor\.numpy"),
        (lambda m, y: bool((y > 0).any()), r"item\(\)"),  # a comparison in Python
    ],
)
def test_aDummyPassValueLeavingTorch_isRefusedAtOnce(
    leak: Callable[[nn.Module, Tensor], object], how: str
) -> None:
    with pytest.raises(UnsupportedOpError, match=rf"aten\.addmm.*leaves torch by {how}"):
        init_module(lambda: Keeps(leak), seed=7)  # type: ignore[arg-type]


class Lazy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.LazyLinear(3)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(self.a(x))


def test_aLazyModule_notMaterialised_isAConfigError_andOneMaterialisedByADummyPass_builds() -> None:
    with pytest.raises(ConfigError, match=r"b\.weight, b\.bias are not materialised.*throwaway forward pass"):
        init_module(Lazy, seed=1)

    def materialised() -> nn.Module:
        model = Lazy()
        model(torch.zeros(1, 4))
        return model

    built = [init_module(materialised, seed=1) for _ in range(2)]
    assert built[0].b.weight.shape == (3, 8)
    assert all(
        torch.equal(x, y)
        for x, y in zip(built[0].state_dict().values(), built[1].state_dict().values(), strict=True)
    )


LAZY_TASK = """
from pathlib import Path
import torch, torch.nn.functional as F
from torch import nn
from game.api import Task, task

HERE = Path(__file__).parent


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv1d(1, 4, 3), nn.ReLU(), nn.MaxPool1d(2))
        self.b = nn.LazyLinear(3)

    def forward(self, x):
        return self.b(self.a(x.unsqueeze(1)).flatten(1))


def make():
    model = Net()
    model(torch.zeros(1, 4))  # materialises b: its size from a throwaway pass
    return model


@task(lr=0.05, batch_size=8, steps=3, optimizer="adam")
def build(cfg):
    return Task(model=make, dataset=HERE / "data.npz", loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]))
"""


def test_aTaskWhoseModelIsSizedByADummyPass_trainsAndAudits(tmp_path: Path) -> None:
    trains_and_audits(tmp_path, LAZY_TASK)


def test_statisticsResetAfterADummyPassInTrainingMode_pass_andBuildTheModelTheEvalPassBuilds() -> None:
    """A value overwritten whole since (``reset_running_stats``: ``zero_``, ``fill_``) is not kept."""

    def reset() -> nn.Module:
        model = Sized(bn_eval=False)
        model.features[1].reset_running_stats()
        return model

    after_reset = init_module(reset, seed=7).state_dict()
    eval_pass = init_module(Sized, seed=7).state_dict()
    assert all(torch.equal(after_reset[k], eval_pass[k]) for k in eval_pass)


def _partly_zeroed(m: nn.Module, y: Tensor) -> None:
    m.register_buffer("stats", y.sum(0))
    m.stats[:2].zero_()  # half of it still the pass's


def _copied_in(m: nn.Module, y: Tensor) -> None:
    m.register_buffer("stats", torch.zeros(4))
    m.stats.copy_(y[0])  # overwritten whole, from the pass


@pytest.mark.parametrize("keep", [_partly_zeroed, _copied_in])
def test_aPartialOverwrite_orOneFromAProvisionalValue_keepsItProvisional(
    keep: Callable[[nn.Module, Tensor], None],
) -> None:
    with pytest.raises(UnsupportedOpError, match=r"reached stats, so"):
        init_module(lambda: Keeps(keep), seed=7)
