"""Stock PyTorch in a step, op by op: functional ops, losses, layers and optimizers a user's own
model calls, each recorded through the C++ front on one machine and replayed through the Python
mode on a noisy one, forward and backward. Each must replay bit for bit with the log used up, or
stop at its first call naming itself (never a wrong value): the brief's "stock PyTorch ops that just
work"."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from game.errors import UnsupportedOpError
from game.training.dispatch.initmode import init_module
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.profiles import get_profile
from game.training.dispatch.stockops import StockOps
from game.training.log.formats import new_step_log
from game.training.numerics import rounding

STEP, BITS = 3, 32
ROWS = 4


def _inputs() -> tuple[Tensor, Tensor, Tensor]:
    """An image batch, a row batch and labels, on the grid."""
    g = torch.Generator().manual_seed(0)
    image = rounding.rnd(torch.randn(ROWS, 3, 8, 8, generator=g, dtype=torch.float64), BITS)
    rows = rounding.rnd(torch.randn(ROWS, 16, generator=g, dtype=torch.float64), BITS)
    return image, rows, torch.randint(0, 4, (ROWS,), generator=g)


def _eye(n: int) -> Tensor:
    return torch.eye(n, dtype=torch.float64)


Op = Callable[[Tensor, Tensor, Tensor], Tensor]

#: Each op of the battery on (image, rows, labels): a tensor its backward can start from.
OPS: dict[str, Op] = {
    "interpolate_bilinear": lambda x, v, y: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "interpolate_bicubic": lambda x, v, y: F.interpolate(x, size=(5, 5), mode="bicubic"),
    "adaptive_avg_pool": lambda x, v, y: F.adaptive_avg_pool2d(x, 3),
    "adaptive_max_pool": lambda x, v, y: F.adaptive_max_pool2d(x, 3),
    "lp_pool": lambda x, v, y: F.lp_pool2d(x, 2, 2),
    "max_unpool": lambda x, v, y: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
    "grid_sample": lambda x, v, y: F.grid_sample(
        x, torch.tanh(x[:, :2].permute(0, 2, 3, 1)), align_corners=False
    ),
    "unfold_fold": lambda x, v, y: F.fold(F.unfold(x, 3), (8, 8), 3),
    "pixel_shuffle": lambda x, v, y: F.pixel_shuffle(x.reshape(ROWS, 12, 4, 4), 2),
    "group_norm": lambda x, v, y: F.group_norm(x, 3),
    "instance_norm": lambda x, v, y: F.instance_norm(x),
    "local_response_norm": lambda x, v, y: F.local_response_norm(x, 2),
    "pad_reflect": lambda x, v, y: F.pad(x, (1, 1, 1, 1), mode="reflect"),
    "pad_replicate": lambda x, v, y: F.pad(x, (1, 1, 1, 1), mode="replicate"),
    "pad_circular": lambda x, v, y: F.pad(x, (1, 1, 1, 1), mode="circular"),
    "conv_transpose": lambda x, v, y: F.conv_transpose2d(x, x[:3, :2, :3, :3], stride=2),
    "layer_norm": lambda x, v, y: F.layer_norm(v, (16,)),
    "normalize": lambda x, v, y: F.normalize(v),
    "cosine_similarity": lambda x, v, y: F.cosine_similarity(v, v.flip(0)),
    "cdist": lambda x, v, y: torch.cdist(v, v.flip(0)),
    "logsumexp": lambda x, v, y: torch.logsumexp(v, 1),
    "cumsum": lambda x, v, y: torch.cumsum(v, 1),
    "prod_cumprod": lambda x, v, y: (
        v.sigmoid().prod(1, keepdim=True)
        + torch.cumprod(v.tanh(), 1)
        + torch.relu(v).prod(0)
        + v[:, :3].prod()
    ),
    "cummax": lambda x, v, y: torch.cummax(v, 1)[0],
    "sort_topk": lambda x, v, y: torch.sort(v, 1)[0] + torch.topk(v, 16)[0],
    "median_kthvalue": lambda x, v, y: torch.median(v, 1)[0] + torch.kthvalue(v, 3)[0],
    "quantile": lambda x, v, y: torch.quantile(v, 0.3, dim=1),
    "var_std": lambda x, v, y: torch.var_mean(v, 1)[0] + v.std(1),
    "norm_p3": lambda x, v, y: v.norm(p=3, dim=1),
    "index_add": lambda x, v, y: torch.zeros(ROWS, 16, dtype=torch.float64).index_add(0, y, v),
    "scatter_reduce_mean": lambda x, v, y: torch.zeros(ROWS, 16, dtype=torch.float64).scatter_reduce(
        0, y[:, None].expand(ROWS, 16), v, "mean"
    ),
    "embedding_bag": lambda x, v, y: F.embedding_bag(torch.tensor([0, 2, 1, 3]), v, torch.tensor([0, 2])),
    "einsum": lambda x, v, y: torch.einsum("ij,kj->ik", v, v),
    "linalg_solve_inv": lambda x, v, y: (
        torch.linalg.solve(v[:, :4] + 4 * _eye(4), v[:, 4:8]) + torch.linalg.inv(v[:, 8:12] + 4 * _eye(4))
    ),
    "cholesky": lambda x, v, y: torch.linalg.cholesky(v[:, :4] @ v[:, :4].T + _eye(4)),
    "svdvals_eigvalsh": lambda x, v, y: (
        torch.linalg.svdvals(v) + torch.linalg.eigvalsh(v[:, :4] @ v[:, :4].T)
    ),
    "det_qr": lambda x, v, y: torch.linalg.det(v[:, :4]) + torch.linalg.qr(v)[1].sum(1),
    "fft": lambda x, v, y: torch.fft.rfft(v).abs(),
    "stft": lambda x, v, y: torch.stft(
        v, 8, window=torch.hann_window(8, dtype=torch.float64), return_complex=True
    ).abs(),
    "complex": lambda x, v, y: torch.view_as_real(torch.view_as_complex(v.reshape(ROWS, 8, 2)) * 1.5j),
    "special": lambda x, v, y: torch.lgamma(v.abs() + 1) + torch.digamma(v.abs() + 1) + torch.special.i0(v),
    "erfinv_atan2": lambda x, v, y: torch.erfinv(v.tanh() * 0.9) + torch.atan2(v, v.flip(0)),
    "activations": lambda x, v, y: F.softplus(v) + F.mish(v) + F.hardswish(v) + F.celu(v) + F.logsigmoid(v),
    "glu_prelu": lambda x, v, y: (
        F.glu(v).repeat(1, 2) + F.prelu(v, torch.tensor([0.25], dtype=torch.float64))
    ),
    "gumbel_softmax": lambda x, v, y: F.gumbel_softmax(v, tau=0.5),
    "losses": lambda x, v, y: (
        F.kl_div(v.log_softmax(1), v.softmax(1), reduction="batchmean")
        + F.binary_cross_entropy_with_logits(v, (v > 0).double())
        + F.smooth_l1_loss(v, v.flip(0))
        + F.cross_entropy(v, y, weight=torch.linspace(0.5, 1.5, 16, dtype=torch.float64), label_smoothing=0.1)
        + F.triplet_margin_loss(v, v.flip(0), v.roll(1, 0))
        + F.gaussian_nll_loss(v, v.flip(0), v.abs() + 0.1)
        + F.poisson_nll_loss(v, v.abs())
    ),
    "ctc": lambda x, v, y: F.ctc_loss(
        v.log_softmax(1)[:, None, :5].expand(ROWS, 2, 5),
        torch.tensor([[1, 2], [3, 1]]),
        torch.tensor([ROWS, ROWS]),
        torch.tensor([2, 2]),
    ),
    "distributions": lambda x, v, y: (
        torch.distributions.Normal(v, v.abs() + 0.1).rsample()
        + torch.distributions.Normal(v, v.abs() + 0.1).log_prob(v)
    ),
    "elementwise": lambda x, v, y: (
        torch.lerp(v, v.flip(0), 0.3)
        + torch.addcdiv(v, v, v.abs() + 1, value=0.5)
        + torch.remainder(v, 0.7)
        + torch.round(v, decimals=2)
        + torch.where(v > 0, v, 0.5)
    ),
    "nan_to_num": lambda x, v, y: torch.nan_to_num(torch.where(v > 0, v, torch.inf)),
    "tril_diag": lambda x, v, y: torch.tril(v) + torch.diag(v[0])[:ROWS],
}

MODULES: dict[str, Callable[[], nn.Module]] = {
    "lstm_dropout": lambda: nn.LSTM(16, 8, num_layers=2, dropout=0.2, batch_first=True),
    "gru_bidirectional": lambda: nn.GRU(
        16, 8, num_layers=2, dropout=0.2, bidirectional=True, batch_first=True
    ),
    "transformer_layer": lambda: nn.TransformerEncoderLayer(16, 2, 32, batch_first=True),
    "multihead_attention": lambda: nn.MultiheadAttention(16, 2, dropout=0.1, batch_first=True),
    "bilinear": lambda: nn.Bilinear(16, 16, 3),
    "embedding_max_norm": lambda: nn.Embedding(10, 16, max_norm=1.0),
    "spectral_norm": lambda: nn.utils.parametrizations.spectral_norm(nn.Linear(16, 4)),
    "weight_norm": lambda: nn.utils.parametrizations.weight_norm(nn.Linear(16, 4)),
}


def _module_call(m: nn.Module, v: Tensor) -> Tensor:
    if isinstance(m, nn.LSTM | nn.GRU):
        return m(v[:, None, :].expand(-1, 3, -1))[0]
    if isinstance(m, nn.MultiheadAttention):
        return m(v[None], v[None], v[None])[0]
    if isinstance(m, nn.TransformerEncoderLayer):
        return m(v[None])
    if isinstance(m, nn.Bilinear):
        return m(v, v.flip(0))
    if isinstance(m, nn.Embedding):
        return m((v.abs() * 3).long() % 10)
    return m(v)


def _twice(run: Callable[[], list[Tensor]]) -> tuple[list[Tensor], list[Tensor]]:
    """``run`` recorded through the C++ front on ``cpu-1t`` and replayed through the Python mode on
    ``noisy`` (each in a step's StockOps), the log used up."""
    log = new_step_log("sparse", STEP)
    out = []
    for profile, mode in (("cpu-1t", "record"), ("noisy", "replay")):
        rm = RoundingMode(bits=BITS, tau=0.25, mode=mode, profile=get_profile(profile), step=STEP, log=log)
        with StockOps(5, STEP, 0, torch.arange(ROWS), bits=BITS), rm:
            out.append(run())
        if mode == "replay":
            rm.finish()
    return out[0], out[1]


def _backward(out: Tensor) -> None:
    """A backward pass that weighs each value differently (a plain sum hides some gradients)."""
    weights = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weights).sum().backward()


