"""Whether a CUDA step is the same work every step, on any machine (issue 46): what a captured CUDA
graph of a step would need changed first.

A CUDA graph replays the launches it captured with the arguments they had then; only the contents
of the tensors it reads may change between replays. So a step can be captured only where each
step makes the same launches with the same non-tensor arguments. This script runs steps down the
CUDA path on CPU tensors with the Triton kernels recorded, not run (``cuda_on_cpu.py``, as
``count_launches.py`` does), through the Python dispatch mode so that every ATen op is seen,
and compares two consecutive steps: each rounding-kernel launch (grid, scalar arguments, tensors'
shapes and dtypes) and each ATen op (its non-tensor arguments, tensors' shapes and dtypes). It
prints one JSON object: per mode, the count of launches and ops a step and those that differ, by
kind, with the first few.

    python3 scripts/graph_stability.py --preset gpt-shakespeare [--model ...] [--batch-size N]

Dropout's words on CPU come from the C kernel, not the Triton one; the Triton kernel takes the step
as a scalar argument (``cuda_rng.stream_words``), one launch a draw that differs every step, which
this CPU run cannot show.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

import cuda_on_cpu  # first: it sets Triton's interpreter switch

SHOWN = 5  # differing entries printed a mode


def _shape(a: Any) -> Any:
    """What a graph fixes of an argument: a tensor's shape and dtype (not its values), anything
    else whole."""
    import torch

    if isinstance(a, torch.Tensor):
        return ("tensor", tuple(a.shape), str(a.dtype))
    if isinstance(a, (list, tuple)):
        return tuple(_shape(x) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _shape(v)) for k, v in a.items()))
    if isinstance(a, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout)):
        return a
    if isinstance(a, torch.memory_format):
        return str(a)
    return type(a).__name__  # torch's opaque objects (a profiler's record) compare by kind


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    args = ap.parse_args()

    from game.training.dispatch.mode import RoundingMode
    from game.training.native import front

    trace: list[tuple[Any, ...]] = []
    cuda_on_cpu.stub_kernels(
        lambda _table, name, grid, a, k: trace.append(("launch", name, _shape(grid), _shape(a), _shape(k)))
    )
    real = RoundingMode.__torch_dispatch__

    def recorded(self: RoundingMode, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None) -> Any:
        trace.append(("op", str(func), _shape(a), _shape(k or {})))
        return real(self, func, types, a, k)

    RoundingMode.__torch_dispatch__ = recorded  # type: ignore[method-assign,assignment]
    engine, logs = cuda_on_cpu.engines(args.preset, args.model, args.batch_size, 3)
    result: dict[str, Any] = {"preset": args.preset, "model": args.model, "batch_size": args.batch_size}
    modes: tuple[Any, ...] = ("record", "replay")
    for mode in modes:
        state = engine.init_state()
        steps: list[list[tuple[Any, ...]]] = []
        with front.disabled():
            for s in range(1, 4):  # step 1 makes the optimizer's state: steps 2 and 3 compare
                trace.clear()
                engine.run_step(
                    state, s, mode=mode, log=logs[s] if mode == "replay" else None, hash_state=False
                )
                steps.append(list(trace))
        a, b = steps[1], steps[2]
        differ = [(x, y) for x, y in zip(a, b, strict=False) if x != y]
        kinds = Counter(f"{x[0]} {x[1]}" for x, _ in differ)
        result[mode] = {
            "launches": sum(1 for x in a if x[0] == "launch"),
            "ops": sum(1 for x in a if x[0] == "op"),
            "same_length": len(a) == len(b),
            "differ": len(differ) + abs(len(a) - len(b)),
            "differ_by_kind": dict(kinds.most_common()),
            "first": [repr(x)[:300] + "  /  " + repr(y)[:300] for x, y in differ[:SHOWN]],
        }
    print(json.dumps(result))


if __name__ == "__main__":
    cuda_on_cpu.run(main)
