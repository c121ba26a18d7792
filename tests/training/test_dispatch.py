"""The dispatch mode (RoundingMode): every op of a training step is classified, and every inexact float64 result is rounded.

The coverage check does not trust the interceptor's own bookkeeping: an observer mode entered *inside*
it sees every op's results after rounding and checks them against the grid and against the log.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from game.errors import ConfigError, NonFiniteError, RoundingLogError
from game.training.dispatch.mode import RoundingMode
from game.training.dispatch.opplan import classify, touched_tensors
from game.training.dispatch.optable import EXACT_OPS, MOVE_OPS, OpClass, base_name
from game.training.dispatch.profiles import get_profile
from game.training.dispatch.stockops import StockOps
from game.training.engine.step import StepEngine
from game.training.log.packed import StepLog
from game.training.log.sparse import SparseStepLog
from game.training.native import front
from game.training.numerics import rounding
from game.training.state.tensors import check_on_grid
from game.training.task.catalog import PRESET_NAMES
from game.training.task.config import TaskConfig

aten = torch.ops.aten
BITS = 32
TAU = 0.25

#: Factories whose output is uninitialised memory (it is overwritten before anyone reads it).
UNINITIALISED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}


def _must_log(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The test's own reading of the rule: not data movement, not IEEE-exact for these arguments."""
    name = base_name(func)
    if name in ("add", "sub", "rsub"):
        return kwargs.get("alpha", 1) != 1
    if name == "div":
        return not (isinstance(args[1], Tensor) and args[1].dim() > 0) or "rounding_mode" in kwargs
    return name not in MOVE_OPS | EXACT_OPS


class Observer(TorchDispatchMode):
    """Sees each op after the RoundingMode handled it (it is entered inside, so it runs first and
    calls through to the rounding mode): records the float64 tensors every op produced or mutated."""

    def __init__(self) -> None:
        super().__init__()
        self.must_log: Counter[str] = Counter()  # op name -> float64 tensors that need a log record
        self.off_grid: list[str] = []
        self.names: set[str] = set()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        self.names.add(name)
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
        for t in touched_tensors(func, args, kwargs, out):
            if t.dtype != torch.float64 or view or base_name(func) in UNINITIALISED:
                continue
            if _must_log(func, args, kwargs):
                self.must_log[name] += 1
            with _disable_current_modes(), front.suspended():  # the check's own ops are not the step's
                on_grid = rounding.is_on_grid(t.detach(), BITS)
            if not on_grid:
                self.off_grid.append(name)
        return out


class TinyNet(nn.Module):
    """conv -> BN -> relu -> tokens -> LN -> explicit attention + residual -> GELU MLP -> mean -> head."""

    def __init__(self) -> None:
        super().__init__()
        d = torch.float64
        self.conv = nn.Conv2d(2, 4, 3, padding=1, dtype=d)
        self.bn = nn.BatchNorm2d(4, dtype=d)
        self.embed = nn.Linear(36, 8, dtype=d)
        self.ln = nn.LayerNorm(8, dtype=d)
        self.qkv = nn.Linear(8, 24, dtype=d)
        self.fc = nn.Linear(8, 16, dtype=d)
        self.proj = nn.Linear(16, 8, dtype=d)
        self.head = nn.Linear(8, 3, dtype=d)

    def forward(self, x: Tensor) -> Tensor:
        b = x.shape[0]
        h = F.relu(self.bn(self.conv(x)))  # functional relu
        tok = self.embed(h.reshape(b, 4, 36))  # [b, 4 tokens, 8]
        q, k, v = self.qkv(self.ln(tok)).split(8, dim=-1)
        att = torch.softmax((q @ k.transpose(-2, -1)) * (8**-0.5), dim=-1)
        tok = tok + att @ v  # residual add between modules
        tok = tok + self.proj(F.gelu(self.fc(tok)))
        return self.head(tok.mean(dim=1))


