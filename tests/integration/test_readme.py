"""The README's Python example runs as printed: users copy it first, so it must not drift from the API."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


#: The first line of the README's excerpt of the example task (read against the file, not run).
EXCERPT = "# examples/own_task/tiny_task/task.py (abridged)"


def _python_blocks(text: str) -> list[str]:
    found = re.findall(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    return [b for b in found if not b.startswith(EXCERPT)]


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_readme_pythonExample_trainsAuditsAndOpensATask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = _python_blocks(README.read_text())
    assert len(blocks) == 3, "the README's Python examples changed; run each of them here"
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

    from game.training.engine.states import decode_state
    from game.training.engine.train import train
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


def test_readme_peftExample_putsTheAdapterWrittenOntoTheBaseModel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third example loads what `vgame task model --pretrained` writes for a LoRA fine-tune
    (game.delivery.write_pretrained) onto the client's base model: the adapter's values come back."""
    import torch

    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from game.delivery import write_pretrained

    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    lora = peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False)
    tuned = peft.get_peft_model(transformers.GPT2LMHeadModel(config), lora)
    base_weights = {k: v.clone() for k, v in tuned.get_base_model().state_dict().items() if "lora_" not in k}
    adapter = {k: v.clone() for k, v in tuned.state_dict().items() if "lora_" in k}
    monkeypatch.chdir(tmp_path)
    write_pretrained(tuned, Path("adapter"))
    base_model = transformers.GPT2LMHeadModel(config)
    base_model.load_state_dict({k.replace("base_layer.", ""): v for k, v in base_weights.items()})
    scope: dict[str, object] = {"__name__": "readme_example", "base_model": base_model}
    exec(compile(_python_blocks(README.read_text())[2], str(README), "exec"), scope)
    loaded = scope["model"].state_dict()  # type: ignore[attr-defined]
    assert adapter and all(torch.equal(loaded[k], v) for k, v in adapter.items())


def test_readme_ownTaskExcerpt_isTheExamplesCode() -> None:
    """Every code line of the README's abridged task is a line of examples/own_task's task, so the
    excerpt cannot drift from the example that the next test runs."""
    text = README.read_text()
    excerpt = next(
        b
        for b in re.findall(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
        if b.startswith(EXCERPT)
    )
    source = (README.parent / "examples" / "own_task" / "tiny_task" / "task.py").read_text()
    lines = {" ".join(line.split("#")[0].split()) for line in source.splitlines()}
    for line in excerpt.splitlines()[1:]:
        code = " ".join(line.split("  #")[0].split())
        assert not code or code in lines, f"README line not in the example: {line!r}"


def test_readme_ownTaskCommands_runAsPrinted(tmp_path: Path) -> None:
    """The commands of "Verify your own training", run in a copy of examples/own_task: each exits
    0, the audit matches, the replayed step matches, and the demo's game pins the poisoned step."""
    import json
    import shlex
    import shutil
    import subprocess
    import sys

    section = _section(README.read_text(), "Verify your own training")
    block = re.search(r"^```bash\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    assert block is not None
    commands = [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands[0] == "cd examples/own_task"
    work = tmp_path / "own_task"
    shutil.copytree(
        README.parent / "examples" / "own_task", work, ignore=shutil.ignore_patterns("runs", "__pycache__")
    )
    outputs = {}
    for command in commands[1:]:
        argv = shlex.split(command)
        assert argv[0] == "vgame"
        done = subprocess.run(
            [sys.executable, "-m", "game.cli", *argv[1:], "--json"], capture_output=True, text=True, cwd=work
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"
        outputs[argv[1]] = json.loads(done.stdout)
    assert outputs["audit"]["match"] is True
    assert outputs["replay-step"]["matches_transcript"] is True
    assert outputs["demo"]["winner"] == "auditor" and outputs["demo"]["disputed_step"] == 4
    assert outputs["demo"]["balances_ok"] is True
