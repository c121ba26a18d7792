"""Every Triton kernel compiles for real GPUs (compute capabilities 8.0 and 9.0: A100, H100 and
H200), here without one: Triton's interpreter, which the kernel tests run on CPU, does not compile
anything, so a kernel it runs may still fail on its first launch on a GPU.

The compile runs in a process of its own (``kernel_compile.py``): the kernel tests set Triton's
interpreter switch for the whole test process, and a kernel defined under it is not compilable.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ptxas() -> bool:
    """Whether Triton, its NVIDIA backend and its bundled assembler are installed (Linux wheels).
    Looked up without importing Triton: imported here, before the kernel tests set the interpreter
    switch, it would not interpret their kernels."""
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    return (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


pytestmark = pytest.mark.skipif(not _ptxas(), reason="Triton or its NVIDIA backend (ptxas) is not installed")


def _compile(*args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.training.kernel_compile", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def test_everyKernel_compilesForA100AndH100() -> None:
    result = _compile("80", "90")
    failed = {k: v["error"] for k, v in result.items() if "error" in v}
    assert not failed, failed
    names = {k.rsplit(" ", 1)[0] for k in result}
    # the per-tensor rounding kernels (10, with a deferred auditor's one pass after the scan and its
    # one program for a small tensor; the auditor's 5 also with the lanes standing in for entries),
    # the group kernels (6: a group's auditor has that one pass only), the RNG's stream (2 variants)
    # and dropout's scaled keep mask (4), SHA-256
    tensor = [n for n in names if n.startswith("tensor ")]
    assert len(tensor) == 15 and sum(n.endswith(" without entries") for n in tensor) == 5
    assert sum(n.startswith("group ") for n in names) == 6
    assert {"rng ids=True", "rng ids=False", "sha256 chunks"} <= names
    assert sum(n.startswith("rng scaled_keep ") for n in names) == 4
    assert all(v["cubin_bytes"] > 0 for v in result.values())


def test_aKernelTheCompilerRefuses_isReported() -> None:
    result = _compile("90", "--broken")
    assert list(result) == ["broken sm_90"] and "error" in result["broken sm_90"]


def test_largeTensorPasses_readTheirLanesIn16ByteVectors_onH100() -> None:
    """Compiled as a launch specialises them for a tensor whose address and lane count are
    multiples of 16, each pass over a large tensor reads every lane a thread holds in 16-byte
    vectors (two lanes a load); the only scalar loads left are the counter row's fields. Issue 46's
    device cost of these passes rests on it, and the interpreter's tests cannot see it."""
    result = _compile("90", "--lane-loads")
    assert sorted(result) == ["round_and_band", "round_inplace", "round_with_band", "scan"]
    for name, got in result.items():
        assert 2 * got["vector_loads"] >= got["lanes_per_thread"] > 1, (name, got)
        assert got["scalar_loads"] < got["lanes_per_thread"], (name, got)