def _tiny_setup(seed: int = 0) -> tuple[TinyNet, list[torch.optim.Optimizer], Tensor, Tensor]:
    torch.manual_seed(seed)
    model = TinyNet()
    with torch.no_grad():
        for t in [*model.parameters(), model.bn.running_mean, model.bn.running_var]:
            rounding.round_(t, BITS)
    params = dict(model.named_parameters())
    sgd_names = [n for n in params if n.startswith(("conv", "bn", "embed"))]
    sgd = torch.optim.SGD(
        [params[n] for n in sgd_names], lr=0.1, momentum=0.9, weight_decay=1e-3, foreach=False
    )
    adamw = torch.optim.AdamW(
        [p for n, p in params.items() if n not in sgd_names], lr=1e-2, weight_decay=0.1, foreach=False
    )
    x = rounding.rnd(torch.randn(6, 2, 6, 6, dtype=torch.float64), BITS)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    return model, [sgd, adamw], x, y


def _train_step(model: nn.Module, opts: list[torch.optim.Optimizer], x: Tensor, y: Tensor) -> Tensor:
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    for opt in opts:
        opt.step()
    return loss


def _state_tensors(model: nn.Module, opts: list[torch.optim.Optimizer]) -> dict[str, Tensor]:
    out = {f"param/{n}": p for n, p in model.named_parameters()}
    out.update({f"buffer/{n}": b for n, b in model.named_buffers()})
    for opt in opts:
        for i, st in enumerate(opt.state.values()):
            out.update({f"optim/{i}/{k}": v for k, v in st.items() if isinstance(v, Tensor)})
    return out


def _log_names(step_log: StepLog) -> Counter[str]:
    """Op names of the log's records, re-read through a cursor-independent path when possible."""
    return Counter(r.op_name for r in step_log.records)


def test_coverage_everyInexactResultIsRoundedAndLogged() -> None:
    model, opts, x, y = _tiny_setup()
    step_log = StepLog()
    rm = RoundingMode(bits=BITS, tau=TAU, mode="record", profile=get_profile("cpu-1t"), step=1, log=step_log)
    obs = Observer()
    with rm, obs:  # obs inside: sees results after rounding
        loss = _train_step(model, opts, x, y)
    for opt in opts:
        opt.zero_grad(set_to_none=True)
    assert torch.isfinite(loss)

    # Every op that ran was classified.
    assert obs.names <= rm.ops
    # Every float64 result of every op (views and uninitialised factories aside) is on the grid.
    assert obs.off_grid == []
    # Every op producing float64 that is neither data movement nor exact (for these arguments) was
    # rounded *with* the log, once per float64 tensor it produced or mutated, and nothing else was.
    logged = _log_names(step_log)
    assert logged == obs.must_log
    assert sum(logged.values()) == rm.op_index
    # The paper's gaps are closed: these ran and were logged.
    for op in (
        "aten.convolution.default",
        "aten.convolution_backward.default",
        "aten.native_batch_norm.default",  # output and running stats
        "aten.native_layer_norm.default",
        "aten._softmax.default",
        "aten.gelu.default",
        "aten.mean.dim",
        "aten.addmm.default",
        "aten.mm.default",  # parameter gradients
        "aten.lerp_.Scalar",  # AdamW moments
        "aten.addcdiv_.default",  # AdamW update of the parameters
        "aten.add_.Tensor",  # SGD update (alpha = -lr): inexact by argument
    ):
        assert logged[op] > 0, op
    # native_batch_norm: one output tensor plus save_mean/invstd plus both running stats.
    assert logged["aten.native_batch_norm.default"] == 5

    # After the step every float of the state lies on the grid; gradients are gone.
    state = _state_tensors(model, opts)
    assert any(n.startswith("optim/") and "exp_avg" in n for n in state)
    assert any("momentum_buffer" in n for n in state)
    for name, t in state.items():
        if t.dtype == torch.float64:
            assert rounding.is_on_grid(t.detach(), BITS), name
    assert all(p.grad is None for p in model.parameters())


