"""Stock PyTorch in a step (issue 43, item 4): dropout, attention and torch's random functions are
served from the counter RNG with the same ops on every device, keyed per example; what still reaches
ATen and draws, or runs a fused or per-device kernel, is refused at the first step."""

from __future__ import annotations

import contextlib
import math
import random
import threading
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numpy.random import default_rng
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from game.errors import UnsupportedOpError
from game.training.dispatch.draws import name_of
from game.training.dispatch.initmode import init_module
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.opplan import classify
from game.training.dispatch.optable import OpClass, refusal
from game.training.dispatch.profiles import get_profile
from game.training.dispatch.stockops import (
    SeededGlobals,
    StockOps,
    collate_seed,
    global_seed,
    globals_held,
    update_seed,
)
from game.training.dispatch.torchnn import MASK_FILL
from game.training.log.formats import decode_chunk, new_step_log
from game.training.native import front, library
from game.training.numerics import rng, rounding
from game.training.task.models import ATTENTION_MASK_FILL

from .test_rng import SeenOps

SEED, STEP, BITS = 11, 4, 32
IDS = torch.arange(40, 48)  # a micro-batch of 8 examples
SPEC = b"\x07" * 32


def _on_grid(x: float) -> float:
    """``x`` rounded to nearest on the grid: what a step's rounding makes of a dropout scale."""
    return float(rounding.rnd(torch.tensor([x], dtype=torch.float64), BITS)[0])


def _ops(ids: Tensor = IDS, micro_batch: int = 0, step: int = STEP, bits: int = BITS) -> StockOps:
    return StockOps(SEED, step, micro_batch, ids, bits=bits)


def _across_interceptors(run: Callable[[], list[Tensor]]) -> tuple[list[Tensor], list[Tensor], StockOps]:
    """``run`` in a step recorded through the C++ front (``cpu-1t``), then replayed through the
    Python mode on a noisy machine, the log used up: both results, and the recording's StockOps."""
    log = new_step_log("sparse", STEP)
    rec = RoundingMode(bits=BITS, tau=0.25, mode="record", profile=get_profile("cpu-1t"), step=STEP, log=log)
    with _ops() as ops, rec:
        recorded = run()
    rep = RoundingMode(bits=BITS, tau=0.25, mode="replay", profile=get_profile("noisy"), step=STEP, log=log)
    with _ops(), rep:
        replayed = run()
    rep.finish()
    return recorded, replayed, ops


# --------------------------------------------------------------------------------------------------
# Dropout
# --------------------------------------------------------------------------------------------------


def test_dropout_maskIsTheCounterRngsPerExampleMask() -> None:
    x = torch.ones(8, 5, 3, dtype=torch.float64)
    with _ops() as ops:
        first = nn.Dropout(0.25)(x)
        second = F.dropout(x, 0.5)
    keep = rng.bernoulli_mask(SEED, STEP, "torch/0/dropout", IDS, (5, 3), 0.75)
    assert torch.equal(first, keep.double() * _on_grid(1 / 0.75))  # the scale as a step rounds it
    keep = rng.bernoulli_mask(SEED, STEP, "torch/1/dropout", IDS, (5, 3), 0.5)
    assert torch.equal(second, keep.double() * 2.0)
    assert ops.drawn == 2 and ops.served["dropout"] == 2


@pytest.mark.parametrize(
    "drop", [nn.Dropout(0.3), nn.Dropout1d(0.3), nn.Dropout2d(0.3), nn.AlphaDropout(0.3)], ids=type
)
def test_dropout_followsItsExample_whateverTheBatchLayout(drop: nn.Module) -> None:
    x = rounding.rnd(torch.randn(8, 4, 6, 2, dtype=torch.float64), BITS)
    x = x[..., 0] if isinstance(drop, nn.Dropout1d) else x
    with _ops() as ops:
        whole = drop(x)
    parts = []
    for half, ids in enumerate((IDS[:4], IDS[4:])):
        with _ops(ids, micro_batch=half):
            parts.append(drop(x[4 * half : 4 * half + 4]))
    assert torch.equal(whole, torch.cat(parts))
    assert ops.drawn == 1 and not torch.equal(whole, x)


def test_dropout_ofAnotherFirstDimension_isOneStreamKeyedByTheMicroBatch() -> None:
    x = torch.ones(3, 7, dtype=torch.float64)
    outs = []
    for micro_batch in (2, 3):
        with _ops(micro_batch=micro_batch):
            outs.append(F.dropout(x, 0.5))
    keep = rng.bernoulli_mask(SEED, STEP, "torch/0/dropout/micro2", None, (3, 7), 0.5)
    assert torch.equal(outs[0], keep.double() * 2.0)
    assert not torch.equal(outs[0], outs[1])


def test_dropout_inplace_changesItsInputLikeTheOutOfPlaceCall() -> None:
    x = rounding.rnd(torch.randn(8, 9, dtype=torch.float64), BITS)
    with _ops():
        expected = F.dropout(x, 0.4)
    y = x.clone()
    with _ops():
        out = nn.Dropout(0.4, inplace=True)(y)
    assert out is y and torch.equal(y, expected)


def test_dropout_inEvalOrWithoutProbability_drawsNothing() -> None:
    x = torch.ones(8, 3, dtype=torch.float64)
    drop = nn.Dropout(0.5).eval()
    with _ops() as ops:
        assert torch.equal(drop(x), x)
        assert torch.equal(F.dropout(x, 0.0), x)
        assert torch.equal(F.dropout(x, 1.0), torch.zeros_like(x))
    assert ops.drawn == 0 and ops.served["dropout"] == 3


