"""The README's Python example runs as printed: users copy it first, so it must not drift from the API."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def test_readme_pythonExample_trainsAuditsAndOpensATask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = _python_blocks(README.read_text())
    assert len(blocks) == 2, "the README's Python examples changed; run each of them here"
    monkeypatch.chdir(tmp_path)  # the example writes runs/mlp relative to where it runs
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme_example"})
    assert out.getvalue().split() == ["OPEN"]  # what the example's comment says it prints
    assert (tmp_path / "runs" / "mlp" / "leaves.bin").stat().st_size == 21 * 32  # steps 0..20, one leaf each


def test_readme_loadingExample_readsTheFileTaskModelWrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second example loads what `vgame task model` writes (game.delivery's format) into the
    preset's model, with the values of the transcript's final state."""
    import torch

    from game.training.engine.train import train
    from game.training.engine.states import decode_state
    from game.training.task.config import TaskConfig
    from game.training.transcript.reader import Transcript

    blocks = _python_blocks(README.read_text())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "task.toml").write_text('preset = "mlp-digits"\nsteps = 3\n')
    cfg = TaskConfig.for_preset("mlp-digits", steps=3)
    train(cfg, "cpu-1t", tmp_path / "t")
    final = decode_state(Transcript(tmp_path / "t").load_checkpoint(3), cfg).model.state_dict()
    torch.save({k: v.to(torch.float32) for k, v in final.items()}, tmp_path / "model.pt")
    scope: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(blocks[1], str(README), "exec"), scope)
    loaded = scope["model"].state_dict()  # type: ignore[attr-defined]
    assert set(loaded) == set(final) and all(torch.equal(loaded[k], final[k]) for k in final)
