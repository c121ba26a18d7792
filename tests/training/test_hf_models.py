"""Models no one here wrote (issue 43): Hugging Face's GPT-2, Llama and ResNet, built from their configs
with random initialisation (nothing downloaded), and a model with stock ``nn.Dropout`` and
``F.scaled_dot_product_attention`` (examples/own_task), train through the public task API on
``cpu-1t`` and audit bit-exactly on ``noisy`` and ``splitk-16``, for 50 steps, from their seed and
fine-tuned from the weights an earlier run delivered. ``examples/`` holds the tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from game.training.engine.audit import audit
from game.training.engine.states import decode_state
from game.training.engine.train import train
from game.training.task.config import load_config
from game.training.task.weights import save
from game.training.transcript.reader import Transcript

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: task -> (its directory under examples/, its config there)
TASKS = {
    "gpt2": ("hf", "gpt2.toml"),
    "llama": ("hf", "llama.toml"),  # float32 on purpose in its rotary table and norms
    "resnet": ("hf", "resnet.toml"),
    "own": ("own_task", "task.toml"),
}
STEPS = 50


@pytest.fixture(scope="module")
def examples_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of examples/ (the fine-tuning test writes its weights beside each task's config)."""
    work = tmp_path_factory.mktemp("examples")
    shutil.copytree(EXAMPLES, work / "examples", ignore=shutil.ignore_patterns("__pycache__", "runs"))
    return work / "examples"


def _train_and_audit(cfg_path: Path, out: Path, **overrides: object) -> bytes:
    cfg = load_config(cfg_path)
    cfg = cfg.replace(steps=STEPS, checkpoint_interval=25, **overrides)
    trained = train(cfg, "cpu-1t", out)
    assert trained.final_loss is not None and trained.steps_run == STEPS
    for profile in ("noisy", "splitk-16"):
        report = audit(out, profile)
        assert report.match, (profile, report.to_dict())
        assert report.trainer_state_root == trained.state_root
        assert report.rejected_log_steps == ()
    return trained.state_root


@pytest.mark.parametrize("name", list(TASKS))
def test_model_trainsOnCpu1t_andAuditsBitExactly_fromSeed_andFineTuned(examples_dir: Path, name: str) -> None:
    where, config = TASKS[name]
    hf_dir = examples_dir / where
    cfg_path = hf_dir / config
    first = hf_dir / "runs" / f"{name}-seed"
    root = _train_and_audit(cfg_path, first)
    cfg = load_config(cfg_path)
    assert set(cfg.inputs().libraries) == ({"transformers"} if where == "hf" else set())
    # the model that run delivered, as `vgame task model` writes it (float32: lossless on the grid)
    final = decode_state(
        Transcript(first).load_checkpoint(STEPS), Transcript(first).config
    ).model.state_dict()
    weights = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in final.items()}
    (hf_dir / f"{name}-start.safetensors").write_bytes(save(weights, Path("w.safetensors")))
    tuned = hf_dir / "runs" / f"{name}-tuned"
    # an absolute path (a relative one is read beside the task's package, which a process that
    # imported another copy of the package earlier would take from that copy)
    tuned_root = _train_and_audit(cfg_path, tuned, init=str(hf_dir / f"{name}-start.safetensors"))
    assert tuned_root != root
    # leaf 0 of the fine-tune is the given weights on the grid (float32 values are on it already)
    t = Transcript(tuned)
    assert t.config.inputs().init is not None
    start = decode_state(t.load_checkpoint(0), t.config).model.state_dict()
    for key, value in weights.items():
        assert torch.equal(start[key].to(value.dtype), value), key


