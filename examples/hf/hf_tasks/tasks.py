"""GPT-2 (``GPT2LMHeadModel``) and Llama (``LlamaForCausalLM``) on Tiny Shakespeare's characters, GPT-2
fine-tuned with LoRA adapters (PEFT), and ResNet (``ResNetForImageClassification``) on the 8x8
digits, each a build function of a few lines.

``libraries=("transformers",)`` binds transformers' version into the spec: the model's code is
transformers', so another version is another task. Set ``init`` to a ``.safetensors`` file (for
example the ``vgame task model`` of an earlier run) to fine-tune from it: a relative path is read
beside this package (``examples/hf/``), where every party keeps the same file: the spec binds
its values, not its path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    ResNetConfig,
    ResNetForImageClassification,
)

from game.api import Task, TensorData, TokenWindows, task
from game.training.task import data as packaged

#: Where a relative ``init`` is read from: beside the package, as the configs are.
HERE = Path(__file__).resolve().parent.parent


def init_weights(path: str, adapter: str = "") -> Path | list[Path] | None:
    """The ``init`` key as a file: None when empty, relative paths beside the package; with an
    ``adapter`` directory (PEFT's ``save_pretrained``), both: the base and the adapter to go on from."""
    base = HERE / path if path else None
    if not adapter:
        return base
    if base is None:
        raise ValueError("adapter: give the base model's weights as init as well")
    return [base, HERE / adapter]


def lm_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def shakespeare_lm(
    model: Callable[[], torch.nn.Module], cfg, libraries: tuple[str, ...] = ("transformers",)
) -> Task:  # type: ignore[no-untyped-def]
    """A language model's task on Tiny Shakespeare's characters, in windows of the model's context."""
    windows = cfg.model.block_size
    return Task(
        model=model,
        dataset=TokenWindows(packaged.shakespeare_tokens("train"), windows),
        eval_dataset=TokenWindows(packaged.shakespeare_tokens("test"), windows),
        loss=lm_loss,
        init_weights=init_weights(cfg.params.init, getattr(cfg.params, "adapter", "")),
        libraries=libraries,
    )


def gpt2_config(cfg) -> GPT2Config:  # type: ignore[no-untyped-def]
    """The GPT-2 of ``cfg.model``'s shape, every dropout at ``cfg.dropout``."""
    shape = cfg.model
    return GPT2Config(
        vocab_size=len(packaged.vocab()),
        n_positions=shape.block_size,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=0,
        eos_token_id=0,
    )


@task(
    model={"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16},
    params={"init": ""},
    optimizer="adamw",
    lr=1e-3,
    weight_decay=0.1,
    dropout=0.1,
    batch_size=4,
    steps=50,
)
def gpt2(cfg):  # type: ignore[no-untyped-def]
    """A small GPT-2 language model; embedding, residual and attention dropout at ``cfg.dropout``,
    attention through torch's SDPA (transformers' default)."""
    config = gpt2_config(cfg)
    return shakespeare_lm(lambda: GPT2LMHeadModel(config), cfg)


@task(
    model={"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16},
    params={"init": "", "adapter": "", "rank": 8},
    optimizer="adamw",
    lr=1e-3,
    weight_decay=0.0,
    dropout=0.1,
    batch_size=4,
    steps=50,
)
def gpt2_lora(cfg):  # type: ignore[no-untyped-def]
    """GPT-2 fine-tuned with LoRA: PEFT's ``get_peft_model`` freezes the base model and adds
    rank-``rank`` adapters to its attention and MLP projections, with dropout at ``cfg.dropout``.
    ``init`` names the base model's weights (a GPT-2 checkpoint of this shape, such as the model
    a ``gpt2.toml`` run delivered): vgame puts them in by the base model's names, and the adapters
    keep PEFT's initialisation (``lora_B`` zero: the fine-tune starts as the base model).
    ``adapter`` names an adapter PEFT saved for that base (a directory, such as ``vgame task model
    --pretrained`` of an earlier run of this task) to go on fine-tuning from."""
    from peft import LoraConfig, get_peft_model  # this task alone needs PEFT (the `lora` extra)

    config, rank = gpt2_config(cfg), int(cfg.params.rank)
    lora = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["c_attn", "c_proj", "c_fc"],
        lora_dropout=cfg.dropout,
        fan_in_fan_out=True,  # GPT-2's Conv1D layers hold their weights transposed
    )
    return shakespeare_lm(
        lambda: get_peft_model(GPT2LMHeadModel(config), lora), cfg, libraries=("transformers", "peft")
    )


@task(
    model={"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16},
    params={"init": ""},
    optimizer="adamw",
    lr=1e-3,
    weight_decay=0.1,
    batch_size=4,
    steps=50,
)
def llama(cfg):  # type: ignore[no-untyped-def]
    """A small Llama language model: rotary positions, RMSNorm, SwiGLU, attention through SDPA. Its
    rotary table and its norms compute in float32 on purpose; a step computes those ops in float64
    and rounds them to the grid through the log, as it does every other op."""
    shape = cfg.model
    config = LlamaConfig(
        vocab_size=len(packaged.vocab()),
        hidden_size=shape.n_embd,
        intermediate_size=4 * shape.n_embd,
        num_hidden_layers=shape.n_layer,
        num_attention_heads=shape.n_head,
        num_key_value_heads=shape.n_head,
        max_position_embeddings=shape.block_size,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return shakespeare_lm(lambda: LlamaForCausalLM(config), cfg)


def image_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(pixel_values=images.unsqueeze(1)).logits, labels)


@task(
    model={"embedding": 8, "hidden": [8, 16], "depths": [1, 1]},
    params={"init": ""},
    optimizer="sgd",
    lr=0.05,
    momentum=0.9,
    weight_decay=5e-4,
    batch_size=8,
    steps=50,
)
def resnet(cfg):  # type: ignore[no-untyped-def]
    """A small ResNet (basic blocks, BatchNorm) on the 8x8 digits, one channel."""
    shape = cfg.model
    config = ResNetConfig(
        num_channels=1,
        embedding_size=shape.embedding,
        hidden_sizes=list(shape.hidden),
        depths=list(shape.depths),
        layer_type="basic",
        num_labels=10,
        downsample_in_first_stage=False,
    )
    return Task(
        model=lambda: ResNetForImageClassification(config),
        dataset=TensorData(*packaged.digits_split("train")),
        eval_dataset=TensorData(*packaged.digits_split("test")),
        loss=image_loss,
        init_weights=init_weights(cfg.params.init),
        libraries=("transformers",),
    )