SMALL = {
    "mlp-digits": {"model": {"hidden": 16}, "batch_size": 4},
    "cnn-digits": {"model": {"channels": 4, "hidden": 8}, "batch_size": 4},
    "gpt-shakespeare": {"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8}, "batch_size": 2},
}


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_presetStep_everyInexactResultIsLogged(preset: str) -> None:
    """The same check on each preset's real step (dropout, maxpool, embeddings, AdamW, SGD)."""
    cfg = TaskConfig.for_preset(preset, **SMALL[preset])
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    for step in (1, 2):  # step 2 also runs the optimizers' update of existing state
        batch = engine.prepare_batch(engine.batch(step))
        step_log = StepLog(step)
        rm = RoundingMode(
            bits=cfg.bits, tau=cfg.tau, mode="record", profile=engine.profile, step=step, log=step_log
        )
        obs = Observer()
        with rm, obs:
            with StockOps(cfg.seed, step, 0, batch.example_ids):
                loss = engine.runtime.loss(state.model, batch)
            loss.backward()
            state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        state.step = step
        assert obs.names <= rm.ops
        assert obs.off_grid == []
        assert _log_names(step_log) == obs.must_log
        check_on_grid(state, cfg.bits)


def test_record_thenReplay_reproducesBitsWithAnotherProfile() -> None:
    results = []
    logs = []
    for mode, profile, step_log in (
        ("record", get_profile("cpu-1t"), StepLog()),
        ("replay", get_profile("noisy"), None),
    ):
        model, opts, x, y = _tiny_setup()
        use_log = step_log if mode == "record" else logs[0]
        rm = RoundingMode(bits=BITS, tau=TAU, mode=mode, profile=profile, step=1, log=use_log)
        with rm:
            _train_step(model, opts, x, y)
        rm.finish()
        logs.append(use_log)
        results.append({n: t.detach().clone() for n, t in _state_tensors(model, opts).items()})
        if mode == "replay":
            assert rm.corrections > 0
    for name, t in results[0].items():
        assert torch.equal(t, results[1][name]), name


def test_replay_foreignLog_raisesRoundingLogError() -> None:
    model, opts, x, y = _tiny_setup()
    short = StepLog()
    with RoundingMode(bits=BITS, tau=TAU, mode="record", profile=get_profile("cpu-1t"), step=1, log=short):
        model(x).sum().backward()  # a different (shorter) computation
    model, opts, x, y = _tiny_setup()
    rm = RoundingMode(bits=BITS, tau=TAU, mode="replay", profile=get_profile("cpu-1t"), step=1, log=short)
    with pytest.raises(RoundingLogError), rm:
        _train_step(model, opts, x, y)
        rm.finish()


def test_nonFinite_raisesNamingStepAndOp() -> None:
    x = torch.tensor([1.0, -1.0], dtype=torch.float64)
    rm = RoundingMode(bits=BITS, tau=TAU, mode="record", profile=get_profile("cpu-1t"), step=7, log=StepLog())
    with pytest.raises(NonFiniteError, match=r"step 7.*aten\.log\.default"), rm:
        torch.log(x)


def test_overflow_inRoundMode_raises() -> None:
    big = torch.tensor([1.0, 100.0], dtype=torch.float64)  # exp(100) is finite in float64, past float32
    rm = RoundingMode(bits=BITS, tau=TAU, mode="round", profile=get_profile("cpu-1t"), step=3)
    with pytest.raises(NonFiniteError, match=r"overflow at step 3.*aten\.exp\.default"), rm:
        torch.exp(big)


@pytest.mark.parametrize("log_format", ["sparse", "packed"])
def test_anInf_passesUnlogged_andReplaysBitExactly(log_format: str) -> None:
    """An inexact op's inf (a log of 0, a division by 0) is its own rounding: the trainer lets it
    through beside the rounded finite lanes, with no log record concerning it, and an auditor on
    another profile replays the same bits; a NaN beside it is still refused."""
    x = torch.tensor([0.0, 1.0 / 3.0, 2.0, 0.0, 7.1], dtype=torch.float64)
    step_log = SparseStepLog() if log_format == "sparse" else StepLog()
    outs = []
    for mode, profile, use_log in (("record", "cpu-1t", step_log), ("replay", "noisy", step_log)):
        rm = RoundingMode(bits=BITS, tau=TAU, mode=mode, profile=get_profile(profile), step=1, log=use_log)
        with rm:
            out = torch.log(x).div(3.0)
        rm.finish()
        outs.append(out)
    assert torch.equal(outs[0].view(torch.int64), outs[1].view(torch.int64))
    assert outs[0][0] == -math.inf and outs[0][3] == -math.inf
    assert rounding.is_on_grid(outs[0], BITS)
    rm = RoundingMode(bits=BITS, tau=TAU, mode="record", profile=get_profile("cpu-1t"), step=1, log=StepLog())
    with pytest.raises(NonFiniteError, match=r"1 NaN, 0 inf"), rm:
        torch.log(torch.tensor([-1.0, 1.0], dtype=torch.float64))


def test_aMaskOfFloat64Min_fromAnExactOp_isTheGridsLargest_andAComputedOneOverflows() -> None:
    """A model's ``torch.finfo(torch.float64).min`` mask, made by an exact op, is the grid's most
    negative value (float32's, as on float32 hardware), so a row masked on every key softmaxes to a
    uniform row, not NaN; a value an op computes past the range is still an overflow."""
    low = torch.finfo(torch.float64).min
    scores = torch.tensor([[0.5, -1.0, 2.0], [0.25, 0.75, 0.0]], dtype=torch.float64)
    keep = torch.tensor([[True, False, True], [False, False, False]])
    rm = RoundingMode(
        bits=BITS, tau=TAU, mode="record", profile=get_profile("cpu-1t"), step=1, log=SparseStepLog()
    )
    with rm:
        mask = torch.full((2, 3), low, dtype=torch.float64)
        masked = torch.where(keep, scores, mask)
        weights = torch.softmax(masked, dim=-1)
    assert mask.unique().tolist() == [-rounding.FLOAT32_MAX]
    assert torch.equal(weights[1], torch.full((3,), 1 / 3, dtype=torch.float64).float().double())
    assert weights[0, 1] == 0.0 and not bool(torch.isnan(weights).any())
    with pytest.raises(NonFiniteError, match=r"overflow at step 1, op #\d+ aten\.sum"), rm:
        masked.sum(dim=-1)  # three of the largest: past the range


def test_outVariant_roundsTheOutTensorOnce() -> None:
    a = torch.full((4,), 1.0, dtype=torch.float64)
    b = torch.full((4,), 1.0 / 3.0, dtype=torch.float64)
    out = torch.empty(4, dtype=torch.float64)
    step_log = StepLog()
    rm = RoundingMode(bits=BITS, tau=TAU, mode="record", profile=get_profile("cpu-1t"), step=1, log=step_log)
    with rm:
        torch.add(a, b, alpha=0.7, out=out)  # fused: inexact
    assert rm.op_index == 1
    assert rounding.is_on_grid(out, BITS)
    assert torch.equal(out, rounding.rnd(a + 0.7 * b, BITS))


def test_inplaceInexact_roundsTheMutatedTensor() -> None:
    p = torch.full((5,), 1.0, dtype=torch.float64)
    g = torch.full((5,), 1.0 / 3.0, dtype=torch.float64)
    rm = RoundingMode(bits=BITS, tau=TAU, mode="round", profile=get_profile("cpu-1t"), step=1)
    with rm:
        p.addcdiv_(g, torch.full((5,), 7.0, dtype=torch.float64), value=-0.1)
    assert rounding.is_on_grid(p, BITS)
    assert rm.op_index == 1


def test_plainMode_doesNotRound() -> None:
    a = torch.tensor([1.0 / 3.0, 1.0 / 7.0, 1.0 / 11.0], dtype=torch.float64)
    rm = RoundingMode(bits=BITS, tau=TAU, mode="plain", profile=get_profile("cpu-1t"), step=1)
    with rm:
        s = a.sum()
    assert not rounding.is_on_grid(s, BITS)
    assert "aten.sum.default" in rm.ops


def test_exactOps_areRoundedWithoutLog() -> None:
    a = torch.full((3,), 1.0 / 3.0, dtype=torch.float64)  # off the grid
    step_log = StepLog()
    rm = RoundingMode(bits=BITS, tau=TAU, mode="record", profile=get_profile("cpu-1t"), step=1, log=step_log)
    with rm:
        m = a * 3.0
    assert rounding.is_on_grid(m, BITS)
    assert rm.op_index == 0


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: (aten.add.Tensor, (torch.ones(2), torch.ones(2)), {}), OpClass.EXACT),
        (lambda: (aten.add.Tensor, (torch.ones(2), torch.ones(2)), {"alpha": 2}), OpClass.INEXACT),
        (lambda: (aten.add_.Tensor, (torch.ones(2), torch.ones(2)), {"alpha": -0.1}), OpClass.INEXACT),
        (lambda: (aten.sub.Tensor, (torch.ones(2), torch.ones(2)), {}), OpClass.EXACT),
        (lambda: (aten.div.Tensor, (torch.ones(2), torch.ones(2)), {}), OpClass.EXACT),
        (lambda: (aten.div.Tensor, (torch.ones(2), torch.tensor(3.0)), {}), OpClass.INEXACT),
        (lambda: (aten.div.Scalar, (torch.ones(2), 3.0), {}), OpClass.INEXACT),
        (
            lambda: (aten.div.Tensor_mode, (torch.ones(2), torch.ones(2)), {"rounding_mode": "floor"}),
            OpClass.INEXACT,
        ),
        (lambda: (aten.mul.Tensor, (torch.ones(2), torch.ones(2)), {}), OpClass.EXACT),
        (lambda: (aten.sqrt.default, (torch.ones(2),), {}), OpClass.EXACT),
        (lambda: (aten.rsqrt.default, (torch.ones(2),), {}), OpClass.INEXACT),
        (lambda: (aten.exp.default, (torch.ones(2),), {}), OpClass.INEXACT),
        (lambda: (aten.erfinv.default, (torch.ones(2),), {}), OpClass.INEXACT),
        (lambda: (aten.sum.default, (torch.ones(2),), {}), OpClass.INEXACT),
        (lambda: (aten.view.default, (torch.ones(2), [2]), {}), OpClass.MOVE),
        (lambda: (aten.transpose.int, (torch.ones(2, 2), 0, 1), {}), OpClass.MOVE),
        (lambda: (aten.clone.default, (torch.ones(2),), {}), OpClass.MOVE),
        (lambda: (aten.index_put_.default, (torch.ones(2), [None], torch.ones(2)), {}), OpClass.MOVE),
        (
            lambda: (aten.index_put_.default, (torch.ones(2), [None], torch.ones(2), True), {}),
            OpClass.INEXACT,
        ),
        (lambda: (aten.scatter.src, (torch.ones(2), 0, torch.zeros(2), torch.ones(2)), {}), OpClass.MOVE),
        (
            lambda: (aten.scatter_add.default, (torch.ones(2), 0, torch.zeros(2), torch.ones(2)), {}),
            OpClass.INEXACT,
        ),
        (lambda: (aten.round.default, (torch.ones(2),), {}), OpClass.EXACT),
        (lambda: (aten.round.decimals, (torch.ones(2),), {"decimals": 2}), OpClass.INEXACT),
        (
            lambda: (aten._foreach_add_.List, ([torch.ones(2)], [torch.ones(2)]), {"alpha": 0.5}),
            OpClass.INEXACT,
        ),
        (lambda: (aten._foreach_mul_.Scalar, ([torch.ones(2)], 0.9), {}), OpClass.EXACT),
        (lambda: (aten._foreach_lerp_.Scalar, ([torch.ones(2)], [torch.ones(2)], 0.1), {}), OpClass.INEXACT),
        # in-place views, and ops that copy values or set them to 0, move data (they were inexact)
        (lambda: (aten.t_.default, (torch.ones(2, 3),), {}), OpClass.MOVE),
        (lambda: (aten.transpose_.default, (torch.ones(2, 3), 0, 1), {}), OpClass.MOVE),
        (lambda: (aten.tril.default, (torch.ones(3, 3),), {}), OpClass.MOVE),
        (lambda: (aten.triu.default, (torch.ones(3, 3), 1), {}), OpClass.MOVE),
        (lambda: (aten.diagonal_copy.default, (torch.ones(3, 3),), {}), OpClass.MOVE),
        (lambda: (aten.diag_embed.default, (torch.ones(3),), {}), OpClass.MOVE),
        (lambda: (aten.reflection_pad1d.default, (torch.ones(1, 4), [1, 1]), {}), OpClass.MOVE),
        (lambda: (aten.replication_pad2d.default, (torch.ones(1, 3, 3), [1, 1, 1, 1]), {}), OpClass.MOVE),
        (  # its backward pass sums the gradients of the copies
            lambda: (
                aten.replication_pad1d_backward.default,
                (torch.ones(1, 6), torch.ones(1, 4), [1, 1]),
                {},
            ),
            OpClass.INEXACT,
        ),
        # a selection's backward pass puts its gradient in zeros (a slice's, an index's, topk's)
        (lambda: _SELECTIONS_BACKWARD["slice"], OpClass.MOVE),
        (lambda: _SELECTIONS_BACKWARD["select"], OpClass.MOVE),
        (lambda: _SELECTIONS_BACKWARD["diagonal"], OpClass.MOVE),
        (lambda: _SELECTIONS_BACKWARD["value_selecting_reduction"], OpClass.MOVE),
        # values kept, put to 0, negated or +-1 (issue 46: they were exact, rounded for nothing)
        (lambda: (aten.relu.default, (torch.ones(2),), {}), OpClass.MOVE),
        (lambda: (aten.relu_.default, (torch.ones(2),), {}), OpClass.MOVE),
        (lambda: (aten.threshold_backward.default, (torch.ones(2), torch.ones(2), 0.0), {}), OpClass.MOVE),
        (lambda: (aten.neg.default, (torch.ones(2),), {}), OpClass.MOVE),
        (lambda: (aten._foreach_neg.default, ([torch.ones(2)],), {}), OpClass.MOVE),
        (lambda: (aten.sign.default, (torch.ones(2),), {}), OpClass.MOVE),
        (lambda: (aten.threshold.default, (torch.ones(2), 0.5, 0.1), {}), OpClass.EXACT),  # its value
    ],
)
def test_classify_dependsOnOpAndArguments(call: Any, expected: OpClass) -> None:
    func, args, kwargs = call()
    assert classify(func, args, kwargs) is expected


