"""Writes to repeated indices in a step (dispatch/writeorder.py).

Why: torch leaves the result of ``x[idx] = v``, ``index_put_``, ``index_copy_``, ``scatter_`` and
``put_`` undefined where an index repeats. With two threads this CPU kept another of the written
values on most runs (CUDA's kernels too), so a step that writes features into a bank by a
repeating id trained on one value and was audited on another. In a step the last written element
now wins on every device and every run, and only it receives a gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import Tensor

from game.training.dispatch.writeorder import last_of_each_place
from game.training.engine.audit import audit
from game.training.engine.replay import replay_transcript_step
from game.training.engine.train import train
from game.training.task.config import load_config
from tests.training.test_carried import _body
from tests.training.test_stockops import _across_interceptors, _ops
from tests.training.test_task_api import make_plugin

#: More written elements than torch's parallel grain (32,768), so two threads split the write.
MANY = 200_000


@contextmanager
def _threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _last_written(size: int, places: list[int], values: list[float]) -> Tensor:
    """What a sequential loop leaves in a zeroed vector of ``size``: each place's last value."""
    out = [0.0] * size
    for place, value in zip(places, values, strict=True):
        out[place] = value
    return torch.tensor(out, dtype=torch.float64)


def _writes() -> dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]]:
    """Each served form, writing ``values`` at ``idx`` into a copy of ``x`` (1-D)."""

    def setitem(x: Tensor, idx: Tensor, v: Tensor) -> Tensor:
        x[idx] = v
        return x

    return {
        "setitem": setitem,
        "index_put_": lambda x, idx, v: x.index_put_((idx,), v),
        "torch.index_put": lambda x, idx, v: torch.index_put(x, (idx,), v),
        "index_copy_": lambda x, idx, v: x.index_copy_(0, idx, v),
        "torch.index_copy": lambda x, idx, v: torch.index_copy(x, 0, idx, v),
        "scatter_": lambda x, idx, v: x.scatter_(0, idx, v),
        "scatter": lambda x, idx, v: torch.scatter(x, 0, idx, v),
        "put_": lambda x, idx, v: x.put_(idx - x.numel(), v),  # negative: counted from the end
    }


@pytest.mark.parametrize("form", list(_writes()))
def test_aRepeatedPlace_keepsItsLastValue_onTwoThreadsEveryRun(form: str) -> None:
    """200,000 writes to 97 places: torch's own kernel on two threads kept another value on most
    runs (``setitem``, ``index_put_``, ``index_copy_``)."""
    write = _writes()[form]
    places = (torch.arange(MANY) * 7919) % 97
    values = torch.arange(MANY, dtype=torch.float64)
    want = _last_written(97, places.tolist(), values.tolist())
    with _threads(2):
        for _ in range(4):
            with _ops():
                got = write(torch.zeros(97, dtype=torch.float64), places, values)
            assert torch.equal(got, want)


def test_lastOfEachPlace_namesTheLastWriter() -> None:
    places = torch.tensor([[3, 1, 3], [0, 1, 3]])
    assert last_of_each_place(places).tolist() == [5, 4, 5, 3, 4, 5]


def test_setitemAcrossDims_slicesAListAndNegativeIndices_keepTheLastRow() -> None:
    x = torch.zeros(4, 5, dtype=torch.float64)
    rows = torch.arange(18, dtype=torch.float64).view(6, 3)
    with _ops():
        by_tensor = x.clone()
        by_tensor[torch.tensor([1, -1, 1, 3, 0, 1]), 1:4] = rows
        by_list = x.clone()
        by_list[[2, 2], :3] = rows[:2]
        pair = x.clone()
        pair[torch.tensor([0, 0, 2]), torch.tensor([4, 4, 4])] = torch.tensor(
            [7.0, 8.0, 9.0], dtype=torch.float64
        )
    assert by_tensor[1, 1:4].tolist() == rows[5].tolist() and by_tensor[3, 1:4].tolist() == rows[3].tolist()
    assert by_tensor[0, 1:4].tolist() == rows[4].tolist() and by_tensor[:, [0, 4]].abs().sum() == 0
    assert by_list[2, :3].tolist() == rows[1].tolist()
    assert pair[0, 4] == 8.0 and pair[2, 4] == 9.0