@pytest.mark.parametrize("name", sorted(OPS))
def test_anOp_forwardAndBackward_replaysAcrossTheInterceptors(name: str) -> None:
    image, rows, labels = _inputs()

    def run() -> list[Tensor]:
        x, v = image.clone().requires_grad_(), rows.clone().requires_grad_()
        out = OPS[name](x, v, labels)
        _backward(out)
        return [out.detach(), *(t.grad for t in (x, v) if t.grad is not None)]

    recorded, replayed = _twice(run)
    assert len(recorded) > 1  # a gradient reached an input
    assert all(torch.equal(a, b) for a, b in zip(recorded, replayed, strict=True))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_aLayer_inTraining_replaysAcrossTheInterceptors(name: str) -> None:
    _, rows, _ = _inputs()
    # one each: a layer's forward may change its own state (a spectral norm's power iteration)
    modules = [init_module(MODULES[name], seed=2).train() for _ in range(2)]

    def run() -> list[Tensor]:
        module = modules.pop()
        out = _module_call(module, rows)
        _backward(out)
        return [out.detach(), *(p.grad.clone() for p in module.parameters() if p.grad is not None)]

    recorded, replayed = _twice(run)
    assert len(recorded) > 1
    assert all(torch.equal(a, b) for a, b in zip(recorded, replayed, strict=True))


OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
    "rmsprop_centered": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, centered=True),
    "adadelta": lambda p: torch.optim.Adadelta(p),
    "adamax": lambda p: torch.optim.Adamax(p, lr=1e-2),
    "nadam": lambda p: torch.optim.NAdam(p, lr=1e-2),
    "radam": lambda p: torch.optim.RAdam(p, lr=1e-2),
    "asgd": lambda p: torch.optim.ASGD(p, lr=1e-2),
    "rprop": lambda p: torch.optim.Rprop(p, lr=1e-2),
    "adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-2),
    "lbfgs": lambda p: torch.optim.LBFGS(p, lr=0.1, max_iter=3),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_anOptimizer_overThreeSteps_replaysAcrossTheInterceptors(name: str) -> None:
    """torch's optimizers, their state made lazily inside the first step: three steps recorded on
    one machine and replayed on the other give the same parameters, bit for bit."""
    _, rows, labels = _inputs()
    finals = []
    logs = [new_step_log("sparse", step) for step in (1, 2, 3)]
    for profile, mode in (("cpu-1t", "record"), ("noisy", "replay")):
        model = init_module(lambda: nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)), seed=3)
        for p in model.parameters():
            rounding.round_(p.data, BITS)
        opt = OPTIMIZERS[name](list(model.parameters()))

        def closure(model: nn.Module = model, opt: torch.optim.Optimizer = opt) -> Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(model(rows), labels)
            loss.backward()
            return loss

        for step, log in enumerate(logs, start=1):
            rm = RoundingMode(
                bits=BITS, tau=0.25, mode=mode, profile=get_profile(profile), step=step, log=log
            )
            with StockOps(5, step, 0, torch.arange(ROWS), bits=BITS), rm:
                if name == "lbfgs":
                    opt.step(closure)  # type: ignore[arg-type]
                else:
                    closure()
                    opt.step()
            if mode == "replay":
                rm.finish()
        finals.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*finals, strict=True))
    assert not torch.equal(finals[0][0], init_module(lambda: nn.Linear(16, 8), seed=3).weight)


def test_whatStillCannotRun_stopsAtItsFirstCall_namingItself() -> None:
    """The battery's refusals: a product's gradient where ATen is called directly (torch computes
    it otherwise under a Python mode; ``torch.cumprod`` is served, ``torch.ops.aten.cumprod`` no
    function mode sees) and a draw made so (``torch.ops.aten.poisson``); each named, in the step,
    before any value is wrong."""
    _, rows, _ = _inputs()
    for run, op in (
        (lambda v: torch.ops.aten.cumprod.default(v[:, :4], 1), "cumprod"),
        (lambda v: v * torch.ops.aten.poisson.default(torch.ones_like(v)), "poisson"),
    ):

        def step(run: Callable[[Tensor], Tensor] = run) -> list[Tensor]:
            v = rows.clone().requires_grad_()
            out = run(v)
            _backward(out)
            return [out]

        with pytest.raises(UnsupportedOpError, match=op):
            _twice(step)
