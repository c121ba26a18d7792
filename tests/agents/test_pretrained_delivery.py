"""The client takes a Hugging Face or PEFT model as its library's own ``save_pretrained`` writes it:
a LoRA fine-tune's adapter alone, which ``PeftModel.from_pretrained`` puts onto the base model the
client holds, and a Hugging Face model's config and weights, which ``from_pretrained`` loads."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from game.delivery import fetch_model, write_pretrained
from game.errors import DeliveryError
from game.training.engine.states import decode_state
from game.training.task.config import load_config
from game.training.transcript.reader import Transcript
from tests.agents.conftest import commit

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hf"


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).double()


def _lora(model: nn.Module) -> nn.Module:
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True)
    wrapped = peft.get_peft_model(model, config)
    with torch.no_grad():  # adapters as a fine-tune leaves them (lora_B is zero at first), on the grid
        for name, p in wrapped.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p).float().double())
    return wrapped


def test_aPeftModel_writesItsAdapterAlone_whichLoadsOntoTheBaseModel(tmp_path: Path) -> None:
    base_weights = {k: v.float() for k, v in _gpt2().state_dict().items()}
    wrapped = _lora(_gpt2())
    expected = {k: v.detach().clone() for k, v in wrapped.state_dict().items()}
    values = write_pretrained(wrapped, tmp_path / "adapter")

    written = sorted(p.name for p in (tmp_path / "adapter").iterdir())
    assert written == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert all("lora_" in k for k in saved) and all(t.dtype == torch.float32 for t in saved.values())
    assert values == sum(t.numel() for t in saved.values()) == 2 * 4 * (16 + 48)  # two layers' A and B

    base = transformers.GPT2LMHeadModel(_gpt2().config)
    base.load_state_dict(base_weights)
    loaded = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
    got = loaded.state_dict()
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert torch.equal(got[name].double(), value), name  # float32 holds the grid's values exactly
    assert not list(tmp_path.glob(".vgame-pretrained-*"))  # the staging directory went


def test_aHuggingFaceModel_writesItsConfigAndWeights_whichFromPretrainedLoads(tmp_path: Path) -> None:
    model = _gpt2()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.float().double())
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    write_pretrained(model, tmp_path / "out")
    assert (tmp_path / "out" / "config.json").is_file()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "out"))
    assert loaded.dtype == torch.float32
    for name, value in loaded.state_dict().items():
        assert torch.equal(value.double(), expected[name]), name


def test_aModelWithoutSavePretrained_orATargetNotFree_isRefused_andNothingWritten(tmp_path: Path) -> None:
    with pytest.raises(DeliveryError, match=r"no save_pretrained.*state_dict file"):
        write_pretrained(nn.Linear(2, 2), tmp_path / "x")
    assert not (tmp_path / "x").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(DeliveryError, match="exists and is not empty"):
        write_pretrained(_gpt2(), full)
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    write_pretrained(_gpt2(), empty)  # an empty directory is taken
    assert (empty / "config.json").is_file()


def test_aLoraTask_deliversItsAdapter_theCommittedFinalStatesOwn(
    roles: dict[str, Any],
    post_task: Any,
    make_agents: Any,
    store: Any,
    data_key: bytes,
    tmp_path: Path,
) -> None:
    """End to end: `vgame task model --pretrained` of a task of examples/hf/lora.toml committed on the
    chain writes the adapter of the final state the trainer committed."""
    work = tmp_path / "hf"
    shutil.copytree(EXAMPLES, work, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    cfg = load_config(work / "lora.toml").replace(steps=2, checkpoint_interval=1)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    commit(agents, roles["client"], task_id)
    got = fetch_model(roles["client"], task_id, store, data_key, tmp_path / "adapter", pretrained=True)
    assert got.path == tmp_path / "adapter" and got.steps == 2

    final = decode_state(Transcript(agents.trainer.transcript_dir).load_checkpoint(2), cfg).model
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    own = {k: v for k, v in final.state_dict().items() if "lora_" in k}
    assert len(saved) == len(own) > 0 and got.values == sum(t.numel() for t in saved.values())
    # PEFT's file names drop the adapter's name ("default"), as its loader expects
    for name, value in own.items():
        assert torch.equal(saved[name.replace(".default", "")].double(), value), name
    assert any(value.abs().sum() > 0 for name, value in own.items() if "lora_B" in name)  # trained

    with pytest.raises(DeliveryError, match="exists and is not empty"):
        fetch_model(roles["client"], task_id, store, data_key, tmp_path / "adapter", pretrained=True)
