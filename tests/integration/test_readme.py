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
    assert len(blocks) == 1, "the README's Python examples changed; run each of them here"
    monkeypatch.chdir(tmp_path)  # the example writes runs/mlp relative to where it runs
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme_example"})
    assert out.getvalue().split() == ["OPEN"]  # what the example's comment says it prints
    assert (tmp_path / "runs" / "mlp" / "leaves.bin").stat().st_size == 21 * 32  # steps 0..20, one leaf each