#: examples/hf_families' families held here (the rest: docs/benchmarks.md, "Hugging Face families")
FAMILIES = ["Qwen2", "Qwen3", "Mistral", "Gemma", "Gemma2", "Phi3", "Starcoder2", "GPTNeoX", "Falcon", "Bloom",
            "Mixtral", "T5", "ConvNext", "GPTJ", "Wav2Vec2", "Phimoe", "Mra"]  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_modelFamilies_auditBitExactly_acrossTheTwoInterceptors(tmp_path: Path, family: str) -> None:
    """transformers' families (examples/hf_families) train on ``cpu-1t`` through the C++ front and
    audit bit for bit on ``noisy`` through the Python mode. Most decoders compute their rotary
    tables and RMSNorms in float32 on purpose (each such op rounded by way of its float64 twin, in
    the same place in the log on both); Falcon splits its fused query-key-value projection by
    advanced indexing (``fused_qkv[..., [-2], :]``), whose backward the two interceptors saw as ops
    of two names (optable.LOG_NAMES); T5 takes the log of 0 in its relative-position buckets, an
    inf that passes the rounding as it is; ConvNeXt takes its stochastic-depth rates from
    ``torch.linspace`` at construction, served exactly there; GPT-J builds a sinusoid table in
    float64 at construction (``pow``, ``sin``, ``cos``: each value rounded to nearest float32);
    Wav2Vec2 takes a weight norm at construction (its norm served exactly) and draws SpecAugment's
    masks from numpy's global generator (seeded per micro-batch), so the auditor masks the same
    time steps; Phimoe's router draws Gumbel noise (``exponential_``, served) and adds a Python
    float to a boolean mask, a float32 result in torch's default dtype (rounded by way of its twin
    under a float64 default); MRA casts its queries and keys to float32 on purpose and multiplies
    them with float64 tensors, a mix torch refuses (each such call run as its float64 twin)."""
    cfg = load_config(EXAMPLES / "hf_families" / "task.toml").replace(
        model={"family": family}, checkpoint_interval=3
    )
    trained = train(cfg, "cpu-1t", tmp_path / "run")
    assert trained.steps_run == 3 and trained.final_loss is not None
    report = audit(tmp_path / "run", "noisy")
    assert report.match, report.to_dict()
    assert report.trainer_state_root == trained.state_root
    assert report.corrections > 0


def test_aMixtureOfExperts_onTorchsGroupedMatmul_isRefusedSayingHowToRunItsExperts(tmp_path: Path) -> None:
    """transformers runs a mixture-of-experts model's experts through ``torch._grouped_mm`` by default,
    which has no float64 kernel: the step stops at step 1 naming the op and the config switch, not
    with torch's own error from deep inside the model."""
    from game.errors import UnsupportedOpError

    cfg = load_config(EXAMPLES / "hf_families" / "task.toml").replace(
        model={"family": "Mixtral", "experts": "grouped_mm"}
    )
    with pytest.raises(
        UnsupportedOpError, match=r"step 1: aten\._grouped_mm\.default .*experts_implementation"
    ):
        train(cfg, "cpu-1t", tmp_path / "run")


RWKV_PY = """
import torch.nn.functional as F
import transformers
from transformers.initialization import no_init_weights
from game.api import Task, TokenWindows, task
from game.training.task import data as packaged


def rwkv():
    return transformers.RwkvForCausalLM(transformers.RwkvConfig(
        vocab_size=len(packaged.vocab()), hidden_size=16, num_hidden_layers=2, attention_hidden_size=16,
        intermediate_size=32, context_length=16))


def lm_loss(model, batch):
    inputs, targets = batch
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@task(model={}, params={"init": "", "skip_init": 0}, optimizer="adamw", lr=1e-3, batch_size=2, steps=2)
def build(cfg):
    def make():
        if not cfg.params.skip_init:
            return rwkv()
        with no_init_weights():  # its own initialisation is a QR factorisation: the weights come from init
            return rwkv()
    return Task(model=make, dataset=TokenWindows(packaged.shakespeare_tokens("train"), 8), loss=lm_loss,
                init_weights=cfg.params.init or None, libraries=("transformers",))
"""


def test_rwkvsOrthogonalInitialisation_isServed_andItsFineTuneWorksToo(tmp_path: Path) -> None:
    """RWKV initialises its weights orthogonally, a QR factorisation, which LAPACK gives with other
    last bits on another machine: construction refused it, naming the op and the way to fine-tune
    such a model. It is served now (Householder's, in a fixed order): the model trains with its own
    initialisation and audits bit-exactly. Built without it (transformers' ``no_init_weights``),
    with the weights given, it trains and audits bit-exactly too, and leaf 0 is those weights."""
    from .test_task_api import make_plugin

    name = make_plugin(tmp_path, RWKV_PY)
    cfg = load_config(tmp_path / "task.toml")
    own = train(cfg, "cpu-1t", tmp_path / "own")
    assert own.steps_run == 2
    report = audit(tmp_path / "own", "noisy")
    assert report.match and report.trainer_state_root == own.state_root, report.to_dict()
    module = __import__(f"{name}.tasks", fromlist=["rwkv"])
    weights = {k: v.detach().clone().contiguous() for k, v in module.rwkv().state_dict().items()}
    (tmp_path / "w.safetensors").write_bytes(save(weights, Path("w.safetensors")))
    tuned = cfg.replace(params={"init": str(tmp_path / "w.safetensors"), "skip_init": 1})
    trained = train(tuned, "cpu-1t", tmp_path / "run")
    assert trained.steps_run == 2 and trained.state_root != own.state_root
    report = audit(tmp_path / "run", "noisy")
    assert report.match and report.trainer_state_root == trained.state_root, report.to_dict()
    t = Transcript(tmp_path / "run")
    start = decode_state(t.load_checkpoint(0), t.config).model.state_dict()
    for key, value in weights.items():
        assert torch.equal(start[key].to(value.dtype), value), key