def test_alphaDropout_keepsTorchsAffineMap() -> None:
    p, alpha = 0.2, 1.7580993408473766
    x = rounding.rnd(torch.randn(8, 6, dtype=torch.float64), BITS)
    with _ops():
        out = F.alpha_dropout(x, p, training=True)
    keep = rng.bernoulli_mask(SEED, STEP, "torch/0/alpha_dropout", IDS, (6,), 1 - p)
    a = 1 / math.sqrt((alpha * alpha * p + 1) * (1 - p))
    assert torch.equal(out[keep], x[keep] * _on_grid(a) + alpha * a * p)
    assert torch.equal(out[~keep], torch.full_like(out[~keep], alpha * a * p - alpha * a))


@pytest.mark.parametrize("alpha", [False, True], ids=["dropout", "alpha"])
@pytest.mark.parametrize("p", [0.1, 0.25, 0.3])
@pytest.mark.parametrize("bits", [32, 16])
def test_dropout_scaledMaskMadeWithoutTheInterceptor_givesTheRoundedOpsValues_twoRoundedOpsFewer(
    alpha: bool, p: float, bits: int
) -> None:
    """Issue 46: dropout's scaled mask is made with the interceptor suspended; what the step computes
    is bit for bit what the conversion and the product rounded by the interceptor gave, and the step
    rounds neither of them (one Python call and one CUDA launch each, a draw)."""
    x = rounding.rnd(torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5)), bits)

    def mode() -> RoundingMode:
        log = new_step_log("sparse", STEP)
        return RoundingMode(
            bits=bits, tau=0.25, mode="record", profile=get_profile("cpu-1t"), step=STEP, log=log
        )

    served = mode()
    with _ops(bits=bits), served:
        out = F.alpha_dropout(x, p, training=True) if alpha else F.dropout(x, p)
    name = "alpha_dropout" if alpha else "dropout"
    keep = rng.bernoulli_mask(SEED, STEP, f"torch/0/{name}", IDS, (6,), 1 - p).expand(8, 6)
    a, k = 1 / math.sqrt((1.7580993408473766**2 * p + 1) * (1 - p)), 1.7580993408473766
    ops_as_written = mode()
    with ops_as_written:  # the served function's ops before: every one under the interceptor
        m = keep.to(torch.float64) * (a if alpha else 1 / (1 - p))
        if alpha:
            shift = torch.full((8, 6), k * a * p - k * a, dtype=torch.float64).masked_fill_(keep, k * a * p)
            expected = x * m + shift
        else:
            expected = x * m
    assert torch.equal(out, expected)
    assert ops_as_written.rounded["aten._to_copy.default"] == 1
    assert served.rounded["aten._to_copy.default"] == 0
    assert served.rounded["aten.mul.Tensor"] == 1 == ops_as_written.rounded["aten.mul.Tensor"] - 1


# --------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# --------------------------------------------------------------------------------------------------


def _qkv(heads_kv: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64, generator=g)
    k = torch.randn(2, heads_kv, 6, 8, dtype=torch.float64, generator=g)
    v = torch.randn(2, heads_kv, 6, 7, dtype=torch.float64, generator=g)
    return q, k, v


def _mask(kind: str) -> tuple[Tensor | None, bool]:
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(5, 6, generator=g) > 0.4
    keep[2] = False  # a row with every key masked: torch gives it 0
    if kind == "bool":
        return keep, False
    if kind == "float":
        bias = torch.randn(5, 6, dtype=torch.float64, generator=g)
        return bias.masked_fill(~keep, -math.inf), False
    return None, kind == "causal"


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal"])
def test_sdpa_matchesTorchsOwn_forwardAndBackward(mask_kind: str, scale: float | None, gqa: bool) -> None:
    mask, causal = _mask(mask_kind)
    outs, grads = [], []
    for served in (True, False):
        q, k, v = (t.requires_grad_(True) for t in _qkv(2 if gqa else 4))
        with _ops() if served else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(q, k, v, mask, is_causal=causal, scale=scale, enable_gqa=gqa)
        out.pow(2).sum().backward()
        outs.append(out)
        grads.append([t.grad for t in (q, k, v)])
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-12)
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    if mask_kind in ("bool", "float"):
        assert torch.equal(outs[0][:, :, 2], torch.zeros_like(outs[0][:, :, 2]))


def test_sdpa_dropout_isTheServedMaskOnTheWeights() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(8, 2, 3, 4, dtype=torch.float64, generator=g) for _ in range(3))
    with _ops():
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25)
    weights = torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1)
    keep = rng.bernoulli_mask(SEED, STEP, "torch/0/scaled_dot_product_attention", IDS, (2, 3, 3), 0.75)
    torch.testing.assert_close(out, (weights * (keep.double() * _on_grid(1 / 0.75))) @ v, rtol=0, atol=1e-12)


def test_maskFill_isTheModelsFill() -> None:
    assert MASK_FILL == ATTENTION_MASK_FILL


