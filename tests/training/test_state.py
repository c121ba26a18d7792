"""Canonical state bytes: layout (against a slow reference encoder), round trip, hash stability, errors."""

from __future__ import annotations

import copy
import struct

import pytest
import torch

from game.errors import TranscriptError
from game.training.dispatch.profiles import get_profile
from game.training.engine.states import decode_state
from game.training.engine.step import StepEngine
from game.training.native import front
from game.training.numerics import rounding
from game.training.state import canonical
from game.training.state import tensors as tensors_mod
from game.training.state.canonical import STATE_MAGIC, encode_state, encode_streamed, state_buffer
from game.training.state.checkpoint import CheckpointError, parse_state
from game.training.state.leafhash import leaf_of
from game.training.state.leaves import state_hash
from game.training.state.tensors import OffGridError, TrainState, check_on_grid, move_state, state_tensors
from game.training.task.config import TaskConfig

SMALL = {
    "mlp-digits": {"model": {"hidden": 16}, "batch_size": 8},
    "cnn-digits": {"model": {"channels": 4, "hidden": 8}, "batch_size": 8},
    "gpt-shakespeare": {
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8},
        "batch_size": 4,
    },
}


def small_cfg(name: str, **overrides: object) -> TaskConfig:
    return TaskConfig.for_preset(name, **{**SMALL[name], **overrides})


def trained(name: str, steps: int = 2, **overrides: object) -> tuple[TaskConfig, TrainState]:
    cfg = small_cfg(name, **overrides)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    for step in range(1, steps + 1):
        engine.run_step(state, step, mode="round")
    return cfg, state


def reference_encode(state: TrainState) -> bytes:
    """The layout of docs/architecture.md written out the slow, obvious way."""
    entries: dict[str, torch.Tensor] = {}
    for n, p in state.model.named_parameters():
        entries["param/" + n] = p
    params = {id(p) for p in state.model.parameters()}
    for n, b in state.model.state_dict(keep_vars=True).items():
        if id(b) not in params:
            entries["buffer/" + n] = b
    names = {id(p): n for n, p in state.model.named_parameters()}
    for p, st in state.optimizer.state.items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                entries[f"optim/{names[id(p)]}/{k}"] = v
    out = bytearray(b"vgame-state-v1\x00")
    out += state.step.to_bytes(8, "little") + len(entries).to_bytes(4, "little")
    for name in sorted(entries):
        t = entries[name].detach().cpu()
        raw = name.encode()
        out += len(raw).to_bytes(2, "little") + raw
        if t.dtype in (torch.float64, torch.float32):
            tag, values = b"f32", [struct.pack("<f", float(v)) for v in t.reshape(-1).tolist()]
        else:
            assert t.dtype == torch.int64
            tag, values = b"i64", [struct.pack("<q", int(v)) for v in t.reshape(-1).tolist()]
        out += bytes([len(tag)]) + tag + bytes([t.dim()])
        for d in t.shape:
            out += d.to_bytes(8, "little")
        out += b"".join(values)
    return bytes(out)


@pytest.mark.parametrize("name", list(SMALL))
def test_encode_matchesReferenceLayout(name: str) -> None:
    _, state = trained(name)
    data = encode_state(state)
    assert data == reference_encode(state)
    assert state_hash(state) == leaf_of(data)
    assert data.startswith(STATE_MAGIC)


