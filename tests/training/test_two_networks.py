"""Two networks trained against each other (a GAN) in one step, as the README says to write them:
one optimizer with a param group each, one loss whose parts reach only their own network."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from game.errors import ConfigError
from game.training.engine.replay import replay_transcript_step
from game.training.engine.train import train
from game.training.task.config import load_config
from tests.training.test_task_api import make_plugin, trains_and_audits

ONE = """torch.optim.Adam(
            [{"params": m.G.parameters(), "lr": 2e-3}, {"params": m.D.parameters(), "lr": 1e-3}],
            betas=(0.5, 0.999),
        )"""
TWO = "[torch.optim.Adam(m.G.parameters()), torch.optim.Adam(m.D.parameters())]"
GAN = """
from pathlib import Path
import torch, torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from game.api import Task, task

HERE = Path(__file__).parent


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
        self.D = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))


def loss(m, b):
    x = b["x"]
    fake = m.G(torch.randn(x.shape[0], 2))
    real_y, fake_y = torch.ones(x.shape[0], 1), torch.zeros(x.shape[0], 1)
    d = F.binary_cross_entropy_with_logits(m.D(x), real_y) + F.binary_cross_entropy_with_logits(
        m.D(fake.detach()), fake_y
    )
    frozen = {k: v.detach() for k, v in m.D.named_parameters()}
    g = F.binary_cross_entropy_with_logits(functional_call(m.D, frozen, (fake,)), real_y)
    return PARTS


@task(lr=0.05, batch_size=8, steps=4)
def build(cfg):
    return Task(
        model=GAN,
        dataset=HERE / "data.npz",
        loss=loss,
        optimizer=lambda m: OPTIMIZER,
    )
"""


def test_aGanInOneStep_eachNetworkGetsItsOwnLossesGradient_trainsAndAudits(tmp_path: Path) -> None:
    """The run trains and audits on another profile, a judge's re-run of a step agrees, and each
    network's gradient is its own part's alone (the generator's part gives the discriminator
    none), so the sum trains each on its own loss."""
    trains_and_audits(
        tmp_path / "gan",
        GAN.replace("PARTS", "d + g").replace("OPTIMIZER", ONE),
        steps=4,
        checkpoint_interval=2,
    )
    assert replay_transcript_step(tmp_path / "gan" / "t", 3, "splitk-16").matches_transcript

    namespace: dict[str, object] = {"__file__": str(tmp_path / "tasks.py")}
    exec(GAN.replace("PARTS", "d, g").replace("OPTIMIZER", ONE), namespace)
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as in a step
    try:
        model = namespace["GAN"]()  # type: ignore[operator]
        d, g = namespace["loss"](model, {"x": torch.randn(8, 4)})  # type: ignore[operator]
    finally:
        torch.set_default_dtype(before)
    names, params = zip(*model.named_parameters(), strict=True)
    by_d = torch.autograd.grad(d, params, retain_graph=True, allow_unused=True)
    by_g = torch.autograd.grad(g, params, allow_unused=True)
    for name, from_d, from_g in zip(names, by_d, by_g, strict=True):
        own, other = (from_d, from_g) if name.startswith("D.") else (from_g, from_d)
        assert other is None or not other.any(), name  # the other network's part reaches it not
        assert own is not None and own.abs().sum() > 0, name


def test_twoOptimizers_areRefusedSayingHowToWriteThemAsOne(tmp_path: Path) -> None:
    body = GAN.replace("PARTS", "d + g").replace("OPTIMIZER", TWO)
    make_plugin(tmp_path, body)
    with pytest.raises(
        ConfigError, match=r"returned list, not a torch\.optim\.Optimizer: a step updates .*param group"
    ):
        train(load_config(tmp_path / "task.toml").replace(steps=1), "cpu-1t", tmp_path / "t")
