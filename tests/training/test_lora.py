"""A LoRA fine-tune as people buy it: a Hugging Face model wrapped by PEFT's ``get_peft_model`` in
the factory, fine-tuned from the base model's checkpoint given as ``init_weights``."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from game.errors import ConfigError, TaskCodeError
from game.training.dispatch.initmode import init_module
from game.training.engine.audit import audit
from game.training.engine.replay import replay_transcript_step
from game.training.engine.train import train
from game.training.state.checkpoint import parse_state
from game.training.task import adapters, weights
from game.training.task import data as packaged
from game.training.task.config import load_config
from game.training.transcript.reader import Transcript
from tests.training.test_task_api import trains_and_audits

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TARGETS = ["c_attn", "c_proj"]  # GPT-2's attention and both projections (attn.c_proj, mlp.c_proj)


def _config() -> object:
    return transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2)


def _lora(saved: list[str] | None = None) -> object:
    return peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS, fan_in_fan_out=True, modules_to_save=saved
    )


def _base(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(_config()).double()


def _factory(saved: list[str] | None = None) -> Callable[[], nn.Module]:
    return lambda: peft.get_peft_model(transformers.GPT2LMHeadModel(_config()), _lora(saved))


@pytest.mark.parametrize("saved", [None, ["ln_f"]])
def test_aBaseCheckpoint_fillsAPeftModel_asLoadingTheBaseThenWrappingDoes(
    tmp_path: Path, saved: list[str] | None
) -> None:
    """``init_weights`` given the base model's checkpoint was refused ("the model has no
    lm_head.weight, transformer.h.0.attn.c_attn.bias, ..."): PEFT renames what it wraps. Now the
    wrapped model holds what loading the base model and wrapping it after gives, tensor for
    tensor: every wrapped layer's ``base_layer``, every other tensor, and a module kept with a
    trainable copy (``modules_to_save``) in both copies; the adapters keep the factory's
    initialisation (``lora_B`` zero: the model starts as its base), even with ``strict``."""
    trained = _base(1)
    trained.save_pretrained(tmp_path / "ckpt")
    model = init_module(_factory(saved), seed=2)
    before = {n: t.detach().clone() for n, t in model.state_dict().items()}
    weights.apply(model, tmp_path / "ckpt", strict=True)

    reference = peft.get_peft_model(_base(1), _lora(saved))  # load first, then wrap: outside vgame
    got, want = model.state_dict(), reference.state_dict()
    assert set(got) == set(want)
    lora = {n for n in got if ".lora_" in n}
    assert len(lora) == 2 * 3 * 2  # A and B, three layers a block, two blocks
    assert all(torch.equal(got[n], want[n].to(got[n].dtype)) for n in set(got) - lora)
    assert all(torch.equal(got[n], before[n]) for n in lora)
    if saved:
        kept = "base_model.model.transformer.ln_f.modules_to_save.default.weight"
        assert torch.equal(got[kept], trained.transformer.ln_f.weight)
    x = torch.randint(0, 32, (2, 8))
    model.eval(), trained.eval()
    assert torch.equal(model(input_ids=x).logits, trained(input_ids=x).logits)


OTHERS = {
    "ia3": lambda: peft.IA3Config(
        target_modules=["c_attn", "c_fc"], feedforward_modules=["c_fc"], fan_in_fan_out=True
    ),
    "vera": lambda: peft.VeraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True),
    "prompt": lambda: peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3),
}


@pytest.mark.parametrize("method", list(OTHERS))
def test_peftsOtherMethods_areFilledAlike_whatTheyAddKeepingItsInitialisation(
    tmp_path: Path, method: str
) -> None:
    """IA3's scales, VeRA's shared projections (held beside its layers' own vectors) and prompt
    tuning's virtual tokens (held beside the base model, whose path is then ``base_model.``) are
    the method's own: the base checkpoint fills everything else, with ``strict``."""
    model = init_module(
        lambda: peft.get_peft_model(transformers.GPT2LMHeadModel(_config()), OTHERS[method]()), seed=2
    )
    before = {n: t.detach().clone() for n, t in model.state_dict().items()}
    weights.apply(model, _base(1).state_dict(), strict=True)
    reference = peft.get_peft_model(_base(1), OTHERS[method]()).state_dict()
    view = adapters.unwrapped(model, model.state_dict(keep_vars=True))
    got = model.state_dict()
    assert view.adapters and set(got) == set(reference)
    assert all(torch.equal(got[n], before[n]) for n in view.adapters)
    assert all(torch.equal(got[n], reference[n].to(got[n].dtype)) for n in set(got) - view.adapters)


def test_aCheckpointTheBaseModelLacks_orABaseTensorMissing_isStillRefused(tmp_path: Path) -> None:
    """Reading the wrapped model by its base names does not loosen the checks: a tensor the base
    model has no place for is refused, and with ``strict`` so is a base tensor not given (only the
    adapters' own may be absent)."""
    state = _base(1).state_dict()
    extra = {**state, "transformer.h.9.attn.c_attn.weight": state["transformer.h.0.attn.c_attn.weight"]}
    with pytest.raises(ConfigError, match=r"the model has no transformer\.h\.9\.attn\.c_attn\.weight"):
        weights.apply(init_module(_factory(), seed=2), extra, strict=False)
    lacking = {n: t for n, t in state.items() if n != "transformer.h.1.mlp.c_fc.weight"}
    with pytest.raises(ConfigError, match=r"no values for transformer\.h\.1\.mlp\.c_fc\.weight"):
        weights.apply(init_module(_factory(), seed=2), lacking, strict=True)
    weights.apply(init_module(_factory(), seed=2), lacking, strict=False)


def test_theWrappedModelsOwnNames_stillFillIt(tmp_path: Path) -> None:
    """Weights that name the wrapped model's own tensors (an earlier run of it, as ``vgame task
    model`` writes it) fill it as they did before, the adapters' values included."""
    earlier = init_module(_factory(), seed=5)
    with torch.no_grad():
        for name, t in earlier.named_parameters():
            if ".lora_B" in name:
                t.fill_(0.25)
    model = init_module(_factory(), seed=2)
    weights.apply(model, earlier.state_dict(), strict=True)
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), earlier.state_dict().values(), strict=True)
    )


