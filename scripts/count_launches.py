"""What a CUDA step costs the host, on any machine (issue 46): the rounding kernels a step launches
and the host time of its Python, with the group kernels and without, and through the C++ dispatch
front and the Python dispatch mode.

A step's sequence of ops and tensors does not depend on their values, so the Triton kernels are
counted, not run (the step's numbers are then not rounded: only the counts and the host's time mean
anything). The step runs on CPU tensors down the CUDA path (``defer_anywhere``), so its host time,
less a plain float64 step's, is the rounding mode's own Python (dispatch, bookkeeping, tables),
without the launches' cost, which on a GPU is some tens of microseconds each on top.

    python3 scripts/count_launches.py --preset gpt-shakespeare [--model ...] [--batch-size N] [--repeats R]

Prints one JSON object: per way (``groups``, ``one_tensor_a_call``), interceptor (``front``,
``python``) and mode (record, replay), the Python calls a step made (``python_calls``: the mode's
``__torch_dispatch__``, or the front's calls to ``_front_op``), the tensors' and groups' launches,
and the host milliseconds a step (the best of ``--repeats`` blocks of ``--steps`` steps; each
round times every way one block after another, so the ways share the machine's moods), with
plain float64's beside them. Without a built front only the ``python`` rows are there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

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
    from game.training.dispatch.modestate import Mode
    from game.training.engine.step import StepEngine
    from game.training.numerics import cuda_kernels
    from game.training.task.profiles import get_profile

    try:  # absent before the group kernels (to measure an older tree with this script)
        from game.training.numerics import cuda_groups

        tables = {"tensor": cuda_kernels.KERNELS, "group": cuda_groups.GROUP_KERNELS}
        switch = cuda_groups.SWITCH
    except ImportError:
        tables, switch = {"tensor": cuda_kernels.KERNELS}, "VGAME_GROUPS"

    from game.training.native import front

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
    real_dispatch, real_front_op = RoundingMode.__torch_dispatch__, RoundingMode._front_op

    def counted_dispatch(
        self: RoundingMode, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None
    ) -> Any:
        count["python_calls"] += 1
        return real_dispatch(self, func, types, a, k)

    def counted_front_op(self: RoundingMode, *a: Any) -> tuple[int, int]:
        count["python_calls"] += 1
        return real_front_op(self, *a)

    cfg = task_config(args.preset, model=parse_model_overrides(args.model), batch_size=args.batch_size)
    cfg = cfg.replace(steps=args.steps + 2)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    engine.defer_anywhere = True
    # the trainer's logs, to replay (recorded here: their entries are what the auditor's host reads)
    reference = StepEngine(cfg, get_profile("cpu-1t"))
    ref_state = reference.init_state()
    logs = {s: reference.run_step(ref_state, s, mode="record").log for s in range(1, args.steps + 2)}
    interceptors = ("front", "python") if front.available() else ("python",)
    ways = [(g, i) for g in ("1", "0") for i in interceptors]

    def way(groups: str, interceptor: str) -> contextlib.AbstractContextManager[None]:
        os.environ[switch] = groups
        return contextlib.nullcontext() if interceptor == "front" else front.disabled()

    def run(state: Any, steps: range, mode: Mode) -> None:
        for s in steps:
            engine.run_step(state, s, mode=mode, log=logs[s] if mode == "replay" else None, hash_state=False)

    def host_ms(mode: Mode, which: list[tuple[str, str]]) -> list[float]:
        """Host ms a step of each way, the best of the rounds' blocks (steps 2.. of a fresh state;
        step 1 makes the optimizer's lazy state)."""
        best = [float("inf")] * len(which)
        for _ in range(args.repeats):
            for i, (groups, interceptor) in enumerate(which):
                with way(groups, interceptor):
                    state = engine.init_state()
                    run(state, range(1, 2), mode)
                    t0 = time.perf_counter()
                    run(state, range(2, args.steps + 2), mode)
                    best[i] = min(best[i], (time.perf_counter() - t0) / args.steps * 1e3)
        return [round(b, 2) for b in best]

    result: dict[str, Any] = {"preset": args.preset, "model": args.model, "batch_size": args.batch_size}
    result["plain_fp64_ms"] = host_ms("plain", [("1", "python")])[0]
    rows: dict[str, dict[str, Any]] = {}
    modes: tuple[Mode, ...] = ("record", "replay")
    for mode in modes:
        for groups, interceptor in ways:
            with way(groups, interceptor):
                with (
                    mock.patch.object(RoundingMode, "__torch_dispatch__", counted_dispatch),
                    mock.patch.object(RoundingMode, "_front_op", counted_front_op),
                ):
                    state = engine.init_state()
                    run(state, range(1, 2), mode)
                    count.clear()
                    run(state, range(2, 3), mode)
                assert engine.last_mode is not None and engine.last_mode.via_front is (interceptor == "front")
            key = f"{'groups' if groups == '1' else 'one_tensor_a_call'} {interceptor}"
            rows.setdefault(key, {})[mode] = dict(count)
        for (groups, interceptor), ms in zip(ways, host_ms(mode, ways), strict=True):
            rows[f"{'groups' if groups == '1' else 'one_tensor_a_call'} {interceptor}"][mode]["host_ms"] = ms
    result.update(rows)
    print(json.dumps(result))


if __name__ == "__main__":
    from game.errors import VGameError

    try:
        main()
    except VGameError as exc:  # a bad preset, model or size: one line, as the CLI says it
        sys.exit(f"error: {exc}")
