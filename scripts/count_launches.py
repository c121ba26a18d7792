"""How many rounding kernels a CUDA step launches, with the group kernels and without (issue 46),
counted on any machine: a step's sequence of ops and tensors does not depend on their values, so
the Triton kernels are counted, not run (the step's numbers are then not rounded: only the counts
mean anything). On a GPU the launches are each some tens of microseconds of host work, which is
what the groups cut.

    python3 scripts/count_launches.py --preset gpt-shakespeare [--model ...] [--batch-size N]

Prints one JSON object: per mode (record, replay), the ATen ops dispatched, the tensors rounded,
and the Triton launches a step with ``VGAME_GROUPS`` on and off.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
    args = ap.parse_args()

    from game.cli.options import parse_model_overrides, task_config
    from game.training.dispatch.mode import RoundingMode
    from game.training.engine.step import StepEngine
    from game.training.numerics import cuda_groups, cuda_kernels
    from game.training.task.profiles import get_profile

    count: Counter[str] = Counter()

    class Counted:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def __getitem__(self, grid: Any) -> Any:
            count[self.kind] += 1
            return lambda *a, **k: None

    for kind, table in (("tensor", cuda_kernels.KERNELS), ("group", cuda_groups.GROUP_KERNELS)):
        for name in table:
            table[name] = Counted(kind)
    real = RoundingMode.__torch_dispatch__

    def counted(self: RoundingMode, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None) -> Any:
        count["ops"] += 1
        return real(self, func, types, a, k)

    RoundingMode.__torch_dispatch__ = counted  # type: ignore[method-assign]

    cfg = task_config(args.preset, model=parse_model_overrides(args.model), batch_size=args.batch_size)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    engine.defer_anywhere = True
    result: dict[str, Any] = {"preset": args.preset, "model": args.model, "batch_size": args.batch_size}
    for groups in ("1", "0"):
        os.environ[cuda_groups.SWITCH] = groups
        state = engine.init_state()
        engine.run_step(state, 1, mode="record", hash_state=False)  # the first step: lazy state (optimizer moments)
        count.clear()
        rec = engine.run_step(state, 2, mode="record", hash_state=False)
        row = {"record": dict(count)}
        count.clear()
        replay = engine.init_state()
        engine.run_step(replay, 1, mode="record", hash_state=False)
        count.clear()
        engine.run_step(replay, 2, mode="replay", log=rec.log, hash_state=False)
        row["replay"] = dict(count)
        result["groups" if groups == "1" else "one_tensor_a_call"] = row
    print(json.dumps(result))


if __name__ == "__main__":
    main()
