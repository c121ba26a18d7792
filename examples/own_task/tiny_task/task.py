"""The task: which model, data, loss and optimizer; vgame does the rest.

``task.toml`` beside this package names it (``task = "tiny_task.task:build"``), and every command
(`vgame train`, `audit`, `replay-step`, `calibrate`, `node`, `task model`) loads it from there.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from game.api import Task, load_arrays, task
from tiny_task.model import RowTransformer

DATA = Path(__file__).parent / "digits-600.npz"  # image float32 [600, 8, 8], label int64 [600]
HERE = Path(__file__).parent.parent  # where task.toml is: a relative `init = "..."` is read here


def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["image"]), batch["label"])


@torch.no_grad()
def metrics(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    logits = model(batch["image"])
    return {
        "loss": float(F.cross_entropy(logits, batch["label"])),
        "accuracy": float((logits.argmax(-1) == batch["label"]).double().mean()),
    }


@task(model={"width": 32, "heads": 4, "layers": 2}, params={"warmup": 10, "init": ""}, lr=3e-3, batch_size=32)
def build(cfg):  # type: ignore[no-untyped-def]
    rows = load_arrays(DATA)  # the file's first 500 rows train, the last 100 are held out
    return Task(
        model=lambda: RowTransformer(cfg.model.width, cfg.model.heads, cfg.model.layers, cfg.dropout),
        dataset=rows.select(slice(0, 500)),
        eval_dataset=rows.select(slice(500, None)),
        loss=loss,
        optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01),
        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.params.warmup)),
        metrics=metrics,
        init_weights=HERE / cfg.params.init if cfg.params.init else None,  # fine-tune from a file beside task.toml
    )
