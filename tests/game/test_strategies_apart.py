"""Product code never reaches the alternative strategies or the benchmarks (issue 42's layers).

A static scan of every import statement, function-level ones included, so that a dishonest player
or a benchmark cannot be loaded by a node, an agent, the judge, the training core or the chain.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (
    "game/training",
    "game/chain",
    "game/protocol",
    "game/protocol.py",
    "game/agents.py",
    "game/judge.py",
    "game/delivery.py",
    "game/tasks.py",
    "game/store",
    "trainer_node",
    "auditor_node",
)
APART = ("game.strategies", "game.bench")


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def _product_files() -> list[Path]:
    files: list[Path] = []
    for part in PRODUCT:
        p = ROOT / part
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p] if p.is_file() else []
    return files


@pytest.mark.parametrize("path", _product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_productModule_importsNeitherStrategiesNorBenchmarks(path: Path) -> None:
    bad = [m for m in _imports(path) if any(m == a or m.startswith(a + ".") for a in APART)]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
