"""A dataset whose items draw at random, and a build that splits its data at random, are the same in
every process; a dataset that draws from a generator of its own is refused before training.

Why: each process hashed another dataset (the items' augmentation, or the split, drawn from
unseeded generators), so the spec hash differed: the trainer trained, and every auditor was refused
with "this machine's inputs are not the task's". Now the draws a build function makes are served
from the task's seed (``stockops.building``), the draws an item makes while the digest reads it from
its index and the generators seeded for the reading (``stockops.reading_items``), and a step's batch draws its own (``collating``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from game.errors import ConfigError
from game.training.dispatch.stockops import building, collating, reading_items
from game.training.task import datasets, sampling
from game.training.task.config import factory_of, load_config
from tests.training.test_task_api import _vgame, make_plugin

JITTERED = """
import random
from collections.abc import Iterator
from pathlib import Path
import numpy as np, torch, torch.nn.functional as F
from torch import nn
from game.api import Task, task


class Jittered(torch.utils.data.Dataset):
    def __init__(self):
        d = np.load(Path(__file__).parent / "data.npz")
        self.x, self.y = torch.from_numpy(d["x"]), torch.from_numpy(d["y"])

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i] + 0.1 * torch.randn(4) + torch.from_numpy(np.random.rand(4))
        if random.random() < 0.5:
            x = x.flip(0)
        return {"x": x, "y": self.y[i]}


@task(lr=0.05, batch_size=8, steps=3, optimizer="sgd")
def build(cfg):
    data = Jittered()
    train, _ = torch.utils.data.random_split(data, [0.75, 0.25])  # torch's generator, unseeded
    kept = torch.utils.data.Subset(train, np.random.permutation(len(train))[:24].tolist())  # numpy's
    return Task(model=lambda: nn.Linear(4, 3), dataset=kept, loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]))
"""

OWN_GENERATOR = """
from collections.abc import Iterator
from pathlib import Path
import numpy as np, torch, torch.nn.functional as F
from torch import nn
from game.api import Task, task


class Noisy(torch.utils.data.Dataset):
    def __init__(self):
        self.rng = np.random.default_rng()  # the dataset's own: its state moves with every read

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"x": torch.full((4,), float(i)) + torch.from_numpy(self.rng.random(4)), "y": i % 3}


@task(lr=0.05, batch_size=8, steps=2, optimizer="sgd")
def build(cfg):
    return Task(model=lambda: nn.Linear(4, 3), dataset=Noisy(), loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]))
"""


def test_aDatasetThatAugmentsAndIsSplitAtRandom_trainsAndAuditsInAnotherProcess(tmp_path: Path) -> None:
    """Trainer and auditor are two processes, each drawing the split and hashing the items anew."""
    make_plugin(tmp_path, JITTERED)
    trained = _vgame(tmp_path, "train", "--config", "task.toml", "--out", "t", "--json")
    assert trained.returncode == 0, trained.stderr
    audited = _vgame(tmp_path, "audit", "--transcript", "t", "--profile", "noisy", "--json")
    assert audited.returncode == 0, audited.stderr
    report = json.loads(audited.stdout)
    assert report["match"] and report["auditor_state_root"] == json.loads(trained.stdout)["state_root"]


def test_theSplitFollowsTheSeed_andAnItemsDrawsAreItsOwn_perReadAndPerStep(tmp_path: Path) -> None:
    make_plugin(tmp_path, JITTERED)
    cfg = load_config(tmp_path / "task.toml")
    factory = factory_of(cfg.task)
    kept = factory.make(cfg).dataset
    same = factory.make(cfg.replace(seed=cfg.seed, steps=cfg.steps + 1)).dataset  # built anew: same seed
    other = factory.make(cfg.replace(seed=cfg.seed + 1)).dataset
    assert kept is not same and kept.indices == same.indices and kept.dataset.indices == same.dataset.indices
    assert (kept.indices, kept.dataset.indices) != (other.indices, other.dataset.indices)

    torch.rand(3), np.random.rand()  # the process's generators elsewhere change nothing
    assert datasets.digest(kept) == datasets.digest(same)
    with reading_items() as read:
        first = [read(kept, i)["x"] for i in (5, 6)]
    with reading_items() as read:
        again = [read(kept, i)["x"] for i in (5, 6)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    with reading_items() as read:
        neighbour = read(_Shifted(kept), 6)["x"]  # item 5, first in its scope too, under item 6's draws
    ids = sampling.example_ids(1, 8)
    with collating(cfg.seed, 1, ids):
        at_step_1 = kept[5]["x"]
    with collating(cfg.seed, 2, ids):
        at_step_2 = kept[5]["x"]
    assert not torch.equal(first[0], neighbour) and not torch.equal(at_step_1, at_step_2)


class _Shifted(torch.utils.data.Dataset[object]):
    """Item ``i`` of it is item ``i - 1`` of ``inner``."""

    def __init__(self, inner: torch.utils.data.Dataset[object]) -> None:
        self.inner = inner

    def __getitem__(self, i: int) -> object:
        return self.inner[i - 1]


def test_theBuildsDrawsArePutBack() -> None:
    """A build's seeded generators do not leak into the process after it."""
    state = np.random.get_state()[1].copy()
    torch_state = torch.get_rng_state()
    with building(7):
        drawn = (np.random.rand(), torch.randperm(10).tolist())
    with building(7):
        again = (np.random.rand(), torch.randperm(10).tolist())
    assert drawn == again
    assert np.array_equal(np.random.get_state()[1], state) and torch.equal(torch.get_rng_state(), torch_state)


def test_aDatasetWithAGeneratorOfItsOwn_isRefusedBeforeTraining_namingTheWayOut(tmp_path: Path) -> None:
    make_plugin(tmp_path, OWN_GENERATOR)
    cfg = load_config(tmp_path / "task.toml")
    with pytest.raises(ConfigError, match="item 0 read twice gave two different items") as caught:
        cfg.spec_hash()
    assert "make the generator in __getitem__" in str(caught.value)
    trained = _vgame(tmp_path, "train", "--config", "task.toml", "--out", "t")
    assert trained.returncode == 2 and not (tmp_path / "t" / "manifest.json").exists()


class _Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


class _SizedStream(_Stream):
    def __len__(self) -> int:  # a stream that knows its length is still read front to back
        return 4


@pytest.mark.parametrize("stream", [_Stream(), _SizedStream()])
def test_anIterableDataset_isRefusedSayingWhatAJudgeNeedsAndTheWayOut(stream: object) -> None:
    """It was refused as "expected a map-style Dataset ..., got _Stream" alone, or, given a
    ``__len__``, taken and failed in the digest with torch's NotImplementedError."""
    with pytest.raises(ConfigError, match=r"IterableDataset, read only front to back.*\.npz"):
        datasets.as_dataset(stream, "Task.dataset")