def test_scatterAlongAnInnerDim_andIndexCopyOfColumns_keepTheLast() -> None:
    x = torch.zeros(2, 4, dtype=torch.float64)
    src = torch.arange(10, dtype=torch.float64).view(2, 5)
    index = torch.tensor([[1, 1, 3], [0, 0, 0]])
    with _ops():
        scattered = x.scatter(1, index, src)  # src wider than index: only its first 3 columns
        copied = x.index_copy(1, torch.tensor([2, 0, 2, 2]), src[:, :4])
    assert scattered.tolist() == [[0.0, 1.0, 0.0, 2.0], [7.0, 0.0, 0.0, 0.0]]
    assert copied.tolist() == [[1.0, 0.0, 3.0, 0.0], [6.0, 0.0, 8.0, 0.0]]


def test_accumulatingWritesAndOnesThatCannotRepeat_areTorchsOwn() -> None:
    x = torch.zeros(5, dtype=torch.float64)
    idx = torch.tensor([1, 1, 4])
    v = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    with _ops():
        summed = x.index_put((idx,), v, accumulate=True)
        put = x.clone().put_(idx, v, accumulate=True)
        reduced = x.scatter(0, idx, v, reduce="add")
        number = x.clone()
        number[idx] = 3.0
        masked = x.clone()
        masked[x == 0] = torch.arange(5, dtype=torch.float64)
    for got in (summed, put, reduced):
        assert got.tolist() == [0.0, 3.0, 0.0, 0.0, 4.0]
    assert number.tolist() == [0.0, 3.0, 0.0, 0.0, 3.0] and masked.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_onlyTheLastWriterReceivesAGradient_theSameOnBothInterceptors() -> None:
    """Recorded through the C++ front and replayed through the Python mode on ``noisy``."""

    def run() -> list[Tensor]:
        v = torch.arange(15, dtype=torch.float64).view(5, 3).requires_grad_(True)
        w = torch.arange(12, dtype=torch.float64).view(4, 3)
        y = torch.zeros(4, 3, dtype=torch.float64)
        y[torch.tensor([1, 2, 1, 1, 0])] = v * 1.0
        (y * w).sum().backward()
        assert v.grad is not None
        return [y.detach(), v.grad]

    recorded, replayed, _ = _across_interceptors(run)
    for a, b in zip(recorded, replayed, strict=True):
        assert torch.equal(a, b)
    y, grad = recorded
    assert y[1].tolist() == [9.0, 10.0, 11.0]
    assert grad.tolist() == [[0.0] * 3, [6.0, 7.0, 8.0], [0.0] * 3, [3.0, 4.0, 5.0], [0.0, 1.0, 2.0]]


def test_aTokenMemoryTask_trainsOnOneThread_auditsOnTwo_andIsJudgedAlike(tmp_path: Path) -> None:
    """Each of 48,000 token positions writes its feature into its token's slot (ids repeat):
    trained on ``cpu-1t``, audited on ``cpu-2t``, where torch's own write kept another value."""
    body = _body(
        "        h = torch.tanh(self.a(x))\n"
        "        feats = h.repeat(1, 6000).reshape(-1)\n"
        "        slots = torch.zeros(101, dtype=x.dtype)\n"
        "        slots[(torch.arange(feats.numel()) * 31) % 101] = feats\n"
        "        return self.b(h + slots[:8])",
    )
    name = make_plugin(tmp_path, body)
    assert name
    cfg = load_config(tmp_path / "task.toml").replace(steps=4, checkpoint_interval=1)
    result = train(cfg, "cpu-1t", tmp_path / "t")
    report = audit(tmp_path / "t", "cpu-2t")
    assert report.match and report.trainer_state_root == result.state_root
    with _threads(2):
        assert replay_transcript_step(tmp_path / "t", 3, "cpu-2t").matches_transcript