_G = torch.randn(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
_SELECTIONS_BACKWARD: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {
    "slice": (aten.slice_backward.default, (_G, [3, 5], 1, 1, 3, 1), {}),
    "select": (aten.select_backward.default, (_G[0], [4, 2], 0, 2), {}),
    "diagonal": (aten.diagonal_backward.default, (_G[:, 0], [3, 3], 0, 0, 1), {}),
    "value_selecting_reduction": (
        aten.value_selecting_reduction_backward.default,
        (_G, 1, torch.tensor([[4, 0], [1, 3], [2, 3]]), [3, 5], True),
        {},
    ),
}


@pytest.mark.parametrize("name", sorted(_SELECTIONS_BACKWARD))
def test_aSelectionsBackward_isABitCopyOfItsGradientIntoZeros(name: str) -> None:
    """What makes these moves: every value of the result is 0 or a value of the gradient, bit for
    bit, and each of the gradient's values is there."""
    func, args, kwargs = _SELECTIONS_BACKWARD[name]
    out = func(*args, **kwargs)
    grad = args[0]
    nonzero = out[out != 0]
    assert set(nonzero.tolist()) == set(grad.flatten().tolist()) and nonzero.numel() == grad.numel()


@pytest.mark.parametrize("bits", [32, 24, 16])
@pytest.mark.parametrize("op", ["relu", "threshold_backward", "neg", "sign"])
def test_theMovesThatKeepOrNegateValues_giveGridValuesFromGridValues(op: str, bits: int) -> None:
    """What makes relu, its backward, neg and sign moves: from values on the grid (normal,
    subnormal, the largest, signed zeros, infinities) every result is on the grid, so rounding
    it changes no bit (issue 46)."""
    g = torch.Generator().manual_seed(bits)
    big = rounding.grid_max(bits)
    edge = torch.tensor(
        [0.0, -0.0, big, -big, math.inf, -math.inf, 2.0**-140, -(2.0**-149)], dtype=torch.float64
    )
    x = rounding.rnd(torch.cat([torch.randn(500, dtype=torch.float64, generator=g) * 10.0**-30, edge]), bits)
    y = rounding.rnd(torch.randn(x.numel(), dtype=torch.float64, generator=g), bits)
    out = {
        "relu": lambda: torch.relu(x),
        "threshold_backward": lambda: aten.threshold_backward.default(y, x, 0.0),
        "neg": lambda: torch.neg(x),
        "sign": lambda: torch.sign(x),
    }[op]()
    assert torch.equal(rounding.rnd(out, bits).view(torch.int64), out.view(torch.int64))


def test_aReluModelsRecordStep_roundsNoReluNorItsBackward() -> None:
    """Through the front and through the Python mode, a record step of a ReLU network hands the
    rounding no ReLU output and no ReLU gradient, and both give the same state bit for bit."""
    states = []
    for interceptor in ("front", "python"):
        engine = StepEngine(TaskConfig.for_preset("cnn-digits", **SMALL["cnn-digits"]), get_profile("cpu-1t"))
        state = engine.init_state()
        with contextlib.nullcontext() if interceptor == "front" else front.disabled():
            engine.run_step(state, 1, mode="record")
        mode = engine.last_mode
        assert mode is not None and mode.via_front is (interceptor == "front" and front.available())
        assert not {n for n in mode.rounded if "relu" in n or "threshold" in n}
        assert mode.classes.get("aten.relu.default") is OpClass.MOVE
        states.append([p.detach().clone() for p in state.model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*states, strict=True))


def test_classify_unknownCustomOp_isInexact() -> None:
    lib = torch.library.Library("vgame_test", "FRAGMENT")
    lib.define("mystery(Tensor x) -> Tensor")
    lib.impl("mystery", lambda x: x * 1.1, "CompositeExplicitAutograd")
    func = torch.ops.vgame_test.mystery.default
    assert classify(func, (torch.ones(2),), {}) is OpClass.INEXACT
    rm = RoundingMode(bits=BITS, tau=TAU, mode="record", profile=get_profile("cpu-1t"), step=1, log=StepLog())
    with rm:
        func(torch.full((3,), 1.0 / 3.0, dtype=torch.float64))
    assert rm.op_index == 1


def test_foreachOps_roundEveryMutatedTensor() -> None:
    ps = [torch.full((3,), 1.0, dtype=torch.float64), torch.full((2,), 2.0, dtype=torch.float64)]
    gs = [torch.full((3,), 1.0 / 3.0, dtype=torch.float64), torch.full((2,), 1.0 / 7.0, dtype=torch.float64)]
    step_log = StepLog()
    rm = RoundingMode(bits=BITS, tau=TAU, mode="record", profile=get_profile("cpu-1t"), step=1, log=step_log)
    with rm:
        torch._foreach_add_(ps, gs, alpha=-0.3)
    assert rm.op_index == 2
    assert all(rounding.is_on_grid(p, BITS) for p in ps)


def test_replayMode_withoutLog_isConfigError() -> None:
    with pytest.raises(ConfigError):
        RoundingMode(bits=BITS, tau=TAU, mode="replay", profile=get_profile("cpu-1t"), step=1)
    with pytest.raises(ConfigError):
        RoundingMode(bits=BITS, tau=TAU, mode="bogus", profile=get_profile("cpu-1t"), step=1)  # type: ignore[arg-type]