def test_encode_sliceByslice_isTheSameBytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors are encoded and hashed a slice at a time; a slice edge anywhere changes nothing, and a
    value off the grid in a later slice is still found."""
    _, state = trained("gpt-shakespeare")
    data = encode_state(state)
    monkeypatch.setattr(canonical, "_ONE_BUFFER_MAX", 0)  # stream, as a large state does
    monkeypatch.setattr(canonical, "_SLICE", 7)
    assert encode_state(state) == data == reference_encode(state)
    assert state_hash(state) == leaf_of(data)
    with torch.no_grad():
        state.model.lm_head.weight.view(-1)[-1] = 1.0 / 3.0
    with pytest.raises(OffGridError, match=r"lm_head\.weight"):
        state_hash(state)


@pytest.mark.parametrize("name", list(SMALL))
def test_oneBuffer_isTheStreamedBytes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small state's bytes come from one buffer (one C call); they are the bytes the streaming
    path gives, and a strided float64 tensor, a float32 and an int64 one take their own ways in."""
    _, state = trained(name)
    buf = state_buffer(state)
    assert buf is not None
    if name == "cnn-digits":  # a strided view of a float64 state tensor: streamed into its place
        w = next(p for p in state.model.parameters() if p.dim() == 2 and min(p.shape) > 1)
        with torch.no_grad():
            w.set_(w.detach().t().contiguous().t())  # same values, column-major
        assert not w.is_contiguous()
        buf = state_buffer(state)
        assert buf is not None
    one = buf.tobytes()
    assert encode_state(state) == one
    assert state_hash(state) == leaf_of(one)
    monkeypatch.setattr(canonical, "_ONE_BUFFER_MAX", len(one) - 1)
    assert state_buffer(state) is None
    assert encode_state(state) == one == reference_encode(state)
    assert state_hash(state) == leaf_of(one)


class _Tangled(torch.nn.Module):
    """What a module walk can get wrong: a module under two names, a weight tied to another
    module's, a None parameter and child, a non-persistent buffer, containers inside containers."""

    def __init__(self) -> None:
        super().__init__()
        shared = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
        self.a = shared
        self.b = torch.nn.ModuleList([torch.nn.Linear(3, 4), torch.nn.ModuleDict({"s": shared})])
        self.head = torch.nn.Linear(3, 3)
        self.head.weight = shared[0].weight
        self.register_parameter("nothing", None)
        self.register_module("gone", None)
        self.register_buffer("scale", torch.ones(2), persistent=False)
        self.register_buffer("count", torch.zeros(1))


@pytest.mark.parametrize("name", [*SMALL, "tangled"])
def test_moduleWalk_namesWhatTorchNames_inItsOrder(name: str) -> None:
    """The state's one walk of the modules gives ``named_parameters()`` (each parameter once, where
    first met) and the persistent buffers under every name ``state_dict`` gives them, in order."""
    model = _Tangled() if name == "tangled" else trained(name)[1].model
    params, buffers = tensors_mod._module_tensors(model)
    assert [(n, id(p)) for n, p in params.items()] == [(n, id(p)) for n, p in model.named_parameters()]
    tensors = model.state_dict(keep_vars=True)
    want = [(n, id(b)) for n, b in tensors.items() if not isinstance(b, torch.nn.Parameter)]
    assert [(n, id(b)) for n, b in buffers.items()] == want
    if name == "tangled":
        assert "b.1.s.1.running_mean" in buffers and "head.weight" not in params and "scale" not in buffers