PADDED_PY = """
import torch
import torch.nn.functional as F
import transformers
from game.api import Task, TokenWindows, task
from game.training.task import data as packaged


def padded_loss(model, batch):
    inputs, targets = batch
    keep = torch.ones_like(inputs)
    keep[0, :3] = 0  # the first window is padded on the left: its first queries see no key at all
    logits = model(input_ids=inputs, attention_mask=keep).logits[:, 3:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[:, 3:].reshape(-1))


@task(model={}, params={"attention": "eager"}, optimizer="adamw", lr=1e-3, batch_size=2, steps=2)
def build(cfg):
    config = transformers.LlamaConfig(
        vocab_size=len(packaged.vocab()), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16, pad_token_id=0,
        bos_token_id=0, eos_token_id=0, attn_implementation=cfg.params.attention)
    return Task(model=lambda: transformers.LlamaForCausalLM(config), loss=padded_loss,
                dataset=TokenWindows(packaged.shakespeare_tokens("train"), 8), libraries=("transformers",))
"""


def test_eagerAttention_overALeftPaddedBatch_trainsAndAudits_asSdpaDoes(tmp_path: Path) -> None:
    """Eager attention masks with ``torch.finfo(dtype).min``, float64's largest: a padded query's
    row, masked on every key, was ``-inf`` throughout and its softmax NaN (step 1 stopped). It is
    the grid's largest, as float32's is on float32 hardware: the row is finite, the step trains and
    audits bit-exactly, and its state root is the one through SDPA (whose masked scores are a finite
    fill)."""
    from .test_task_api import make_plugin

    make_plugin(tmp_path, PADDED_PY)
    cfg = load_config(tmp_path / "task.toml")
    roots = []
    for attention in ("eager", "sdpa"):
        trained = train(cfg.replace(params={"attention": attention}), "cpu-1t", tmp_path / attention)
        report = audit(tmp_path / attention, "noisy")
        assert report.match and report.trainer_state_root == trained.state_root, report.to_dict()
        roots.append(trained.state_root)
    assert roots[0] == roots[1]


SAMPLED_TASK = """
from pathlib import Path
import torch
from game.api import Task, task
import transformers

class Prompts(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return {"input_ids": torch.tensor([1 + i % 7, 2 + i % 5, 3])}

def model():
    cfg = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=31, pad_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)

def loss(m, b):
    ids = b["input_ids"]
    with torch.no_grad():
        out = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=8, top_p=0.9, temperature=0.8, max_new_tokens=4, pad_token_id=0)
    logits = m(out).logits[:, :-1]
    logp = torch.log_softmax(logits, -1).gather(-1, out[:, 1:, None]).squeeze(-1)
    reward = (out[:, 3:] % 2 == 0).double().mean(1, keepdim=True)
    return -(logp[:, 2:] * reward).mean()

@task(lr=0.01, batch_size=8, steps=3, optimizer="adamw")
def build(cfg):
    return Task(model=model, dataset=Prompts(), loss=loss, libraries=("transformers",))
"""


def test_aPolicyGradientStep_samplingWithGenerate_trainsAndAudits(tmp_path: Path) -> None:
    """Reinforcement-style fine-tuning: the loss samples continuations with ``generate`` (top-k,
    top-p, temperature: ``torch.multinomial`` on the filtered distribution, served) and weights
    their log-probabilities by a reward. Another profile replays it bit for bit."""
    from tests.training.test_task_api import trains_and_audits

    trains_and_audits(tmp_path, SAMPLED_TASK)
