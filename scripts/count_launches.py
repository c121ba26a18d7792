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

``--parts`` (with the front) also times a record step with its parts taken away one after another
(each the best of ``--repeats`` blocks), so that the differences say what each part costs the
host: the rounding calls' Python (the front's calls return at once: nothing rounded, logged or
launched), the copy of the state a deferred step keeps for a rerun, and dropout's keep masks (all
ones, not drawn). What is left over plain float64 is the front's dispatch of every op and the
rest of the step's own work.

    python3 scripts/count_launches.py --preset gpt-shakespeare --model n_layer=12,n_head=12,n_embd=24,block_size=4 --batch-size 1 --parts

(the GPT-2-small layer count at a width where the arithmetic costs next to nothing: a step's host
work alone).

``--by-call`` (with the groups, through the front) also times each of ``Deferred``'s launching
calls over a block of record steps and one of replay steps: per call, how many a step, the
tensors a call (a group's) and the host milliseconds a step they took (``by_call``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from unittest import mock

import cuda_on_cpu  # first: it sets Triton's interpreter switch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", action="store_true", help="a record step's host ms with its parts taken away")
    ap.add_argument("--by-call", action="store_true", help="host ms a step of each Deferred launching call")
    args = ap.parse_args()

    from game.training.dispatch.mode import RoundingMode
    from game.training.dispatch.modestate import Mode
    from game.training.native import front

    count: Counter[str] = Counter()
    switch = cuda_on_cpu.stub_kernels(lambda table, *_: count.update([table]))
    real_dispatch, real_front_op = RoundingMode.__torch_dispatch__, RoundingMode._front_op

    def counted_dispatch(
        self: RoundingMode, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None
    ) -> Any:
        count["python_calls"] += 1
        return real_dispatch(self, func, types, a, k)

    def counted_front_op(self: RoundingMode, *a: Any) -> tuple[int, int]:
        count["python_calls"] += 1
        return real_front_op(self, *a)

    engine, logs = cuda_on_cpu.engines(args.preset, args.model, args.batch_size, args.steps + 1)
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

    def first_step(mode: Mode) -> Callable[[], int]:
        """Step 1 of a fresh state run now (it makes the optimizer's lazy state), and what runs
        steps ``2 ..`` of it then (returning how many)."""
        state = engine.init_state()
        run(state, range(1, 2), mode)

        def rest() -> int:
            run(state, range(2, args.steps + 2), mode)
            return args.steps

        return rest

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
    if args.parts:
        if not front.available():
            raise SystemExit("error: --parts needs the C++ front (scripts/bootstrap.sh builds it)")
        result["record_parts_ms"] = parts(lambda: host_ms("record", [("1", "front")])[0])
    if args.by_call:
        with way("1", "front"):
            result["by_call"] = {mode: by_call(first_step(mode)) for mode in modes}
    print(json.dumps(result))


#: ``Deferred``'s calls that launch kernels: one tensor's, or a group's.
CALLS = (
    "round_and_band",
    "round_with_entries",
    "round_inplace",
    "round_and_band_group",
    "round_with_entries_group",
    "round_inplace_group",
)


def by_call(run_block: Callable[[], int]) -> dict[str, dict[str, float]]:
    """Each of :data:`CALLS`' count a step, tensors a call and host ms a step while ``run_block()``
    runs (it returns how many steps it ran)."""
    from game.training.numerics.cuda_deferred import Deferred

    seconds: dict[str, float] = dict.fromkeys(CALLS, 0.0)
    calls: Counter[str] = Counter()
    tensors: Counter[str] = Counter()

    def timed(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Deferred, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = real(self, *a, **k)
            seconds[name] += time.perf_counter() - t0
            calls[name] += 1
            tensors[name] += len(a[0]) if name.endswith("_group") else 1
            return out

        return call

    with contextlib.ExitStack() as stack:
        for name in CALLS:
            stack.enter_context(mock.patch.object(Deferred, name, timed(name, getattr(Deferred, name))))
        steps = run_block()
    return {
        name: {
            "calls": calls[name] / steps,
            "tensors_a_call": round(tensors[name] / calls[name], 1),
            "host_ms": round(seconds[name] / steps * 1e3, 2),
        }
        for name in CALLS
        if calls[name]
    }


def parts(record_ms: Callable[[], float]) -> dict[str, float]:
    """Host ms of a record step (``record_ms()``, through the front, with the groups) as is, then
    with each part taken away on top of the ones before (module docstring); the step's results mean
    nothing once the first is gone."""
    import torch

    from game.training.dispatch.draws import Draws, suspended
    from game.training.dispatch.frontmode import FrontMode
    from game.training.engine import step as step_module

    def no_rounding(
        self: FrontMode, row: int, kind: int, tensors: Any, op_index: int, cursor: int, records: Any
    ) -> Any:
        self._front_sync(op_index, cursor, records)
        return self.op_index, self._cursor.position if self._cursor is not None else 0

    def no_snapshot(state: Any, kept: Any = None) -> Any:
        return lambda: None

    def ones(self: Draws, name: str, shape: Any, p_keep: float, device: Any, scale: float, dtype: Any) -> Any:
        with suspended():
            return torch.ones(tuple(shape), dtype=dtype, device=device)

    out = {"step": record_ms()}
    with contextlib.ExitStack() as stack:
        for name, target, attr, stand_in in (
            ("without_rounding_calls", FrontMode, "_front_op", no_rounding),
            ("and_without_state_copy", step_module, "snapshot", no_snapshot),
            ("and_without_dropout_masks", Draws, "scaled", ones),
        ):
            stack.enter_context(mock.patch.object(target, attr, stand_in))
            out[name] = record_ms()
    return out


if __name__ == "__main__":
    cuda_on_cpu.run(main)