@pytest.mark.parametrize("checked_by", ["front", "python"])
@pytest.mark.parametrize("name", ["gpt-shakespeare", "cnn-digits"])
def test_oneBuffer_keepsItsPlan_onlyWhileTheTensorsAreTheSame(
    name: str, checked_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buffer's plan (layout, addresses) is reused from step to step, and made again when the
    state's tensors change under it: new optimizer state, a parameter given new storage, another
    shape, strides, dtype or name. The bytes are the reference layout's every time, whether the
    C++ front reads the tensors' layouts or Python does."""
    cfg, state = trained(name)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    if checked_by == "python":
        monkeypatch.setattr(front, "layouts", lambda tensors: None)
    elif not front.available():
        pytest.skip("the C++ front does not load here")
    state.buffer_plan = None  # a plan made before, checked the other way

    def bytes_now() -> bytes:
        buf = state_buffer(state)
        assert buf is not None
        assert buf.tobytes() == reference_encode(state) == encode_streamed(state)
        return buf.tobytes()

    bytes_now()
    plan = state.buffer_plan
    engine.run_step(state, 3, mode="round")
    bytes_now()
    assert state.buffer_plan is plan  # the same tensors, new values: the same plan
    assert (plan.layouts is not None) == (checked_by == "front")
    state.optimizer.load_state_dict(copy.deepcopy(state.optimizer.state_dict()))  # new tensors
    before = bytes_now()
    assert state.buffer_plan is not plan
    plan = state.buffer_plan
    w = next(p for p in state.model.parameters() if p.dim() == 2 and min(p.shape) > 1)
    shape = w.shape
    with torch.no_grad():
        w.data = w.data.clone().mul_(2)  # new storage, the same tensor object (values stay on the grid)
    after = bytes_now()
    assert after != before
    assert state.buffer_plan is not plan
    with torch.no_grad():
        w.data = w.data.view(1, -1)  # the same storage, another shape
    bytes_now()
    with torch.no_grad():
        w.data = w.data.view(shape)
    assert bytes_now() == after
    with torch.no_grad():  # the same storage and shape, read column-major
        w.data = torch.as_strided(w.data, shape, (1, shape[0]))
    assert not w.is_contiguous()
    assert bytes_now() != after
    with torch.no_grad():
        w.data = w.data.contiguous()
    contiguous = bytes_now()
    entries = next(iter(state.optimizer.state.values()))  # the same storage and shape, another dtype
    key = next(k for k, v in entries.items() if isinstance(v, torch.Tensor) and v.dtype == torch.float64)
    entries[key] = entries[key].view(torch.int64)
    assert bytes_now() != contiguous
    last = next(reversed(state.model._modules))  # the same tensors under other names
    state.model._modules = {(k + "_" if k == last else k): m for k, m in state.model._modules.items()}
    assert any(n.startswith(f"param/{last}_.") for n in state_tensors(state))
    bytes_now()


def test_oneBuffer_leavesOffGridValues_toTheStreamingError() -> None:
    _, state = trained("gpt-shakespeare")
    with torch.no_grad():
        state.model.lm_head.weight.view(-1)[5] = 1.0 / 3.0
    assert state_buffer(state) is None
    with pytest.raises(OffGridError, match=r"lm_head\.weight"):
        state_hash(state)


@pytest.mark.parametrize("name", list(SMALL))
def test_decode_roundTrip_isIdentity(name: str) -> None:
    cfg, state = trained(name)
    data = encode_state(state)
    back = decode_state(data, cfg)
    assert back.step == state.step == 2
    assert encode_state(back) == data
    assert state_hash(back) == state_hash(state)
    # The decoded state has the same dtypes in memory (float64 on the grid, AdamW step float32).
    for (n1, t1), (n2, t2) in zip(state_tensors(state).items(), state_tensors(back).items(), strict=True):
        assert n1 == n2 and t1.dtype == t2.dtype and torch.equal(t1.detach(), t2.detach())


def test_names_coverParamsBuffersAndOptimizer() -> None:
    _, cnn = trained("cnn-digits", steps=1)
    names = list(state_tensors(cnn))
    assert names == sorted(names)
    assert "buffer/bn1.running_mean" in names and "buffer/bn1.num_batches_tracked" in names
    assert "optim/conv1.weight/momentum_buffer" in names
    _, gpt = trained("gpt-shakespeare", steps=1)
    tensors = state_tensors(gpt)
    assert tensors["optim/lm_head.weight/step"].dtype == torch.float32
    assert tensors["optim/lm_head.weight/exp_avg_sq"].dtype == torch.float64
    assert not any("causal" in n for n in tensors)  # non-persistent constant, not state


@pytest.mark.parametrize("name", ["cnn-digits", "gpt-shakespeare"])
def test_snapshot_restoresEveryTensor_afterAStepChangedThem(name: str) -> None:
    """The copy a deferred step keeps (one foreach copy per device and dtype): taken, then a step
    changes parameters, BatchNorm buffers and optimizer state (SGD's momentum; AdamW's moments and
    float32 step counters), and restoring it gives back the state's bytes, the model's own tensors."""
    cfg, state = trained(name, steps=1)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    before = encode_state(state)
    params = list(state.model.parameters())
    restore = tensors_mod.snapshot(state)
    engine.run_step(state, 2, mode="record")
    assert encode_state(state) != before
    restore()
    state.step = 1
    assert encode_state(state) == before
    assert all(a is b for a, b in zip(params, state.model.parameters(), strict=True))


def test_copies_areDistinct_andKeepDtypeDeviceAndBits() -> None:
    src = [torch.tensor([-0.0, 1.5], dtype=torch.float64), torch.tensor(3.0), torch.arange(4).view(2, 2).t()]
    out = tensors_mod.copies(src)
    for s, o in zip(src, out, strict=True):
        assert (o.dtype, o.device, o.shape) == (s.dtype, s.device, s.shape)
        assert torch.equal(o.reshape(-1).view(torch.uint8), s.reshape(-1).view(torch.uint8))
        assert o.data_ptr() != s.data_ptr()
    assert torch.signbit(out[0][0])


def test_keptCopies_areWrittenAgainInPlace_whileEachStillFitsItsSource() -> None:
    """:class:`StateCopies` writes the same copies again while each source keeps its shape, dtype
    and device, and makes new ones when any changes (a broadcastable shape too), or once a restore
    handed them over: never a copy that is not bit for bit its source."""
    kept = tensors_mod.StateCopies()
    src = [
        torch.tensor([-0.0, 1.5, 2.0], dtype=torch.float64),
        torch.tensor(3.0),
        torch.arange(4).view(2, 2).t(),
    ]
    first = kept.of(src)
    with torch.no_grad():
        src[0].mul_(2.0)
        src[1].add_(1.0)
    again = kept.of(src)
    assert all(a is b for a, b in zip(first, again, strict=True))

    def exact(out: list[torch.Tensor]) -> bool:
        return all(
            (o.dtype, o.shape) == (s.dtype, s.shape)
            and torch.equal(o.reshape(-1).view(torch.uint8), s.reshape(-1).view(torch.uint8))
            and o.data_ptr() != s.data_ptr()
            for s, o in zip(src, out, strict=True)
        )

    assert exact(again) and torch.signbit(again[0][0])
    for changed in (torch.tensor([7.0], dtype=torch.float64), torch.tensor([1.0, 2.0, 3.0])):
        src[0] = changed  # a shape that would broadcast into the copy; then a dtype
        out = kept.of(src)
        assert exact(out) and not any(o is a for o, a in zip(out, again, strict=True))
        again = out
    kept.handed_over()
    out = kept.of(src)
    assert exact(out) and not any(o is a for o, a in zip(out, again, strict=True))


@pytest.mark.parametrize("name", ["cnn-digits", "gpt-shakespeare"])
def test_snapshotIntoKeptCopies_restoresEachStep_andNeverWritesIntoTheState(name: str) -> None:
    """A deferring engine's snapshots, step after step into the same copies: a restore at step 3
    (from step 2's copies, written again in place) and one at step 4 (after step 3's restore gave
    the optimizer those copies as its state, so the snapshot must make new ones: copies that were
    the optimizer's moments would take the step's update) each give back their step's state; the
    steps run again to the state of a run never restored."""
    cfg, state = trained(name, steps=1)
    _, plain = trained(name, steps=1)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    kept = tensors_mod.StateCopies()
    held: list[int] = []
    for step in (2, 3, 4):
        before = encode_state(state)
        restore = tensors_mod.snapshot(state, kept)
        if step == 3:
            assert [id(t) for t in kept._copies] == held  # written again, not made anew
        held = [id(t) for t in kept._copies]
        engine.run_step(state, step, mode="record")
        if step >= 3:
            restore()
            state.step = step - 1
            assert encode_state(state) == before
            engine.run_step(state, step, mode="record")
        engine.run_step(plain, step, mode="record")
        assert encode_state(state) == encode_state(plain)


def test_hash_isStable_andChangesWithOneUlp() -> None:
    _, state = trained("mlp-digits", steps=1)
    h = state_hash(state)
    assert state_hash(state) == h
    with torch.no_grad():
        w = state.model.fc1.weight
        w[0, 0] = torch.nextafter(w[0, 0].float(), torch.tensor(float("inf"))).double()
    assert state_hash(state) != h


def test_initState_isOnGrid_andDeterministic() -> None:
    cfg = small_cfg("cnn-digits", bits=24)
    a = StepEngine(cfg, get_profile("cpu-1t")).init_state()
    b = StepEngine(cfg, get_profile("splitk-16")).init_state()
    check_on_grid(a, 24)
    assert state_hash(a) == state_hash(b)


def test_offGridFloat_cannotBeEncoded() -> None:
    _, state = trained("mlp-digits", steps=0)
    with torch.no_grad():
        state.model.fc1.bias[0] = 1.0 / 3.0
    with pytest.raises(OffGridError, match=r"param/fc1\.bias"):
        encode_state(state)
    with pytest.raises(OffGridError, match=r"fc1\.bias"):
        check_on_grid(state, 32)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(SMALL))
