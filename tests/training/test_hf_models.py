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


FAMILY_PY = """
import torch.nn.functional as F
import transformers
from game.api import Task, TokenWindows, task
from game.training.task import data as packaged

LLAMA_LIKE = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8, max_position_embeddings=16)
#: family -> (config class, model class, sizes)
FAMILIES = {
    "Qwen2": ("Qwen2Config", "Qwen2ForCausalLM", LLAMA_LIKE),
    "Qwen3": ("Qwen3Config", "Qwen3ForCausalLM", LLAMA_LIKE),
    "Mistral": ("MistralConfig", "MistralForCausalLM", LLAMA_LIKE),
    "Gemma": ("GemmaConfig", "GemmaForCausalLM", LLAMA_LIKE),
    "Gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(LLAMA_LIKE, num_hidden_layers=2)),
    "Phi3": ("Phi3Config", "Phi3ForCausalLM", LLAMA_LIKE),
    "Starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", LLAMA_LIKE),
    "GPTNeoX": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=16, intermediate_size=32,
                num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=16)),
    "Falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=16, num_hidden_layers=1,
               num_attention_heads=2, new_decoder_architecture=False)),
    "Bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=16, n_layer=1, n_head=2)),
    # mixture of experts: top-k routing, each expert's rows gathered and added back by index
    "Mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(LLAMA_LIKE, num_local_experts=4,
                num_experts_per_tok=2, experts_implementation="eager")),
    "MixtralGrouped": ("MixtralConfig", "MixtralForCausalLM", dict(LLAMA_LIKE, num_local_experts=4,
                       num_experts_per_tok=2)),
    # an encoder-decoder: relative-position buckets through a log of 0 on lanes it then drops (an
    # inf, which passes), a float64 attention mask of finfo.min added to the scores
    "T5": ("T5Config", "T5ForConditionalGeneration", dict(d_model=16, d_kv=8, d_ff=32, num_layers=1,
           num_heads=2, relative_attention_num_buckets=8, decoder_start_token_id=0)),
}


def lm_loss(model, batch):
    inputs, targets = batch
    if model.config.is_encoder_decoder:  # the targets are the decoder's labels
        return model(input_ids=inputs, labels=targets).loss
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@task(model={}, params={"family": ""}, optimizer="adamw", lr=1e-3, batch_size=2, steps=3)
def build(cfg):
    config_class, model_class, sizes = FAMILIES[cfg.params.family]
    config = getattr(transformers, config_class)(
        vocab_size=len(packaged.vocab()), bos_token_id=0, eos_token_id=0, pad_token_id=0, **sizes
    )
    model = getattr(transformers, model_class)
    return Task(model=lambda: model(config), dataset=TokenWindows(packaged.shakespeare_tokens("train"), 8),
                loss=lm_loss, libraries=("transformers",))
"""


@pytest.mark.parametrize(
    "family",
    [
        "Qwen2",
        "Qwen3",
        "Mistral",
        "Gemma",
        "Gemma2",
        "Phi3",
        "Starcoder2",
        "GPTNeoX",
        "Falcon",
        "Bloom",
        "Mixtral",
        "T5",
    ],
)
def test_decoderFamilies_auditBitExactly_acrossTheTwoInterceptors(tmp_path: Path, family: str) -> None:
    """transformers' decoder families train on ``cpu-1t`` through the C++ front and audit bit for
    bit on ``noisy`` through the Python mode. Most compute their rotary tables and RMSNorms in
    float32 on purpose (each such op rounded by way of its float64 twin, in the same place in the
    log on both); Falcon splits its fused query-key-value projection by advanced indexing
    (``fused_qkv[..., [-2], :]``), whose backward the two interceptors saw as ops of two names
    (optable.LOG_NAMES); T5 takes the log of 0 in its relative-position buckets, an inf that
    passes the rounding as it is."""
    from .test_task_api import make_plugin

    make_plugin(tmp_path, FAMILY_PY)
    cfg = load_config(tmp_path / "task.toml").replace(params={"family": family}, checkpoint_interval=3)
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

    from .test_task_api import make_plugin

    make_plugin(tmp_path, FAMILY_PY)
    cfg = load_config(tmp_path / "task.toml").replace(params={"family": "MixtralGrouped"})
    with pytest.raises(
        UnsupportedOpError, match=r"step 1: aten\._grouped_mm\.default .*experts_implementation"
    ):
        train(cfg, "cpu-1t", tmp_path / "run")
