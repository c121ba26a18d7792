"""What a CUDA step costs the host, on any machine (issue 46): the rounding kernels a step launches
and the host time of its Python, with the group kernels and without.

A step's sequence of ops and tensors does not depend on their values, so the Triton kernels are
counted, not run (the step's numbers are then not rounded: only the counts and the host's time mean
anything). The step runs on CPU tensors down the CUDA path (``defer_anywhere``), so its host time,
less a plain float64 step's, is the rounding mode's own Python (dispatch, bookkeeping, tables),
without the launches' cost, which on a GPU is some tens of microseconds each on top.

    python3 scripts/count_launches.py --preset gpt-shakespeare [--model ...] [--batch-size N] [--repeats R]

Prints one JSON object: per way (``groups``, ``one_tensor_a_call``) and mode (record, replay), the
ATen ops dispatched, the tensors' and groups' launches, and the host milliseconds a step (the best
of ``--repeats`` blocks of ``--steps`` steps), with plain float64's beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors are the kernels' (they never run here)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from game.cli.options import parse_model_overrides, task_config
    from game.training.dispatch.mode import RoundingMode
    from game.training.engine.step import StepEngine
    from game.training.numerics import cuda_kernels
    from game.training.task.profiles import get_profile

    try:  # absent before the group kernels (to measure an older tree with this script)
        from game.training.numerics import cuda_groups

        tables = {"tensor": cuda_kernels.KERNELS, "group": cuda_groups.GROUP_KERNELS}
        switch = cuda_groups.SWITCH
    except ImportError:
        tables, switch = {"tensor": cuda_kernels.KERNELS}, "VGAME_GROUPS"

    count: Counter[str] = Counter()

    class Counted:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def __getitem__(self, grid: Any) -> Any:
            count[self.kind] += 1
            return lambda *a, **k: None

    for kind, table in tables.items():
        for name in table:
            table[name] = Counted(kind)
    real = RoundingMode.__torch_dispatch__

    def counted(self: RoundingMode, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None) -> Any:
        count["ops"] += 1
        return real(self, func, types, a, k)

    cfg = task_config(args.preset, model=parse_model_overrides(args.model), batch_size=args.batch_size)
    cfg = cfg.replace(steps=args.steps + 2)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    engine.defer_anywhere = True
    # the trainer's logs, to replay (recorded here: their entries are what the auditor's host reads)
    reference = StepEngine(cfg, get_profile("cpu-1t"))
    ref_state = reference.init_state()
    logs = {s: reference.run_step(ref_state, s, mode="record").log for s in range(1, args.steps + 2)}

    def best(mode: str) -> float:
        """Host ms a step, the best of the blocks (steps 2.. of a fresh state; step 1 makes the
        optimizer's lazy state)."""
        times = []
        for _ in range(args.repeats):
            state = engine.init_state()
            engine.run_step(state, 1, mode=mode, log=logs[1] if mode == "replay" else None, hash_state=False)
            t0 = time.perf_counter()
            for s in range(2, args.steps + 2):
                log = logs[s] if mode == "replay" else None
                engine.run_step(state, s, mode=mode, log=log, hash_state=False)
            times.append((time.perf_counter() - t0) / args.steps * 1e3)
        return round(min(times), 2)

    result: dict[str, Any] = {"preset": args.preset, "model": args.model, "batch_size": args.batch_size}
    result["plain_fp64_ms"] = best("plain")
    for groups in ("1", "0"):
        os.environ[switch] = groups
        row: dict[str, Any] = {}
        for mode in ("record", "replay"):
            RoundingMode.__torch_dispatch__ = counted  # type: ignore[method-assign]
            state = engine.init_state()
            engine.run_step(state, 1, mode=mode, log=logs[1] if mode == "replay" else None, hash_state=False)
            count.clear()
            engine.run_step(state, 2, mode=mode, log=logs[2] if mode == "replay" else None, hash_state=False)
            row[mode] = dict(count)
            RoundingMode.__torch_dispatch__ = real  # type: ignore[method-assign]
            row[mode]["host_ms"] = best(mode)
        result["groups" if groups == "1" else "one_tensor_a_call"] = row
    print(json.dumps(result))


if __name__ == "__main__":
    from game.errors import VGameError

    try:
        main()
    except VGameError as exc:  # a bad preset, model or size: one line, as the CLI says it
        sys.exit(f"error: {exc}")