def test_encode_onCuda_isTheSameBytes_andNamesAnOffGridTensor(name: str) -> None:
    """A state on the GPU (its small tensors converted and copied back together) encodes to the
    bytes it has on CPU; a value off the grid is still found and named."""
    _, state = trained(name)
    data = encode_state(state)
    move_state(state, "cuda")
    assert encode_state(state) == data
    p = next(state.model.parameters())
    with torch.no_grad():
        p.view(-1)[-1] = 1.0 / 3.0
    with pytest.raises(OffGridError, match=next(n for n, q in state.model.named_parameters() if q is p)):
        state_hash(state)


def test_checkOnGrid_usesTheBitsGrid() -> None:
    _, state = trained("mlp-digits", steps=0)
    with torch.no_grad():
        state.model.fc1.bias[0] = rounding.rnd(torch.tensor(1.0 / 3.0, dtype=torch.float64), 32)
    check_on_grid(state, 32)
    with pytest.raises(OffGridError):
        check_on_grid(state, 20)


def test_truncated_isCheckpointError() -> None:
    cfg, state = trained("mlp-digits", steps=1)
    data = encode_state(state)
    for cut in (0, 5, len(STATE_MAGIC) + 3, len(data) // 2, len(data) - 1):
        with pytest.raises(CheckpointError, match=r"truncated|magic"):
            decode_state(data[:cut], cfg)
    assert issubclass(CheckpointError, TranscriptError)


def test_trailingBytes_badMagic_badTag_areCheckpointErrors() -> None:
    cfg, state = trained("mlp-digits", steps=1)
    data = encode_state(state)
    with pytest.raises(CheckpointError, match="trailing"):
        decode_state(data + b"\0", cfg)
    with pytest.raises(CheckpointError, match="magic"):
        decode_state(b"X" + data[1:], cfg)
    i = data.index(b"f32")
    with pytest.raises(CheckpointError, match="dtype tag"):
        decode_state(data[:i] + b"q32" + data[i + 3 :], cfg)


def test_wrongModel_isCheckpointError() -> None:
    _, state = trained("mlp-digits", steps=1)
    data = encode_state(state)
    with pytest.raises(CheckpointError, match="shape"):
        decode_state(data, small_cfg("mlp-digits", model={"hidden": 12}))
    with pytest.raises(CheckpointError, match="do not fit"):
        decode_state(data, small_cfg("cnn-digits"))


def test_parse_rejectsUnsortedNames() -> None:
    _, state = trained("mlp-digits", steps=0)
    data = encode_state(state)
    step, tensors = parse_state(data)
    assert step == 0 and list(tensors) == sorted(tensors)
    swapped = data.replace(b"param/fc1.bias", b"param/zz1.bias")
    with pytest.raises(CheckpointError, match="sorted"):
        parse_state(swapped)