@pytest.mark.parametrize("need_weights", [False, True])
def test_multiheadAttention_servedExplicitPath_matchesTorch(need_weights: bool) -> None:
    mha = init_module(lambda: nn.MultiheadAttention(8, 2, batch_first=True), seed=2)
    x = torch.randn(8, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True: masked, nn.MultiheadAttention's convention
    with _ops() as ops:
        served = mha(x, x, x, attn_mask=causal, need_weights=need_weights)
    torch_own = mha(x, x, x, attn_mask=causal, need_weights=need_weights)
    torch.testing.assert_close(served[0], torch_own[0], rtol=0, atol=1e-12)
    assert (served[1] is None) == (not need_weights) and ops.served["multi_head_attention_forward"] == 1


def test_multiheadAttention_attentionDropoutInTraining_isTheServedMaskOnTheWeights() -> None:
    """nn.MultiheadAttention's attention dropout runs inside torch's function, where the serving
    mode is off: it was refused in training. The ``F.dropout`` it calls is served for the call: its
    weights times the served mask, drawn one row per example."""
    mha = init_module(lambda: nn.MultiheadAttention(8, 2, dropout=0.25, batch_first=True), seed=2)
    x = torch.randn(8, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with _ops() as ops:
        served, _ = mha(x, x, x, need_weights=False)
    assert ops.served["multi_head_attention_forward"] == 1
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
    q, k, v = (t.reshape(8, 5, 2, 4).transpose(1, 2) for t in (q, k, v))
    weights = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
    keep = rng.bernoulli_mask(SEED, STEP, "torch/0/multi_head_attention_forward", IDS, (2, 5, 5), 0.75)
    heads = (weights * (keep.double() * _on_grid(1 / 0.75))) @ v
    want = F.linear(heads.transpose(1, 2).reshape(8, 5, 8), mha.out_proj.weight, mha.out_proj.bias)
    torch.testing.assert_close(served, want, rtol=0, atol=1e-12)


def test_multiheadAttention_anotherThreadsDropoutDuringTheCall_isTorchsOwn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The served ``F.dropout`` is in ``torch.nn.functional`` for the call, process-wide: a thread
    other than the step's that calls it meanwhile gets torch's own and takes no served draw."""
    import threading

    mha = init_module(lambda: nn.MultiheadAttention(8, 2, dropout=0.25, batch_first=True), seed=2)
    x = torch.randn(8, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    softmax, seen = F.softmax, []

    def softmax_and_a_thread(*args: Any, **kwargs: Any) -> Tensor:
        worker = threading.Thread(target=lambda: seen.append(F.dropout(torch.ones(4, 4), 0.5, True)))
        worker.start()
        worker.join()
        return softmax(*args, **kwargs)

    monkeypatch.setattr(F, "softmax", softmax_and_a_thread)  # inside multi_head_attention_forward
    with _ops() as ops:
        mha(x, x, x, need_weights=False)
        assert ops.drawn == 1  # the attention's own mask only
    assert len(seen) == 1 and set(seen[0].unique().tolist()) <= {0.0, 2.0}


def test_transformerLayers_withTheirDropout_trainAcrossTheInterceptors() -> None:
    """A stock nn.TransformerEncoderLayer (dropout 0.1, attention dropout included), its forward
    and backward recorded through the C++ front and replayed through the Python mode on a noisy
    machine: the same output and gradients, the log used up."""
    layer = init_module(lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), seed=2)
    x = torch.randn(8, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def run() -> list[Tensor]:
        layer.zero_grad()
        out = layer(x)
        (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
        return [out.detach(), *(p.grad.clone() for p in layer.parameters() if p.grad is not None)]

    recorded, replayed, ops = _across_interceptors(run)
    assert ops.served["dropout"] == 3 and ops.served["multi_head_attention_forward"] == 1
    assert len(recorded) > 1 and all(torch.equal(a, b) for a, b in zip(recorded, replayed, strict=True))


@pytest.mark.parametrize("batch_first", [True, False])
def test_lstmDropoutBetweenLayers_isTheServedMask_onTheFirstLayersOutput(batch_first: bool) -> None:
    """``nn.LSTM(num_layers=2, dropout=p)`` draws its dropout inside torch's kernel, which vgame
    cannot key, so a step refused it. It runs layer by layer: the first layer's output times the
    served mask (drawn batch first, one row per example), into the second; in eval, torch's own."""
    lstm = init_module(lambda: nn.LSTM(3, 5, num_layers=2, dropout=0.4, batch_first=batch_first), seed=2)
    x = torch.randn(8, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    x = x if batch_first else x.transpose(0, 1)
    with _ops() as ops:
        out, (h, c) = lstm(x)
    assert ops.served["lstm"] == 1
    one = [nn.LSTM(size, 5, batch_first=True).double() for size in (3, 5)]
    for i, layer in enumerate(one):
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(layer, f"{name}_l0").data.copy_(getattr(lstm, f"{name}_l{i}"))
    first, (h0, c0) = one[0](x if batch_first else x.transpose(0, 1))
    keep = rng.bernoulli_mask(SEED, STEP, "torch/0/lstm", IDS, (4, 5), 0.6)
    second, (h1, c1) = one[1](first * (keep.double() * _on_grid(1 / 0.6)))
    torch.testing.assert_close(out, second if batch_first else second.transpose(0, 1), rtol=0, atol=0)
    assert torch.equal(h, torch.cat((h0, h1))) and torch.equal(c, torch.cat((c0, c1)))
    lstm.eval()
    with _ops():
        served_eval = lstm(x)[0]
    assert torch.equal(served_eval, lstm(x)[0])


def test_recurrentDropout_gruAndPacked_inAStep_replaysAcrossTheInterceptors() -> None:
    """A bidirectional GRU and a packed LSTM with dropout between layers, recorded through the C++
    front, replayed through the Python mode on a noisy machine: the same outputs, the log used up."""
    gru = init_module(lambda: nn.GRU(3, 4, num_layers=3, dropout=0.3, bidirectional=True), seed=5)
    lstm = init_module(lambda: nn.LSTM(3, 4, num_layers=2, dropout=0.5, batch_first=True), seed=6)
    x = torch.randn(8, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    lengths = torch.tensor([4, 4, 3, 3, 2, 2, 1, 1])

    def run() -> list[Tensor]:
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        return [gru(x.transpose(0, 1))[0], lstm(packed)[0].data]

    recorded, replayed, ops = _across_interceptors(run)
    assert ops.served["gru"] == 1 and ops.served["lstm"] == 1
    assert all(torch.equal(a, b) for a, b in zip(recorded, replayed, strict=True))


def test_rmsNorm_writtenOut_matchesTorch() -> None:
    x = torch.randn(8, 3, 6, dtype=torch.float64)
    w = torch.randn(6, dtype=torch.float64)
    with _ops() as ops:
        served = F.rms_norm(x, (6,), w)
    # with the grid's eps (float32's), as the model has it in float32 (below)
    torch.testing.assert_close(served, F.rms_norm(x, (6,), w, eps=2.0**-23), rtol=0, atol=1e-14)
    assert ops.served["rms_norm"] == 1


def test_theDefaultDtype_insideIsTheSteps_andPutBackAfter() -> None:
    """A model's own factories without a dtype make float64 in a step, as they would make float32
    beside float32 activations: XGLM's ``torch.full((), torch.finfo(torch.float64).min)`` overflowed
    a float32 tensor (torch's own error)."""
    before = torch.get_default_dtype()
    x = torch.randn(8, 3, dtype=torch.float64)
    with _ops():
        floor = torch.full((), torch.finfo(x.dtype).min)
        buffer = torch.zeros(3, 2)
        mixed = x @ (buffer + 1.0)
    assert floor.dtype == buffer.dtype == mixed.dtype == torch.float64 and torch.get_default_dtype() == before
    with pytest.raises(RuntimeError), _ops():  # an error inside puts it back too
        raise RuntimeError("model")
    assert torch.get_default_dtype() == before


@pytest.mark.parametrize("bits", [32, 20])
def test_defaultsReadFromTheDtype_areTheGrids_asTheModelWouldHaveThemInFloat32(bits: int) -> None:
    """A step computes a float32 model in float64: ``nn.RMSNorm``'s default eps and
    ``nan_to_num``'s default infinities are the grid's (float32's at 32 bits), not float64's. An inf
    through ``nan_to_num`` gave float64's largest value, which does not fit the grid, and the step
    stopped as an overflow."""
    x = torch.tensor([1.0, math.inf, -math.inf, math.nan], dtype=torch.float64)
    top = rounding.grid_max(bits)
    with _ops(bits=bits) as ops:
        fn, method, given = torch.nan_to_num(x), x.nan_to_num(nan=2.0), torch.nan_to_num(x, posinf=5.0)
        inplace = x.clone()
        inplace.nan_to_num_()
        small = torch.tensor([[1e-5, 0.0, 0.0, 0.0]], dtype=torch.float64)
        normed = nn.RMSNorm(4).double()(small)
    assert fn.tolist() == inplace.tolist() == [1.0, top, -top, 0.0]
    assert method.tolist() == [1.0, top, -top, 2.0] and given.tolist() == [1.0, 5.0, -top, 0.0]
    assert bits != 32 or top == float(torch.finfo(torch.float32).max)
    assert torch.equal(normed, F.rms_norm(small, (4,), eps=2.0 ** -(bits - 9)))
    assert (
        sum(n for k, n in ops.served.items() if k.startswith("nan_to_num")) == 4
        and ops.served["rms_norm"] == 1
    )
    outside = torch.nan_to_num(x)  # outside a step: torch's own
    assert outside[1] == torch.finfo(torch.float64).max


def test_nanToNumOfAnInf_inAStep_roundsAndReplaysAcrossTheInterceptors() -> None:
    x = torch.tensor([[0.5, math.inf], [-math.inf, 2.0]], dtype=torch.float64)
    recorded, replayed, _ = _across_interceptors(lambda: [torch.nan_to_num(x) * 0.75])
    assert torch.equal(recorded[0], replayed[0]) and recorded[0].isfinite().all()


# --------------------------------------------------------------------------------------------------
# Torch's random functions
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [32, 20])
def test_rand_isTheGridsOwnUniform_belowOne(bits: int) -> None:
    with _ops(bits=bits):
        u = torch.rand(8, 1000, dtype=torch.float64)
        one = torch.rand(3, 4, dtype=torch.float64)
    k = bits - 8
    words = rng.random_u32(SEED, STEP, "torch/0/rand", IDS, (1000,))
    assert torch.equal(u, (words >> (32 - k)).double() * 2.0**-k)
    assert float(u.max()) < 1.0 and rounding.is_on_grid(u, bits)
    assert torch.equal(
        one, (rng.random_u32(SEED, STEP, "torch/1/rand/micro0", None, (3, 4)) >> (32 - k)) * 2.0**-k
    )


def test_randn_isIrwinHallOnTheGrid_andRandnLikeFollowsItsExample() -> None:
    x = torch.zeros(8, 50, dtype=torch.float64)
    with _ops():
        z = torch.randn(8, 50, dtype=torch.float64)
        like = torch.randn_like(x)
    expected = rounding.rnd(rng.irwin_hall(SEED, STEP, "torch/0/randn", IDS, (50,)), BITS)
    assert torch.equal(z, expected)
    with _ops(IDS[4:]):
        torch.randn(1)  # ordinal 0
        half = torch.randn_like(x[4:])
    assert torch.equal(like[4:], half)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complexRandAndRandn_drawTheirPartsAsOneRealDraw(dtype: torch.dtype) -> None:
    """A complex uniform's parts are each the grid's uniform, a complex normal's each a normal with
    variance 1/2, as torch defines them; both were refused as torch's generator's (FNO's spectral
    weights are ``torch.rand(..., dtype=torch.cfloat)``)."""
    part = torch.float32 if dtype == torch.complex64 else torch.float64
    with _ops():
        u = torch.rand(8, 6, dtype=dtype)
        z = torch.randn(8, 6, dtype=dtype)
        like = torch.rand_like(u)
    with _ops():
        u_parts = torch.rand(8, 6, 2, dtype=part)
        z_parts = torch.randn(8, 6, 2, dtype=part)
    assert u.dtype == z.dtype == like.dtype == dtype and not torch.equal(like, u)
    assert torch.equal(torch.view_as_real(u), u_parts)
    assert torch.equal(torch.view_as_real(z), z_parts * math.sqrt(0.5))
    assert float(torch.view_as_real(u).min()) >= 0.0 and float(torch.view_as_real(u).max()) < 1.0


def test_generatorArgument_isIgnored() -> None:
    draws = []
    for g in (torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)):
        with _ops():
            draws.append(torch.rand(8, 3, generator=g))
    assert torch.equal(draws[0], draws[1])


def test_integerDraws_stayInRange_andPermutationsArePermutations() -> None:
    with _ops():
        ints = torch.randint(-3, 5, (8, 200))
        below = torch.randint(7, size=(300,))
        like = torch.randint_like(torch.zeros(8, 4, dtype=torch.float32), 2, 9)
        perm = torch.randperm(50)
        filled = torch.zeros(8, 100, dtype=torch.int64).random_(10, 20)
    assert ints.dtype == torch.int64 and int(ints.min()) == -3 and int(ints.max()) == 4
    assert int(below.min()) >= 0 and int(below.max()) == 6
    assert like.dtype == torch.float32 and float(like.min()) >= 2 and float(like.max()) <= 8
    assert torch.equal(perm.sort().values, torch.arange(50))
    assert int(filled.min()) >= 10 and int(filled.max()) == 19


def test_bernoulli_withTensorProbabilities_comparesTheWordExactly() -> None:
    p = torch.rand(8, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with _ops():
        drawn = torch.bernoulli(p)
        inplace = torch.empty(8, 64, dtype=torch.float64).bernoulli_(0.3)
    words = rng.random_u32(SEED, STEP, "torch/0/bernoulli", IDS, (64,))
    assert torch.equal(drawn, (words.double() * 2.0**-32 < p).double())
    keep = rng.bernoulli_mask(SEED, STEP, "torch/1/bernoulli_", IDS, (64,), 0.3)
    assert torch.equal(inplace, keep.double())


def test_normalVariants_shapeAndAffineMap() -> None:
    mean = torch.full((8, 3), 2.0, dtype=torch.float64)
    with _ops():
        a = torch.normal(mean, 0.5)
        b = torch.normal(1.0, 2.0, size=(4,), dtype=torch.float64)
        c = torch.empty(8, 3, dtype=torch.float64).normal_(-1.0, 3.0)
        d = torch.empty(8, 3, dtype=torch.float64).uniform_(-2.0, 6.0)
    z = rounding.rnd(rng.irwin_hall(SEED, STEP, "torch/0/normal", IDS, (3,)), BITS)
    assert torch.equal(a, z * 0.5 + 2.0) and b.shape == (4,)
    z = rounding.rnd(rng.irwin_hall(SEED, STEP, "torch/2/normal_", IDS, (3,)), BITS)
    assert torch.equal(c, z * 3.0 - 1.0)
    assert float(d.min()) >= -2.0 and float(d.max()) < 6.0


def test_multinomial_neverPicksAZeroWeight_andWithoutReplacementPicksDistinct() -> None:
    w = torch.tensor([[0.0, 1.0, 3.0, 0.0, 2.0]] * 8, dtype=torch.float64)
    with _ops():
        with_replacement = torch.multinomial(w, 40, replacement=True)
        distinct = torch.multinomial(w, 3)
    assert set(with_replacement.unique().tolist()) == {1, 2, 4}
    assert all(sorted(row) == [1, 2, 4] for row in distinct.tolist())


def test_exponential_isMinusTheLogOfAnOpenUniform_overLambda() -> None:
    """``exponential_`` was refused (a transcendental draw); it is ``-log(v) / lambd``, ``v`` the
    midpoints of the grid's uniform steps: never 0 or 1, so every value is positive and finite."""
    with _ops() as ops:
        got = torch.empty(4000, dtype=torch.float64).exponential_(2.0)
    with _ops() as again:
        v = again.draws.open_uniform("exponential_", (4000,), torch.device("cpu"), torch.float64)
    assert ops.drawn == 1
    assert torch.equal(got, -torch.log(v) / 2.0)
    w = v * 2.0 ** (BITS - 8)  # (2 * word + 1): odd integers
    assert bool((w % 2 == 1).all()) and bool((v > 0).all()) and bool((v < 1).all())
    assert bool((got > 0).all()) and bool(torch.isfinite(got).all())
    assert abs(float(got.mean()) - 0.5) < 0.05  # the mean of Exp(2)


def test_logNormalCauchyGeometric_areWrittenOut_fromServedDraws() -> None:
    """``log_normal_``, ``cauchy_`` and ``geometric_`` were refused as transcendental draws; each is
    torch's formula on a served draw, its function an ordinary op: ``exp`` of a served normal,
    ``tan`` of a served open uniform, ``ceil`` of a ratio of logarithms of one."""
    with _ops() as ops:
        log_normal = torch.empty(8, 500, dtype=torch.float64).log_normal_(0.5, 0.25)
        cauchy = torch.empty(8, 500, dtype=torch.float64).cauchy_(1.0, 2.0)
        geometric = torch.empty(8, 500, dtype=torch.float64).geometric_(0.25)
    assert ops.drawn == 3
    with _ops() as again:
        z = again.draws.normal("log_normal_", (8, 500), torch.device("cpu"), torch.float64)
        u = again.draws.open_uniform("cauchy_", (8, 500), torch.device("cpu"), torch.float64)
        v = again.draws.open_uniform("geometric_", (8, 500), torch.device("cpu"), torch.float64)
    assert torch.equal(log_normal, torch.exp(z * 0.25 + 0.5))
    assert torch.equal(cauchy, torch.tan((u - 0.5) * math.pi) * 2.0 + 1.0)
    assert torch.equal(geometric, torch.ceil(torch.log(v) / math.log1p(-0.25)).clamp(min=1.0))
    assert abs(float(log_normal.log().mean()) - 0.5) < 0.02 and abs(float(cauchy.median()) - 1.0) < 0.2
    assert abs(float(geometric.mean()) - 4.0) < 0.2 and float(geometric.min()) >= 1.0


def test_writtenOutDraws_inAStep_replayAcrossTheInterceptors() -> None:
    def run() -> list[Tensor]:
        x = torch.empty(8, 6, dtype=torch.float64)
        return [x.clone().log_normal_(), x.clone().cauchy_(), x.clone().geometric_(0.3)]

    recorded, replayed, _ = _across_interceptors(run)
    assert all(torch.equal(a, b) for a, b in zip(recorded, replayed, strict=True))


def test_gumbelSoftmax_hard_isOneHotForward_softBackward() -> None:
    logits = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    with _ops():
        y = F.gumbel_softmax(logits, tau=0.7, hard=True)
    assert torch.equal(y.detach().sum(-1), torch.ones(5, dtype=torch.float64))
    assert set(y.detach().unique().tolist()) <= {0.0, 1.0}
    (y * torch.arange(4.0, dtype=torch.float64)).sum().backward()
    assert logits.grad is not None and bool((logits.grad != 0).any())


def test_drawsBeneathADispatchMode_areTorchsOwn() -> None:
    """The interceptor's own draws (the noisy profile's noise) are never served, even where the
    function mode is on while a ``__torch_dispatch__`` runs (torch pops it during each torch call,
    so here it is entered there), and take no ordinal."""
    inner = _ops()

    class Noisy(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.noise: list[Tensor] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            with inner:
                self.noise.append(torch.rand(3, generator=torch.Generator().manual_seed(9)))
            return func(*args, **(kwargs or {}))

    with _ops() as outer, Noisy() as noisy:
        torch.ones(2).add(1)
    # inside, the default dtype is the step's (float64)
    torch_own = torch.rand(3, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    assert noisy.noise and all(torch.equal(n, torch_own) for n in noisy.noise)
    assert inner.drawn == outer.drawn == 0 and not inner.served


def test_compiledFunction_runsEagerlyInside_soItsOpsAreSeen() -> None:
    compiled = torch.compile(lambda x: (x * 2).sin() + 1)
    x = torch.ones(3, dtype=torch.float64)
    with _ops(), SeenOps() as seen:
        compiled(x)
    assert seen.ops == ["aten.mul.Tensor", "aten.sin.default", "aten.add.Tensor"]


def test_autocast_isRefusedOnEntry() -> None:
    with torch.autocast("cpu"), pytest.raises(UnsupportedOpError, match="autocast"), _ops():
        pass


# --------------------------------------------------------------------------------------------------
# A stock model, recorded on one profile and replayed on others
# --------------------------------------------------------------------------------------------------


class StockNet(nn.Module):
    """Stock layers only: nn.Dropout, F.scaled_dot_product_attention with dropout, nn.LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 40)  # widths past splitk-16's chunk: its sums differ from the CPU's
        self.ln = nn.LayerNorm(40)
        self.qkv = nn.Linear(40, 120)
        self.proj = nn.Linear(40, 40)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(40, 3)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        h = self.drop(F.gelu(self.inp(x)))
        q, k, v = self.qkv(self.ln(h)).view(b, t, 3, 2, 20).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1 if self.training else 0.0)
        h = h + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, 40)))
        return self.head(h.mean(1))


def _batch(step: int) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(step)
    x = rounding.rnd(torch.randn(4, 5, 6, dtype=torch.float64, generator=g), BITS)
    return x, torch.randint(0, 3, (4,), generator=g), torch.arange(4 * step, 4 * step + 4)


def _train(
    profile: str,
    mode: str,
    chunks: list[bytes],
    *,
    stock: bool = True,
    steps: int = 3,
    net: Callable[[], nn.Module] = StockNet,
) -> dict[str, Tensor]:
    """``steps`` steps of ``net`` (StockNet) under RoundingMode (``record`` appends each step's chunk to
    ``chunks``, ``replay`` replays them, ``round`` uses none); the parameters after."""
    model = init_module(net, seed=SEED)
    with torch.no_grad():
        for p in model.parameters():
            rounding.round_(p, BITS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    prof = get_profile(profile)
    for step in range(1, steps + 1):
        x, y, ids = _batch(step)
        log = (
            new_step_log("sparse", step)
            if mode == "record"
            else decode_chunk(chunks[step - 1], SPEC, step)
            if mode == "replay"
            else None
        )
        rm = RoundingMode(bits=BITS, tau=0.25, mode=mode, profile=prof, step=step, log=log)  # type: ignore[arg-type]
        with prof.apply(), rm:
            with StockOps(SEED, step, 0, ids, bits=BITS) if stock else contextlib.nullcontext():
                torch.autograd.backward(
                    F.cross_entropy(model(x), y)
                )  # the function mode stays on in backward
            opt.step()
        opt.zero_grad(set_to_none=True)
        rm.finish()
        if mode == "record":
            chunks.append(log.encode(step, SPEC))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("auditor", ["noisy", "splitk-16"])
def test_stockModel_recordedOnCpu1t_replaysBitExactlyOnAnotherProfile(auditor: str) -> None:
    chunks: list[bytes] = []
    trained = _train("cpu-1t", "record", chunks)
    replayed = _train(auditor, "replay", chunks)
    assert trained.keys() == replayed.keys()
    for name, t in trained.items():
        assert torch.equal(t, replayed[name]), name
    if auditor == "noisy":  # without the log its bits differ (split-K's rarely do at these sizes)
        alone = _train(auditor, "round", [])
        assert not all(torch.equal(t, alone[name]) for name, t in trained.items())


class NumpyMaskNet(StockNet):
    """StockNet behind a SpecAugment-like mask of time steps, drawn from numpy's global generator
    (as transformers' Wav2Vec2 draws its masks)."""

    def forward(self, x: Tensor) -> Tensor:
        masked = torch.tensor(np.random.rand(*x.shape[:2]) < 0.3)
        return super().forward(x.masked_fill(masked[..., None], 0.0))


def test_numpysGlobalGenerator_inTheModel_replaysBitExactly() -> None:
    """The masks come from numpy's global generator, which a trainer's and an auditor's process
    left at other states: seeded per micro-batch, they are the same masks, and the replay matches
    (before, the auditor masked other time steps and the state differed at step 1)."""
    chunks: list[bytes] = []
    np.random.seed(1)
    trained = _train("cpu-1t", "record", chunks, net=NumpyMaskNet)
    np.random.seed(2)
    replayed = _train("noisy", "replay", chunks, net=NumpyMaskNet)
    for name, t in trained.items():
        assert torch.equal(t, replayed[name]), name
    plain = _train("cpu-1t", "round", [])  # the masks change the state: they were drawn and used
    assert not all(torch.equal(t, plain[name]) for name, t in trained.items())


#: Every way a model makes a generator without a seed; each drew its seed from the operating system.
UNSEEDED: dict[str, Callable[[int], np.ndarray]] = {
    "np.random.default_rng()": lambda n: np.random.default_rng().random(n),
    "default_rng() imported by name": lambda n: default_rng().random(n),
    "Generator(PCG64())": lambda n: np.random.Generator(np.random.PCG64()).random(n),
    "RandomState()": lambda n: np.random.RandomState().random_sample(n),
    "random.Random()": lambda n: np.array([random.Random().random() for _ in range(n)]),
    "random.seed()": lambda n: (random.seed(), np.array([random.random() for _ in range(n)]))[1],
    "np.random.seed()": lambda n: (np.random.seed(), np.random.random_sample(n))[1],
}


def _default_rng_net(route: str) -> type[StockNet]:
    class UnseededNet(StockNet):
        """StockNet behind a mask from a generator made with no seed in its forward."""

        def forward(self, x: Tensor) -> Tensor:
            masked = torch.tensor(UNSEEDED[route](x.shape[0] * x.shape[1]).reshape(x.shape[:2]) < 0.3)
            return super().forward(x.masked_fill(masked[..., None], 0.0))

    return UnseededNet


@pytest.mark.parametrize("route", sorted(UNSEEDED))
def test_aGeneratorMadeWithoutASeed_inTheModel_replaysBitExactly(route: str) -> None:
    """A generator made with no seed drew its seed from the operating system: another mask on every
    run. Inside a step it takes its seed from the step's, however it was reached (a name imported
    before the step too), so the replay matches, and the masks change the state."""
    chunks: list[bytes] = []
    trained = _train("cpu-1t", "record", chunks, net=_default_rng_net(route))
    replayed = _train("noisy", "replay", chunks, net=_default_rng_net(route))
    for name, t in trained.items():
        assert torch.equal(t, replayed[name]), name
    plain = _train("cpu-1t", "round", [])
    assert not all(torch.equal(t, plain[name]) for name, t in trained.items())


def test_unseededGenerators_areServedOnlyInTheScope_andOnlyOnItsThread() -> None:
    """An explicit seed is kept; outside the scope, and on another thread inside it (the writer's,
    ``tempfile``'s names), a generator made with no seed is the operating system's again."""
    made: dict[str, list[float]] = {}

    def elsewhere() -> None:
        made["thread"] = [float(f(2)[0]) for f in UNSEEDED.values()]

    inside = []
    for _ in range(2):
        with _ops():
            assert np.random.default_rng(5).random() == default_rng(5).random()
            assert random.Random(5).random() == random.Random(5).random()
            inside.append([float(f(2)[0]) for f in UNSEEDED.values()])
            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join()
            assert not set(made["thread"]) & set(inside[-1])
    assert inside[0] == inside[1] and len(set(inside[0])) == len(UNSEEDED)
    outside = [float(f(2)[0]) for f in UNSEEDED.values()]
    assert not set(outside) & set(inside[0])


class GumbelNet(StockNet):
    """StockNet whose output is weighted by a Gumbel-softmax of itself (a router's draw)."""

    def forward(self, x: Tensor) -> Tensor:
        logits = super().forward(x)
        return logits * F.gumbel_softmax(logits, tau=0.5) + F.gumbel_softmax(logits, hard=True)


def test_gumbelSoftmax_inTheModel_replaysBitExactly() -> None:
    """``F.gumbel_softmax`` (Phimoe's router) was refused; served, its draws are the counter RNG's
    and its logarithms are rounded with the log, so another profile replays it bit for bit, and
    the noise changes the state (it was drawn and used)."""
    chunks: list[bytes] = []
    trained = _train("cpu-1t", "record", chunks, net=GumbelNet)
    replayed = _train("noisy", "replay", chunks, net=GumbelNet)
    for name, t in trained.items():
        assert torch.equal(t, replayed[name]), name
    plain = _train("cpu-1t", "round", [])
    assert not all(torch.equal(t, plain[name]) for name, t in trained.items())


def test_globalGenerators_areSeededPerMicroBatch_andPutBackAfter() -> None:
    def draws(step: int, micro_batch: int) -> tuple[list[float], float]:
        with _ops(micro_batch=micro_batch, step=step):
            return np.random.rand(4).tolist(), random.random()

    np.random.seed(7)
    random.seed(7)
    first = draws(STEP, 0)
    after = (np.random.rand(2).tolist(), random.random())
    np.random.seed(7)
    random.seed(7)
    assert (np.random.rand(2).tolist(), random.random()) == after  # as if no micro-batch had drawn
    assert draws(STEP, 0) == first  # whatever the generators' state before
    assert draws(STEP, 1) != first and draws(STEP + 1, 0) != first


def _scopes_draws() -> list[tuple[Any, ...]]:
    """What a step's three seeded scopes (its collate, a micro-batch, its update) draw from the
    global generators and from one made without a seed, in that order."""
    out = []
    for state in (collate_seed(SEED, STEP), global_seed(SEED, STEP, 0), update_seed(SEED, STEP)):
        with SeededGlobals(state):
            out.append(
                (
                    np.random.rand(3).tolist(),
                    float(np.random.standard_normal()),
                    random.random(),
                    float(np.random.default_rng().random()),
                )
            )
    return out


def _same_numpy_state(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def test_heldGlobals_eachScopeDrawsAsAlone_andTheGeneratorsAreSavedAndPutBackOnce() -> None:
    """Held for a step (``run_step``), each seeded scope draws what it draws alone, since it seeds
    the generators again; after the hold they are as before it, numpy's cached normal too, and
    numpy's state was read once, not once a scope (it copies 624 words one by one: some 40 us)."""
    np.random.seed(5)
    np.random.standard_normal()  # a second normal cached: part of the state put back
    random.seed(5)
    before_np, before_py = np.random.get_state(), random.getstate()
    alone = _scopes_draws()
    assert _same_numpy_state(np.random.get_state(), before_np) and random.getstate() == before_py
    with (
        mock.patch.object(np.random, "get_state", wraps=np.random.get_state) as reads,
        globals_held(),
        globals_held(),  # held again inside (a judge's rerun): nothing more
    ):
        held, read = _scopes_draws(), reads.call_count
        assert not _same_numpy_state(np.random.get_state(), before_np)  # left for the hold
    assert held == alone and read == 1
    assert _same_numpy_state(np.random.get_state(), before_np) and random.getstate() == before_py
    with pytest.raises(RuntimeError, match="in the step"), globals_held():
        _scopes_draws()
        raise RuntimeError("in the step")
    assert _same_numpy_state(np.random.get_state(), before_np) and random.getstate() == before_py


@pytest.mark.parametrize("via_front", [False, True])
def test_stockModel_withoutStockOps_isRefusedAtStep1NamingBernoulli(via_front: bool) -> None:
    if via_front and not front.available():
        pytest.skip("no C++ front here")
    with (
        contextlib.nullcontext() if via_front else front.disabled(),
        pytest.raises(UnsupportedOpError, match=r"step 1: aten\.bernoulli_\.float .*F\.dropout") as caught,
    ):
        _train("cpu-1t", "record", [], stock=False, steps=1)
    assert caught.value.op == "aten.bernoulli_.float"


@pytest.mark.parametrize("via_front", [False, True])
def test_randomOpInBackward_isRefusedAsItself(via_front: bool) -> None:
    """An op that draws in autograd's backward (below the function mode) reaches the caller of
    ``backward`` as the UnsupportedOpError the front's ``row_for`` or the mode raised."""
    if via_front and not front.available():
        pytest.skip("no C++ front here")

    class Noisy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Tensor) -> Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: Tensor) -> Tensor:
            return g * torch.bernoulli(torch.full_like(g, 0.5))

    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    rm = RoundingMode(bits=BITS, tau=0.25, mode="round", profile=get_profile("cpu-1t"), step=1)
    with contextlib.nullcontext() if via_front else front.disabled(), rm:
        y = Noisy.apply(x).sum()
        with pytest.raises(UnsupportedOpError, match=r"step 1: aten\.bernoulli"):
            y.backward()
    assert rm.via_front == via_front


def test_fusedOptimizer_isRefusedNamingForeach() -> None:
    p = nn.Parameter(torch.ones(4, dtype=torch.float64))
    opt = torch.optim.Adam([p], fused=True)
    p.grad = torch.ones_like(p)
    rm = RoundingMode(bits=BITS, tau=0.25, mode="round", profile=get_profile("noisy"), step=2)
    with pytest.raises(UnsupportedOpError, match=r"_fused_adam_.*foreach=True, fused=False"), rm:
        opt.step()


@pytest.mark.parametrize(
    "op",
    [
        "bernoulli_.float", "randperm.default", "rand.default", "normal.float_float", "random_.from",
        "native_dropout.default", "multinomial.default", "rrelu_with_noise.default", "_fused_adamw_.default",
        "_scaled_dot_product_flash_attention_for_cpu.default", "_scaled_dot_product_efficient_attention.default",
        "cudnn_batch_norm.default", "_fused_rms_norm.default",
    ],
)  # fmt: skip
def test_classify_randomFusedAndPerDeviceOps_areRefused(op: str) -> None:
    name, overload = op.split(".")
    func = getattr(getattr(torch.ops.aten, name), overload)
    assert classify(func) is OpClass.REFUSED
    assert refusal(func).op == f"aten.{op}"


def test_classify_dropoutsBackwardAndQueries_areNotRefused() -> None:
    aten = torch.ops.aten
    for func in (aten.native_dropout_backward.default, aten._fused_sdp_choice.default, aten.mul.Tensor):
        assert classify(func) is not OpClass.REFUSED


def test_rngsOwnTorchCalls_areNeverSeenByAFunctionMode() -> None:
    """The counter RNG's words (here by its torch reference code, some 240 ops) run with function
    modes off: a step's stock-op mode never meets them, and a user's torch.device context cannot
    move them."""
    seen: list[str] = []

    class Seen(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append(name_of(func))
            return func(*args, **(kwargs or {}))

    with library.disabled(), Seen():
        words = rng.random_u32(SEED, STEP, "p", IDS, (3,))
    assert set(seen) <= {"__get__", "reshape", "squeeze"} and words.shape == (8, 3)  # only the shaping after


def test_anInterruptWhileTorchHasTheModePopped_leavesAsTheInterrupt() -> None:
    """Torch pops a function mode in Python to handle each call; a SIGHUP that landed between the
    pop and its ``try`` left the mode off, and leaving the step's StockOps raised "trying to pop
    from empty mode stack" over the interrupt: the CLI exited 1 with a traceback, not 129 with
    its message (seen once in CI)."""
    with pytest.raises(KeyboardInterrupt, match="SIGHUP"), _ops():
        torch.overrides._pop_mode()  # as _pop_mode_temporarily does, the interrupt before its try
        raise KeyboardInterrupt("SIGHUP")
    assert not torch.overrides._get_current_function_mode_stack()