class _Adapted(nn.Module):
    """A hand-written LoRA layer in PEFT's layout (no PEFT)."""

    adapter_layer_names = ("lora_A", "lora_B")

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.ModuleDict({"x": nn.Linear(base.in_features, 2, bias=False)})
        self.lora_B = nn.ModuleDict({"x": nn.Linear(2, base.out_features, bias=False)})


def test_namesAreRead_fromTheModelsStructure_notFromItsPeftImport() -> None:
    """A module holding a ``base_layer`` and listing ``adapter_layer_names`` is read as a tuner
    layer whoever wrote it; a module merely named ``base_layer`` in a model with no such layer
    keeps its name, and a model without wrappers is read as it is."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    net[0] = _Adapted(net[0])  # type: ignore[assignment]
    view = adapters.unwrapped(net, net.state_dict())
    assert view.names == {"0.weight": ["0.base_layer.weight"], "0.bias": ["0.base_layer.bias"]}
    assert view.adapters == {"0.lora_A.x.weight", "0.lora_B.x.weight"}

    plain = nn.Module()
    plain.base_layer = nn.Linear(2, 2)
    assert adapters.unwrapped(plain, plain.state_dict()).names == {
        "base_layer.weight": ["base_layer.weight"],
        "base_layer.bias": ["base_layer.bias"],
    }
    assert not adapters.unwrapped(plain, plain.state_dict()).wrapped


def test_aLoraFineTune_trainsOnlyItsAdapters_andAuditsOnAnotherProfile(tmp_path: Path) -> None:
    """The whole run: GPT-2 wrapped by ``get_peft_model`` in the factory, fine-tuned from its base
    checkpoint with dropout on the adapters, trains on ``cpu-1t``, audits on ``noisy`` and a
    judge's re-run of a step agrees; PEFT froze the base, so the run's last state differs from
    leaf 0 in the adapters alone."""
    body = """
        from pathlib import Path
        import torch, torch.nn.functional as F
        import peft, transformers
        from game.api import Task, task

        HERE = Path(__file__).parent


        def model():
            config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2)
            lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"],
                                   lora_dropout=0.1, fan_in_fan_out=True)
            return peft.get_peft_model(transformers.GPT2LMHeadModel(config), lora)


        def loss(m, b):
            x = (b["x"].abs() * 7).long() % 32
            tokens = torch.cat([x, x.flip(1)], 1)
            logits = m(input_ids=tokens[:, :-1]).logits
            return F.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))


        @task(lr=0.01, batch_size=8, steps=4, optimizer="adamw")
        def build(cfg):
            return Task(model=model, dataset=HERE / "data.npz", loss=loss,
                        init_weights=HERE / "base.safetensors", libraries=("transformers", "peft"))
        """
    base = _base(1).state_dict()

    def prepare(pkg: Path) -> None:
        (pkg / "base.safetensors").write_bytes(weights.save(base, pkg / "base.safetensors"))

    trains_and_audits(tmp_path / "lora", body, prepare, checkpoint_interval=2)
    transcript = tmp_path / "lora" / "t"
    assert replay_transcript_step(transcript, 3, "splitk-16").matches_transcript

    reader = Transcript(transcript)
    (_, first), (_, last) = (parse_state(reader.load_checkpoint(s)) for s in (0, 4))
    params = {n for n in first if n.startswith("param/")}
    changed = {n for n in params if not torch.equal(first[n], last[n])}
    assert changed and all(".lora_" in n for n in changed)
    assert len(changed) == len({n for n in params if ".lora_" in n})  # each adapter trained
    kept = "param/base_model.model.transformer.h.0.attn.c_attn.base_layer.weight"
    assert torch.equal(first[kept].double(), base["transformer.h.0.attn.c_attn.weight"].float().double())


def test_theLoraExample_fineTunesTheGpt2ExamplesModel_andAuditsOnTwoProfiles(tmp_path: Path) -> None:
    """``examples/hf/lora.toml`` given a GPT-2 checkpoint of the ``gpt2.toml`` example's shape as
    ``init``: leaf 0 holds it in every wrapped layer's ``base_layer``, and the run audits on
    ``noisy`` and ``splitk-16``."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    hf = tmp_path / "hf"
    shutil.copytree(examples / "hf", hf, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    cfg = load_config(hf / "lora.toml")
    torch.manual_seed(3)
    shape = cfg.model
    config = transformers.GPT2Config(
        vocab_size=len(packaged.vocab()), n_positions=shape.block_size, n_embd=shape.n_embd,
        n_layer=shape.n_layer, n_head=shape.n_head, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    base = transformers.GPT2LMHeadModel(config).state_dict()
    (hf / "base.safetensors").write_bytes(weights.save(base, Path("w.safetensors")))
    cfg = cfg.replace(steps=6, checkpoint_interval=3, init=str(hf / "base.safetensors"))
    trained = train(cfg, "cpu-1t", tmp_path / "run")
    for profile in ("noisy", "splitk-16"):
        report = audit(tmp_path / "run", profile)
        assert report.match and report.trainer_state_root == trained.state_root, profile
    _, start = parse_state(Transcript(tmp_path / "run").load_checkpoint(0))
    for name in ("h.0.attn.c_attn", "h.1.mlp.c_fc", "h.1.mlp.c_proj"):
        kept = start[f"param/base_model.model.transformer.{name}.base_layer.weight"]
        assert torch.equal(kept, base[f"transformer.{name}.weight"])
    assert set(cfg.inputs().libraries) == {"transformers", "peft"}


def test_adaptersPeftComputesFromTheBaseWeights_areRefusedNamingTheWay_whichWorks(tmp_path: Path) -> None:
    """``init_lora_weights="pissa"`` (or OLoRA, CorDA, LoftQ) decomposes the base weights in the
    factory, before ``init_weights`` replaces them, and on the machine's own SVD: the factory's
    error (PEFT refuses float64 first) says so and names the way, and that way trains and audits:
    the model wrapped once outside vgame, its state given as ``init_weights`` to a factory that
    wraps with ``init_lora_weights=True``."""
    for how in ("pissa", "olora"):
        lora = peft.LoraConfig(r=4, target_modules=TARGETS, fan_in_fan_out=True, init_lora_weights=how)
        with pytest.raises(TaskCodeError, match=r"computes such adapters from the base model's weights"):
            init_module(
                lambda c=lora: peft.get_peft_model(transformers.GPT2LMHeadModel(_config()), c), seed=2
            )
    model = init_module(_factory(), seed=2)
    model.peft_config["default"].init_lora_weights = "pissa"  # as a PEFT that allowed float64 would leave it
    with pytest.raises(ConfigError, match=r"init_lora_weights='pissa': PEFT computes such adapters"):
        weights.apply(model, _base(1).state_dict(), strict=True)
    dora = peft.LoraConfig(r=4, target_modules=TARGETS, fan_in_fan_out=True, use_dora=True)
    model = init_module(lambda: peft.get_peft_model(transformers.GPT2LMHeadModel(_config()), dora), seed=2)
    with pytest.raises(
        ConfigError, match=r"use_dora=True: PEFT computes such adapters .* DoRA takes their norms"
    ):
        weights.apply(model, _base(1).state_dict(), strict=True)

    torch.manual_seed(1)
    base = transformers.GPT2LMHeadModel(_config())  # float32, as PiSSA wants it
    lora = peft.LoraConfig(r=4, target_modules=TARGETS, fan_in_fan_out=True, init_lora_weights="pissa")
    pissa = peft.get_peft_model(base, lora).state_dict()
    body = PISSA.replace("TARGETS", repr(TARGETS))

    def prepare(pkg: Path) -> None:
        (pkg / "pissa.safetensors").write_bytes(weights.save(pissa, pkg / "pissa.safetensors"))

    trains_and_audits(tmp_path / "pissa", body, prepare, checkpoint_interval=2)
    _, start = parse_state(Transcript(tmp_path / "pissa" / "t").load_checkpoint(0))
    held = {n: t for n, t in pissa.items() if n != "base_model.model.lm_head.weight"}  # tied to wte
    for name, t in held.items():
        assert torch.equal(start[f"param/{name}"], t), name
    assert any(".lora_B." in n and t.abs().sum() > 0 for n, t in held.items())  # PiSSA's: not zero


PISSA = """
    from pathlib import Path
    import torch.nn.functional as F
    import peft, transformers
    from game.api import Task, task

    HERE = Path(__file__).parent


    def model():
        config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2)
        lora = peft.LoraConfig(r=4, target_modules=TARGETS, fan_in_fan_out=True, init_lora_weights=True)
        return peft.get_peft_model(transformers.GPT2LMHeadModel(config), lora)


    def loss(m, b):
        tokens = (b["x"].abs() * 7).long() % 32
        logits = m(input_ids=tokens[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))


    @task(lr=0.01, batch_size=8, steps=4, optimizer="adamw")
    def build(cfg):
        return Task(model=model, dataset=HERE / "data.npz", loss=loss, init_weights=HERE / "pissa.safetensors",
                    libraries=("transformers", "peft"))
    """


def test_aClassifierFineTune_fromAHeadlessCheckpoint_fillsTheEncoder_andNamesTheNewHead() -> None:
    """PEFT's sequence classification (``TaskType.SEQ_CLS``) keeps the new head in
    ``modules_to_save``; a headless BERT checkpoint (no ``bert.`` prefix) fits the wrapped model's
    encoder by the inner model's ``base_model_prefix``. With ``strict`` the head is named by the
    names a checkpoint would give it, as ``from_pretrained`` warns of a new head; without, it keeps
    the factory's initialisation."""
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
    )
    torch.manual_seed(1)
    encoder = transformers.BertModel(config).state_dict()

    def factory() -> nn.Module:
        lora = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=4, target_modules=["query", "value"])
        return peft.get_peft_model(transformers.BertForSequenceClassification(config), lora)

    with pytest.raises(
        ConfigError, match=r"no values for classifier\.bias, classifier\.weight \(pass init_strict"
    ):
        weights.apply(init_module(factory, seed=2), encoder, strict=True)
    model = init_module(factory, seed=2)
    head = model.base_model.model.classifier.original_module.weight.detach().clone()
    weights.apply(model, encoder, strict=False)
    got = model.state_dict()
    query = "base_model.model.bert.encoder.layer.1.attention.self.query.base_layer.weight"
    assert torch.equal(got[query], encoder["encoder.layer.1.attention.self.query.weight"].double())
    assert torch.equal(
        got["base_model.model.bert.embeddings.word_embeddings.weight"],
        encoder["embeddings.word_embeddings.weight"].double(),
    )
    assert torch.equal(got["base_model.model.classifier.original_module.weight"], head)


