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
