"""Which rows a step trains on, with a torch ``WeightedRandomSampler`` as the task's sampling.

Why: class-balanced training (``WeightedRandomSampler(weights, n)``) could not be given at all
(``Task.sampling`` took "replacement" or "epochs"); torch's sampler draws with ``multinomial`` from
its own generator, which no other party repeats. vgame draws by the weights itself, in exact integer
arithmetic (``task/sampling.py``), and binds them with the data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import RandomSampler, WeightedRandomSampler

from game.errors import ConfigError
from game.training.task import sampling
from game.training.task.config import load_config
from game.training.task.inputs import Digest
from tests.training.test_task_api import TASK_PY, make_plugin, trains_and_audits

SEED = 11


def _picks(weights: list[float] | torch.Tensor, ids: torch.Tensor, step: int = 1) -> torch.Tensor:
    sampler = WeightedRandomSampler(weights, num_samples=1)
    n = len(sampler.weights)
    return sampling.pick(SEED, step, ids, n, sampling.plan(sampler, n))


def test_itemsAreDrawnInProportionToTheirWeights_andAZeroWeightNever() -> None:
    weights = [1.0, 3.0, 0.0, 4.0, 0.5]
    ids = torch.arange(170_000, dtype=torch.int64)
    counts = np.bincount(_picks(weights, ids).numpy(), minlength=5)
    p = np.array(weights) / sum(weights)
    sigma = np.sqrt(len(ids) * p * (1 - p))
    assert counts[2] == 0
    assert np.all(np.abs(counts - len(ids) * p) <= 5 * sigma + 1e-9), (counts, len(ids) * p)


def test_picksAreAFunctionOfTheExampleId_whateverTheSplit_andExactInTheWeights() -> None:
    """The rows a worker draws for its half are the whole batch's; weights scaled by a power of two
    (an exact change) or given as float32 draw the very same items; another seed or step others."""
    rng = np.random.default_rng(0)
    weights = torch.from_numpy(rng.random(1000) ** 3)
    ids = torch.arange(64, dtype=torch.int64) + 640
    whole = _picks(weights, ids)
    assert torch.equal(torch.cat([_picks(weights, ids[:24]), _picks(weights, ids[24:])]), whole)
    assert torch.equal(_picks(weights * 2.0**-300, ids), whole)
    assert torch.equal(_picks(weights * 2.0**40, ids), whole)
    narrow = weights.float()
    assert torch.equal(_picks(narrow, ids), _picks(narrow.double(), ids))
    assert not torch.equal(_picks(weights, ids, step=2), whole)


def test_theRunningSumsAreExactIntegers_belowTwoToTheSixtyOne() -> None:
    w = np.array([1e-30, 1.0, 2.0**-70, 7.0, 1e-300])
    sums = sampling.running_sums(w, 5)
    steps = np.diff(np.concatenate([[0], sums.numpy()]))
    total = float(sums[-1])
    assert 2.0**59 <= total < 2.0**61 and sums.dtype == torch.int64
    assert steps[4] == 0 and steps[2] == 0  # below 2**-60 of the sum: never drawn
    assert steps[3] / steps[1] == pytest.approx(7.0, rel=1e-15)


@pytest.mark.parametrize(
    ("sampler", "message"),
    [
        (WeightedRandomSampler([1.0, 2.0], 2, replacement=False), "without replacement"),
        (WeightedRandomSampler([1.0, -2.0], 2), r"weight 1 is -2\.0"),
        (WeightedRandomSampler([1.0, float("nan")], 2), "finite"),
        (WeightedRandomSampler([0.0, 0.0], 2), "every weight is 0"),
        (WeightedRandomSampler([1.0, 2.0, 3.0], 3), "3 weights for a dataset of 2 items"),
    ],
)
def test_aSamplerThatCannotBeDrawnFrom_isRefusedSayingWhy(
    sampler: WeightedRandomSampler, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        sampling.plan(sampler, 2)


def test_anotherTorchSampler_isRefusedAsTaskSampling() -> None:
    from game.training.task.define import Task

    with pytest.raises(
        ConfigError, match="expected one of replacement, epochs or a torch WeightedRandomSampler"
    ):
        Task(model=lambda: None, dataset=[1], loss=lambda m, b: b, sampling=RandomSampler(range(3)))


BALANCED = TASK_PY.replace(
    "@task(",
    "def balanced():\n"
    "    y = np.load(Path(__file__).parent / 'data.npz')['y']\n"
    "    return WeightedRandomSampler((y == 2).astype(np.float64) * WEIGHT, num_samples=len(y))\n\n\n"
    "@task(",
).replace("        init_weights=", "        sampling=balanced(),\n        init_weights=")
BALANCED = "from torch.utils.data import WeightedRandomSampler\nimport numpy as np\nWEIGHT = 1.0\n" + BALANCED


def test_aTaskWithAWeightedSampler_trainsOnTheWeightedItems_auditsAndBindsTheWeights(tmp_path: Path) -> None:
    """Only class 2 has weight: every row a step trains on is of class 2; the auditor agrees; a
    change of the weights (not their scale by a power of two) is another task."""
    from game.training.engine.runtime import runtime_for

    root = trains_and_audits(tmp_path / "a", BALANCED, steps=3)
    cfg = load_config(tmp_path / "a" / "task.toml")
    rt = runtime_for(cfg)
    for step in (1, 2, 3):
        assert set(rt.batch(step).data["y"].tolist()) == {2}
    digest = cfg.inputs().dataset
    assert isinstance(digest, Digest) and digest.detail["sampling"] == "weighted"

    make_plugin(tmp_path / "b", BALANCED.replace("WEIGHT = 1.0", "WEIGHT = 0.5"))
    assert load_config(tmp_path / "b" / "task.toml").inputs().dataset.sha256 == digest.sha256
    make_plugin(tmp_path / "c", BALANCED.replace("(y == 2).astype", "(y >= 1).astype"))
    assert load_config(tmp_path / "c" / "task.toml").inputs().dataset.sha256 != digest.sha256
    assert root
