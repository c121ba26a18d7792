"""The presets on the task API: models built from the seed, served dropout, batches keyed per example,
no torch RNG, and training that works."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from game.errors import ConfigError
from game.training.dispatch.opplan import classify
from game.training.dispatch.optable import OpClass
from game.training.dispatch.stockops import StockOps
from game.training.engine.runtime import Batch, TaskRuntime, runtime_for
from game.training.numerics import rng
from game.training.task import data
from game.training.task.catalog import PRESET_NAMES, CNNShape
from game.training.task.config import TaskConfig
from game.training.task.models import ResNet50Digits
from game.training.task.presets import PRESETS

# Small sizes keep every test here fast; the presets' own defaults are exercised by the smoke run.
SMALL = {
    "mlp-digits": {"model": {"hidden": 32}},
    "cnn-digits": {"model": {"channels": 4, "hidden": 16}},
    "gpt-shakespeare": {"model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16}},
}


def small_cfg(name: str, **overrides: object) -> TaskConfig:
    return TaskConfig.for_preset(name, **{**SMALL[name], **overrides})


def state_bits(model: nn.Module) -> dict[str, bytes]:
    return {k: v.detach().cpu().contiguous().numpy().tobytes() for k, v in model.state_dict().items()}


def train(runtime: TaskRuntime, steps: int) -> tuple[nn.Module, list[float]]:
    """Plain float64 steps (no rounding), randomness served as in a real step."""
    cfg = runtime.cfg
    model = runtime.build_model()
    opt, _ = runtime.build_optimizer(model)
    losses = []
    for step in range(1, steps + 1):
        batch = runtime.batch(step)
        batch = Batch(
            tuple(t.to(torch.float64) if t.is_floating_point() else t for t in batch.data), batch.example_ids
        )
        with StockOps(cfg.seed, step, 0, batch.example_ids):
            loss = runtime.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return model, losses


# --------------------------------------------------------------------------------------------------
# Presets and initialisation
# --------------------------------------------------------------------------------------------------


def test_presets_areTheCatalogs() -> None:
    assert tuple(PRESETS) == PRESET_NAMES
    with pytest.raises(ConfigError) as info:
        PRESETS.get("resnet")
    for name in PRESET_NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_buildModel_sameSeedSameBits_otherSeedDiffers(name: str) -> None:
    a = state_bits(runtime_for(small_cfg(name, seed=1)).build_model())
    b = state_bits(runtime_for(small_cfg(name, seed=1)).build_model())
    c = runtime_for(small_cfg(name, seed=2)).build_model()
    assert a == b
    for key, value in c.state_dict().items():
        if value.is_floating_point() and key.endswith("weight") and value.dim() >= 2:
            assert a[key] != state_bits(c)[key], key


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_buildModel_float64CpuTrainMode(name: str) -> None:
    model = runtime_for(small_cfg(name)).build_model()
    assert model.training
    for key, value in model.state_dict().items():
        assert value.device.type == "cpu", key
        assert value.dtype in (torch.float64, torch.int64), key
        assert torch.isfinite(value.to(torch.float64)).all(), key


def test_init_linearWithinKaimingBound_embeddingsNormalish() -> None:
    model = runtime_for(small_cfg("gpt-shakespeare")).build_model()
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            bound = 1.0 / math.sqrt(mod.in_features)
            assert float(mod.weight.detach().abs().max()) <= bound
            assert float(mod.weight.detach().abs().max()) > 0.9 * bound  # actually spread over the range
    wte = model.get_submodule("wte")
    assert isinstance(wte, nn.Embedding)
    assert abs(float(wte.weight.detach().std()) - 0.02) < 0.002


def test_init_bnAndLayerNormConstants() -> None:
    model = runtime_for(small_cfg("cnn-digits")).build_model()
    bn = model.get_submodule("bn1")
    assert isinstance(bn, nn.BatchNorm2d)
    assert torch.equal(bn.weight, torch.ones_like(bn.weight))
    assert torch.equal(bn.bias, torch.zeros_like(bn.bias))
    assert bn.running_var is not None and bn.num_batches_tracked is not None
    assert torch.equal(bn.running_var, torch.ones_like(bn.running_var))
    assert int(bn.num_batches_tracked) == 0


def test_noTorchRng_buildAndTrainIndependentOfTorchSeed() -> None:
    results = []
    for torch_seed in (0, 12345):
        with torch.random.fork_rng():
            torch.manual_seed(torch_seed)
            before = torch.random.get_rng_state()
            for name in PRESET_NAMES:
                model, _ = train(runtime_for(small_cfg(name, dropout=0.3)), 2)
                results.append((torch_seed, name, state_bits(model)))
            assert torch.equal(before, torch.random.get_rng_state()), "torch's global RNG was used"
    half = len(results) // 2
    for (_, name_a, a), (_, name_b, b) in zip(results[:half], results[half:], strict=True):
        assert name_a == name_b
        assert a == b, name_a


def test_gpt_neverCallsSdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("scaled_dot_product_attention differs per device")

    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    monkeypatch.setattr(torch._C._nn, "scaled_dot_product_attention", refuse, raising=False)
    train(runtime_for(small_cfg("gpt-shakespeare")), 1)


def test_gpt_isCausal() -> None:
    runtime = runtime_for(small_cfg("gpt-shakespeare"))
    model = runtime.build_model().eval()
    batch = runtime.batch(1)
    changed = batch.inputs.clone()
    changed[:, -1] = (changed[:, -1] + 1) % len(data.vocab())
    with torch.no_grad():
        a, b = model(batch.inputs), model(changed)
    assert torch.equal(a[:, :-1], b[:, :-1])
    assert not torch.equal(a[:, -1], b[:, -1])


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_optimizer_foreachNotFused(name: str) -> None:
    cfg = small_cfg(name)
    runtime = runtime_for(cfg)
    opt, scheduler = runtime.build_optimizer(runtime.build_model())
    assert scheduler is None
    assert opt.defaults["foreach"] is True
    assert opt.defaults.get("fused") in (False, None)
    assert opt.defaults["lr"] == cfg.lr


def test_adamw_decaysMatricesOnly() -> None:
    cfg = small_cfg("gpt-shakespeare")
    runtime = runtime_for(cfg)
    opt, _ = runtime.build_optimizer(runtime.build_model())
    assert isinstance(opt, torch.optim.AdamW)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == cfg.weight_decay and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_plainTraining_reducesLoss(name: str) -> None:
    lr = {"mlp-digits": 0.2, "cnn-digits": 0.05, "gpt-shakespeare": 3e-3}[name]
    runtime = runtime_for(small_cfg(name, lr=lr))
    model, losses = train(runtime, 25)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.9 * first, losses
    # Held-out loss drops below the untrained model's too (eval mode: no dropout).
    before = runtime.evaluate(runtime.build_model(), 64)
    after = runtime.evaluate(model, 64)
    assert after["loss"] < 0.9 * before["loss"]
    assert model.training  # evaluating leaves the model as it was


def test_cnn_batchNormRunningStatsAreUpdated() -> None:
    model, _ = train(runtime_for(small_cfg("cnn-digits")), 2)
    bn = model.get_submodule("bn1")
    assert isinstance(bn, nn.BatchNorm2d)
    assert bn.running_mean is not None and bn.num_batches_tracked is not None
    assert int(bn.num_batches_tracked) == 2
    assert not torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_training_isBitReproducible(name: str) -> None:
    a, la = train(runtime_for(small_cfg(name, dropout=0.2)), 3)
    b, lb = train(runtime_for(small_cfg(name, dropout=0.2)), 3)
    assert la == lb
    assert state_bits(a) == state_bits(b)


# --------------------------------------------------------------------------------------------------
# ResNet-50 (cnn-digits, arch = "resnet50")
# --------------------------------------------------------------------------------------------------

RESNET = {"model": {"arch": "resnet50", "channels": 8}, "batch_size": 4}


def resnet50_param_count(c: int, stem_in: int = 1, stem_k: int = 3, classes: int = 10) -> int:
    """ResNet-50's parameters from the architecture, written out: stem, [3, 4, 6, 3] bottlenecks
    (1x1, 3x3, 1x1 with expansion 4, a projection on each stage's first block), a linear head."""

    def conv(c_in: int, c_out: int, k: int) -> int:
        return c_in * c_out * k * k

    def bn(n: int) -> int:
        return 2 * n  # weight and bias (running stats are buffers)

    total = conv(stem_in, c, stem_k) + bn(c)
    c_in = c
    for stage, blocks in enumerate((3, 4, 6, 3)):
        width = c * 2**stage
        for b in range(blocks):
            total += conv(c_in, width, 1) + bn(width) + conv(width, width, 3) + bn(width)
            total += conv(width, 4 * width, 1) + bn(4 * width)
            if b == 0:
                total += conv(c_in, 4 * width, 1) + bn(4 * width)
            c_in = 4 * width
    return total + c_in * classes + classes


def test_resnet50_paramCount_isResNet50sAtChannels64() -> None:
    with torch.device("meta"):  # the real size (23.5M parameters): counted, never initialised
        model = ResNet50Digits(CNNShape(channels=64, arch="resnet50"), 0.1)
    count = sum(p.numel() for p in model.parameters())
    assert count == resnet50_param_count(64)
    # Cross-check the formula with torchvision's published ResNet-50 (25,557,032 parameters: a 7x7
    # stem on 3 channels and a 1000-way head), swapping in our 3x3 stem on 1 channel and 10 classes.
    assert resnet50_param_count(64, stem_in=3, stem_k=7, classes=1000) == 25_557_032
    assert count == 25_557_032 - (3 * 7 * 7 * 64 + 2048 * 1000 + 1000) + (3 * 3 * 64 + 2048 * 10 + 10)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == len(bns) == 1 + 3 * 16 + 4  # stem, three per block, four projections


def test_resnet50_forwardShape_andEveryBnConstant() -> None:
    runtime = runtime_for(small_cfg("cnn-digits", **RESNET))
    model = runtime.build_model()
    assert isinstance(model, ResNet50Digits)
    assert sum(p.numel() for p in model.parameters()) == resnet50_param_count(8)
    for name, mod in model.named_modules():
        if isinstance(mod, nn.BatchNorm2d):
            assert torch.equal(mod.weight, torch.ones_like(mod.weight)), name
            assert torch.equal(mod.bias, torch.zeros_like(mod.bias)), name
    batch = runtime.batch(1)
    logits = model(batch.inputs)
    assert logits.shape == (runtime.cfg.batch_size, 10) and logits.dtype == torch.float64


def test_resnet50_upsamplesByMovingData_andPoolsWithAReduction() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[tuple[str, OpClass]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append((str(func), classify(func, args, kwargs or {})))
            return func(*args, **(kwargs or {}))

    runtime = runtime_for(small_cfg("cnn-digits", **RESNET))
    model = runtime.build_model()
    batch = runtime.batch(1)
    with Record():
        model(batch.inputs)
    first_conv = next(i for i, (name, _) in enumerate(seen) if "convolution" in name)
    assert first_conv > 0 and all(cls is OpClass.MOVE for _, cls in seen[:first_conv]), seen[:first_conv]
    assert not any("upsample" in name or "interp" in name for name, _ in seen)
    assert ("aten.mean.dim", OpClass.INEXACT) in seen


# --------------------------------------------------------------------------------------------------
# Dropout (served by StockOps: tests/training/test_stockops.py holds its keying)
# --------------------------------------------------------------------------------------------------


def test_gptForward_batchSplitMatches() -> None:
    # Masks are per example, so the rows of a split batch agree with the whole (up to matmul blocking).
    runtime = runtime_for(small_cfg("gpt-shakespeare", dropout=0.3))
    model = runtime.build_model()
    batch = runtime.batch(4)
    ids = batch.example_ids
    seed = runtime.cfg.seed
    with torch.no_grad():
        with StockOps(seed, 4, 0, ids):
            whole = model(batch.inputs)
        with StockOps(seed, 4, 0, ids[:3]):
            head = model(batch.inputs[:3])
        with StockOps(seed, 4, 0, ids[3:]):
            tail = model(batch.inputs[3:])
    torch.testing.assert_close(whole, torch.cat([head, tail]), rtol=1e-12, atol=1e-12)
    with torch.no_grad(), StockOps(seed, 5, 0, ids):
        assert not torch.allclose(whole, model(batch.inputs))  # another step: other masks


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def test_digits_splitAndScaling() -> None:
    train_x, train_y = data.digits_split("train")
    test_x, test_y = data.digits_split("test")
    assert train_x.shape == (data.DIGITS_TRAIN_SIZE, 8, 8) and test_x.shape == (297, 8, 8)
    assert train_x.dtype == torch.float64 and float(train_x.max()) == 1.0 and float(train_x.min()) == 0.0
    assert torch.equal(torch.sort(torch.cat([train_y, test_y])).values, torch.sort(data._digits()[1]).values)
    assert set(train_y.tolist()) == set(range(10))


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_batch_deterministicAndKeyedPerExample(name: str) -> None:
    cfg = small_cfg(name, batch_size=6)
    runtime = runtime_for(cfg)
    a, b = runtime.batch(3), runtime.batch(3)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert a.example_ids.tolist() == list(range(12, 18))
    assert not torch.equal(a.inputs, runtime.batch(4).inputs)
    assert not torch.equal(a.inputs, runtime_for(cfg.replace(seed=cfg.seed + 1)).batch(3).inputs)
    # Row i is the draw for example id alone: nothing about the rest of the batch matters.
    n = (
        data.digits_split("train")[1].numel()
        if name != "gpt-shakespeare"
        else data.shakespeare_tokens("train").numel() - cfg.model.block_size  # type: ignore[union-attr]
    )
    for i, ex in enumerate(a.example_ids.tolist()):
        pick = int(rng.randbelow(cfg.seed, 3, "data", torch.tensor([ex]), (), n)[0])
        if name == "gpt-shakespeare":
            tokens = data.shakespeare_tokens("train")
            assert torch.equal(a.inputs[i], tokens[pick : pick + cfg.model.block_size])  # type: ignore[union-attr]
        else:
            assert torch.equal(a.targets[i], data.digits_split("train")[1][pick])


def test_shakespeare_batchShapesAndShift() -> None:
    cfg = small_cfg("gpt-shakespeare")
    batch = runtime_for(cfg).batch(1)
    assert batch.inputs.shape == (cfg.batch_size, 16) and batch.inputs.dtype == torch.int64
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    assert len(data.vocab()) == 65
    assert data.decode(data.encode("To be, or not")) == "To be, or not"


def test_batch_rejectsStepZero() -> None:
    with pytest.raises(ConfigError, match="step"):
        runtime_for(small_cfg("mlp-digits")).batch(0)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_poison_changesDataKeepsShapeAndIds(name: str) -> None:
    runtime = runtime_for(small_cfg(name))
    batch = runtime.batch(2)
    bad = runtime.poison(batch, 2)
    assert isinstance(bad, Batch)
    assert bad.inputs.shape == batch.inputs.shape and bad.targets.shape == batch.targets.shape
    assert torch.equal(bad.example_ids, batch.example_ids)
    assert not torch.equal(bad.targets, batch.targets)
    again = runtime.poison(batch, 2)
    assert torch.equal(again.inputs, bad.inputs) and torch.equal(again.targets, bad.targets)
    if name == "gpt-shakespeare":
        assert data.decode(bad.inputs[0]).startswith(data.POISON_TEXT[:16])
    else:
        assert torch.equal(bad.targets, (batch.targets + 1) % 10)


def test_sources_useNoTorchRandomnessOrSdpa() -> None:
    # A static guard next to the behavioural ones: the presets' models draw nothing themselves
    # (torch's initialisers and nn.Dropout are served by vgame) and write attention out.
    import inspect

    from game.training.task import models, presets

    banned = ("torch.rand", "torch.bernoulli", "F.dropout", "scaled_dot_product", "manual_seed")
    for module in (models, presets, data, rng):
        source = inspect.getsource(module)
        for word in banned:
            assert word not in source, (module.__name__, word)
