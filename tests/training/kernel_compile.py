"""Compile every Triton kernel of vgame for real GPUs, on a machine without one (run by
``test_kernel_compile.py`` in a process of its own: Triton's interpreter switch, which the kernel
tests set, would hand back interpreted functions).

Triton lowers a kernel to PTX and assembles it with the ``ptxas`` its wheel carries, so no driver
and no device are needed: what the interpreter cannot show (a type the compiler refuses, an integer
cast to a pointer, a called kernel inlined) fails here as it would on the first launch on a GPU.
The signatures are those the launch sites give (ints that fit in 32 bits arrive as ``i32``; a
per-tensor kernel's lanes as the step's float64 tensor, which also stands in for the entries and
their scratch where a call has no entries, so those kernels compile both ways).

    python -m tests.training.kernel_compile 80 90   # compute capabilities; prints JSON
    python -m tests.training.kernel_compile --broken  # a kernel that must fail (the harness's own check)
    python -m tests.training.kernel_compile 90 --lane-loads  # how the large-tensor passes read lanes
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

#: Types of the kernels' parameters by name, as the launches pass them.
_TYPES = {
    "table": "*i64",
    "x_ptr": "*fp64",
    "flag_ptr": "*i8",
    "pos_ptr": "*i64",
    "near_ptr": "*i64",
    "odd_ptr": "*i64",
    "stats_ptr": "*i64",
    "ids_ptr": "*i64",
    "out_ptr": "*i64",
    "src_ptr": "*i32",
    "dst_ptr": "*i32",
    "k_ptr": "*i32",
    "max_finite": "i64",
    "first_block": "i64",
}


#: A per-tensor auditor kernel's entries and scratch where the call has none: the lanes stand in.
_STAND_INS = {"pos_ptr": "*fp64", "near_ptr": "*fp64", "odd_ptr": "*fp64"}


def _kernels() -> dict[str, tuple[Any, dict[str, Any], dict[str, str]]]:
    """Every kernel with the constexpr values it is launched with, and the types of its parameters
    that differ from :data:`_TYPES` in that launch."""
    from game.training.numerics import cuda_groups, cuda_kernels, cuda_rng
    from game.training.numerics.triton_groups import GROUP_KERNELS
    from game.training.numerics.triton_kernels import KERNELS
    from game.training.state import sha256_kernel

    block = {"BLOCK": cuda_kernels.BLOCK}
    out: dict[str, tuple[Any, dict[str, Any], dict[str, str]]] = {}
    for n, k in KERNELS.items():
        out[f"tensor {n}"] = (k, block, {})
        if any(p.name == "pos_ptr" for p in k.params):
            out[f"tensor {n} without entries"] = (k, block, _STAND_INS)
    chunked = {**block, "CHUNK": cuda_groups.CHUNK}
    for name, kernel in GROUP_KERNELS.items():
        params = {p.name for p in kernel.params}
        out[f"group {name}"] = (kernel, chunked if "CHUNK" in params else block, {})
    for has_ids in (True, False):
        out[f"rng ids={has_ids}"] = (
            cuda_rng._philox_stream_kernel,
            {"HAS_IDS": has_ids, "BLOCK": cuda_rng.BLOCK},
            {},
        )
        # a keep probability below 1/2 passes its threshold as an i32, one above as an i64
        for threshold in ("i32", "i64"):
            out[f"rng scaled_keep ids={has_ids} threshold={threshold}"] = (
                cuda_rng._philox_scaled_keep_kernel,
                {"HAS_IDS": has_ids, "BLOCK": cuda_rng.BLOCK},
                {"out_ptr": "*fp64", "threshold": threshold, "value_bits": "i64"},
            )
    out["sha256 chunks"] = (
        sha256_kernel._sha256_chunks,
        {"CHUNK": sha256_kernel._CHUNK, "BLOCK": sha256_kernel.BLOCK},
        {},
    )
    return out


def _broken() -> dict[str, tuple[Any, dict[str, Any], dict[str, str]]]:
    """A kernel the compiler refuses (a block of 3 lanes: Triton's blocks are powers of two), to show
    that a failure is reported, not swallowed."""
    import triton
    import triton.language as tl

    @triton.jit
    def broken(x_ptr, BLOCK: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, BLOCK), 0)

    return {"broken": (broken, {"BLOCK": 3}, {})}


def _signature(kernel: Any, constexprs: dict[str, Any], types: dict[str, str]) -> dict[str, str]:
    """A kernel's parameter types as a launch passes them (:data:`_TYPES`, ``types`` where they
    differ), its constexprs marked."""
    return {
        p.name: "constexpr" if p.name in constexprs else types.get(p.name, _TYPES.get(p.name, "i32"))
        for p in kernel.params
    }


def compile_all(capabilities: list[int], broken: bool = False) -> dict[str, Any]:
    """Compile each kernel for each capability: its cubin's size, or the error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    result: dict[str, Any] = {}
    for name, (kernel, constexprs, types) in (_broken() if broken else _kernels()).items():
        signature = _signature(kernel, constexprs, types)
        for cc in capabilities:
            key = f"{name} sm_{cc}"
            t0 = time.perf_counter()
            try:
                src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
                compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32))
                result[key] = {
                    "cubin_bytes": len(compiled.asm["cubin"]),
                    "s": round(time.perf_counter() - t0, 2),
                }
            except Exception as exc:  # reported: the caller fails on it
                result[key] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    return result


#: The per-tensor kernels of a large tensor that read its lanes block by block (a program a block).
_LANE_READERS = ("scan", "round_and_band", "round_with_band", "round_inplace")


def lane_loads(capability: int) -> dict[str, Any]:
    """How the large-tensor kernels read their lanes, compiled as a launch specialises them when the
    tensor's address and lane count are multiples of 16 (Triton's ``tt.divisibility``, which its
    launcher sets for such arguments): the PTX's 16-byte vector loads of 8-byte values, its scalar
    ones, and the lanes a thread holds. Reading the lanes in vectors is what lets these passes run
    at the memory's speed; a kernel change that loses it (a cast, a mask the compiler cannot prove
    uniform) would halve that without failing any interpreter test."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from game.training.numerics import cuda_kernels
    from game.training.numerics.triton_kernels import KERNELS

    result: dict[str, Any] = {}
    constexprs = {"BLOCK": cuda_kernels.BLOCK}
    for name in _LANE_READERS:
        kernel = KERNELS[name]
        signature = _signature(kernel, constexprs, {})
        attrs = {
            (i,): [["tt.divisibility", 16]]
            for i, param in enumerate(kernel.params)
            if signature[param.name].startswith("*") or param.name == "n"
        }
        src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32))
        ptx = compiled.asm["ptx"]
        result[name] = {
            "vector_loads": len(re.findall(r"ld\.global(?:\.\w+)*\.v2\.b64", ptx)),
            "scalar_loads": len(re.findall(r"ld\.global(?:\.\w+)*\.b64\b", ptx))
            - len(re.findall(r"ld\.global(?:\.\w+)*\.v\d\.b64", ptx)),
            "lanes_per_thread": cuda_kernels.BLOCK // (32 * compiled.metadata.num_warps),
        }
    return result


if __name__ == "__main__":
    args = sys.argv[1:]
    caps = [int(a) for a in args if a.isdigit()] or [90]
    if "--lane-loads" in args:
        print(json.dumps(lane_loads(caps[0])))
    else:
        print(json.dumps(compile_all(caps, broken="--broken" in args)))