def _trained_adapters(model: nn.Module, seed: int) -> None:
    """Give ``model``'s adapters (and a kept module's trainable copy) values a fine-tune might have
    left, on the float32 grid (``lora_B`` is zero at first, which would hide a tensor left out)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name or ".modules_to_save." in name:
                p.copy_((p + torch.randn_like(p)).float().double())


@pytest.mark.parametrize("dora", [False, True])
def test_anAdapterPeftSaved_besideItsBase_goesOnFromBoth_asPeftsLoaderPutsThem(
    tmp_path: Path, dora: bool
) -> None:
    """To go on fine-tuning an adapter PEFT saved (``save_pretrained``: its names lose the adapter's
    name, DoRA's magnitudes lose ``.default.weight``, a kept module's copy is saved by its base
    name), ``init_weights`` takes the base checkpoint and the adapter's directory together: the
    wrapped model then holds what ``PeftModel.from_pretrained`` on the base gives, tensor for
    tensor. DoRA's magnitudes, given, are no longer the base's norms to refuse."""
    lora = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS, fan_in_fan_out=True, modules_to_save=["ln_f"], use_dora=dora
    )  # fmt: skip
    tuned = peft.get_peft_model(_base(1), lora)
    _trained_adapters(tuned, seed=7)
    tuned.save_pretrained(tmp_path / "adapter")
    _base(1).float().save_pretrained(tmp_path / "base")

    model = init_module(lambda: peft.get_peft_model(transformers.GPT2LMHeadModel(_config()), lora), seed=2)
    weights.apply(model, [tmp_path / "base", tmp_path / "adapter"], strict=True)
    reference = peft.PeftModel.from_pretrained(
        transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "base"), tmp_path / "adapter"
    ).state_dict()
    got = model.state_dict()
    assert set(got) == set(reference)
    for name, value in got.items():
        assert torch.equal(value, reference[name].to(value.dtype)), name
    moved = [n for n in got if ".lora_" in n or ".modules_to_save." in n]
    assert moved and all(torch.equal(got[n], tuned.state_dict()[n]) for n in moved)
    if dora:
        with pytest.raises(ConfigError, match="use_dora=True"):  # the base alone: still refused
            weights.apply(model, tmp_path / "base", strict=True)


def test_twoSourcesGivingOneName_orAnAdapterOfAnotherShape_areRefused(tmp_path: Path) -> None:
    base = _base(1).state_dict()
    with pytest.raises(ConfigError, match=r"transformer\.wte\.weight given by two of the sources"):
        weights.load([base, {"transformer.wte.weight": base["transformer.wte.weight"]}])
    with pytest.raises(ConfigError, match="an empty list"):
        weights.load([])
    other = peft.LoraConfig(r=2, target_modules=TARGETS, fan_in_fan_out=True)
    peft.get_peft_model(_base(1), other).save_pretrained(tmp_path / "r2")
    with pytest.raises(
        ConfigError, match=r"lora_A\.default\.weight has shape \(2, 16\), the model's is \(4, 16\)"
    ):
        weights.apply(init_module(_factory(), seed=2), [base, tmp_path / "r2"], strict=True)


def test_theLoraExample_goesOnFromTheAdapterItDelivered_andAuditsOnAnotherProfile(tmp_path: Path) -> None:
    """``examples/hf/lora.toml`` run twice: the first run's adapter, as ``vgame task model
    --pretrained`` writes it (``delivery.write_pretrained``), is the second run's ``adapter`` beside
    the same base: leaf 0 of the second is the first's final adapters on that base, and it audits."""
    from game.delivery import write_pretrained
    from game.training.engine.states import decode_state

    examples = Path(__file__).resolve().parents[2] / "examples"
    hf = tmp_path / "hf"
    shutil.copytree(examples / "hf", hf, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    cfg = load_config(hf / "lora.toml").replace(steps=3, checkpoint_interval=3)
    first = train(cfg, "cpu-1t", tmp_path / "first")
    final = decode_state(Transcript(tmp_path / "first").load_checkpoint(3), cfg).model
    base = {
        k.replace(".base_layer", ""): v
        for k, v in final.get_base_model().state_dict().items()
        if ".lora_" not in k
    }
    (hf / "base.safetensors").write_bytes(weights.save(base, Path("w.safetensors")))
    tuned = {k: v.clone() for k, v in final.state_dict().items() if ".lora_" in k}
    write_pretrained(final, hf / "adapter")

    again = cfg.replace(init=str(hf / "base.safetensors"), adapter=str(hf / "adapter"))
    second = train(again, "cpu-1t", tmp_path / "second")
    _, start = parse_state(Transcript(tmp_path / "second").load_checkpoint(0))
    assert tuned and all(torch.equal(start[f"param/{n}"], v) for n, v in tuned.items())
    assert any(".lora_B." in n and v.abs().sum() > 0 for n, v in tuned.items())
    report = audit(tmp_path / "second", "noisy")
    assert report.match and report.trainer_state_root == second.state_root != first.state_root
