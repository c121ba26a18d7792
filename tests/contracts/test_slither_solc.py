"""contracts/slither/solc: the `solc` Slither's crytic-compile calls, answered by the pinned solcjs.

It must compile exactly what is deployed (build.mjs's settings: the committed code) and write
native solc's --combined-json layout, and refuse calls it does not understand.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.contracts.driver import artifact

ROOT = Path(__file__).resolve().parents[2]
SOLC = ROOT / "contracts" / "slither" / "solc"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs node (the contract toolchain)")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SOLC), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _code(bytecode: str) -> str:
    """Bytecode without its CBOR metadata (``a2 64 'ipfs' ...`` to the end)."""
    return bytecode[: bytecode.rindex("a264697066735822")]


def test_version_isThePinnedSolcjs() -> None:
    out = _run("--version")
    assert out.returncode == 0, out.stderr
    assert artifact("VerificationGame")["compiler"]["version"] in out.stdout


def test_combinedJson_isTheDeployedBuild() -> None:
    fields = "abi,ast,bin,bin-runtime,srcmap,srcmap-runtime,userdoc,devdoc,hashes"
    out = _run("contracts/VerificationGame.sol", "--combined-json", fields, "--allow-paths", ".,contracts")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["sourceList"] == ["contracts/MerkleProof.sol", "contracts/VerificationGame.sol"]
    assert [got["sources"][s]["id"] for s in got["sourceList"]] == [0, 1]
    assert got["sources"]["contracts/VerificationGame.sol"]["AST"]["nodeType"] == "SourceUnit"
    game = got["contracts"]["contracts/VerificationGame.sol:VerificationGame"]
    art = artifact("VerificationGame")
    assert set(game) == {
        "abi",
        "bin",
        "bin-runtime",
        "srcmap",
        "srcmap-runtime",
        "userdoc",
        "devdoc",
        "hashes",
    }
    assert game["abi"] == art["abi"]
    # The same code; only the metadata hash at the end differs (source names carry the directory).
    assert _code(game["bin"]) == _code(art["bytecode"][2:]) and len(game["bin"]) == len(art["bytecode"]) - 2
    assert game["hashes"]["withdraw()"] == "3ccfd60b"


@pytest.mark.parametrize(
    "args",
    [
        ("--bin", "contracts/VerificationGame.sol"),
        ("contracts/VerificationGame.sol", "--combined-json", "abi,metadata"),
        ("contracts/VerificationGame.sol", "--combined-json", "abi", "--via-ir"),
    ],
)
def test_otherCalls_refusedByName(args: tuple[str, ...]) -> None:
    out = _run(*args)
    assert out.returncode == 2 and out.stderr.startswith("contracts/slither/solc: ")
