"""Where a CUDA trainer's and auditor's step spends its time: cProfile and torch's profiler over a
few steps of one task, written as JSON (issue 46). Run by scripts/gpu_measure.sh on a GPU machine:

    python3 scripts/gpu_profile.py --preset gpt-shakespeare --model n_layer=12,... --out prof.json

A lent GPU is minutes long, so this measures what the next change needs to know, once: the top
functions by own and cumulative time on the step's thread, and for one plain float64 step, one
trainer step and one auditor step under torch's profiler (``torch_profile``): the step's wall
time, the time the GPU ran kernels in it (``device_ms``; 0 on a CPU profile), their ratio
(``device_share``), the launches and host synchronisations, and the ops by total time. A plain
step's ``device_share`` says how much of it is host work: where it is low, taking the rounding's
per-op host work away (a captured graph) is what a target needs, not faster kernels.

Neither says which host work, nor on which thread: cProfile sees the step's thread only, and on a
GPU autograd's device thread runs the backward pass, whose rounding calls come into Python there
(and the step's thread waits for it without using its CPU). So a third block of steps, a role's
``host``, is timed with no profiler at all, only clocks around the host work the rounding adds,
per thread (``step``: the thread running the steps; ``other``: autograd's and any other): the
front's Python calls for ops that round (``rounding_calls``, their milliseconds with what they
launch), the Triton launches among them and dropout's (``launches``, their milliseconds: Triton's
dispatch and the driver's call), and on the step's thread the state's copy a deferring step keeps
for a rerun (``snapshot_ms``), the end-of-step read-back (``settle_ms``, the wait for the device
included) and the trainer's hand-over of a step to its writer (``queue_ms``: the state's leaf
launched on the device, and any wait for the writer's queue). What the step's wall time has
beyond these and plain float64's is the device's work or waits.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _top(prof: cProfile.Profile, key: str, n: int) -> list[dict[str, Any]]:
    stats = pstats.Stats(prof, stream=io.StringIO())
    stats.sort_stats(key)
    rows = []
    for func in stats.fcn_list[:n]:  # type: ignore[attr-defined]
        _, nc, tt, ct, _ = stats.stats[func]  # type: ignore[attr-defined]
        rows.append({"func": f"{func[0]}:{func[1]}({func[2]})", "calls": nc, "own_s": tt, "cum_s": ct})
    return rows


class HostClock:
    """Milliseconds and counts of the host work the rounding adds, by what and by thread, while
    :meth:`timing` is on (see the module docstring); :meth:`report` a step's share of them."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self.ms: defaultdict[tuple[str, str], float] = defaultdict(float)
        self.count: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.wall_ms = 0.0  # the blocks' own time, while timing

    def _timed(self, what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            where = "step" if threading.get_ident() == self.main else "other"
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.ms[where, what] += (time.perf_counter() - t0) * 1e3
                self.count[where, what] += 1

        return call

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Clocks around the front's calls, every Triton launch (the rounding tables', the RNG's
        words and dropout's masks), the state's snapshot and the step's read-back; all put back
        after."""
        from game.training.dispatch.frontmode import FrontMode
        from game.training.engine import step as step_module
        from game.training.engine import train as train_module
        from game.training.numerics import cuda_groups, cuda_kernels, cuda_rng
        from game.training.numerics.cuda_deferred import Deferred

        clock = self

        class Launch:
            def __init__(self, jit: Any) -> None:
                self.jit = jit

            def __getitem__(self, grid: Any) -> Callable[..., Any]:
                return clock._timed("launches", self.jit[grid])

        with contextlib.ExitStack() as stack:
            # the base class's attribute: the front compares a mode's ``_front_op`` with it
            stack.enter_context(
                mock.patch.object(FrontMode, "_front_op", self._timed("rounding_calls", FrontMode._front_op))
            )
            stack.enter_context(
                mock.patch.object(step_module, "snapshot", self._timed("snapshot", step_module.snapshot))
            )
            stack.enter_context(mock.patch.object(Deferred, "settle", self._timed("settle", Deferred.settle)))
            queue = self._timed("queue", train_module.queue_step)
            stack.enter_context(mock.patch.object(train_module, "queue_step", queue))
            for name in ("_philox_stream_kernel", "_philox_scaled_keep_kernel"):  # dropout's is the second
                if hasattr(cuda_rng, name):  # neither without Triton (nor the second in older trees)
                    stack.enter_context(mock.patch.object(cuda_rng, name, Launch(getattr(cuda_rng, name))))
            tables = [cuda_kernels.KERNELS, cuda_groups.GROUP_KERNELS]
            for table in tables:
                stack.enter_context(mock.patch.dict(table, {n: Launch(k) for n, k in table.items()}))
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.wall_ms += (time.perf_counter() - t0) * 1e3

    def report(self, steps: int) -> dict[str, Any]:
        """A step's share: per thread, the rounding calls and launches (count, ms); on the step's
        thread, the snapshot's, the read-back's and the trainer's queueing's ms; the wall time."""
        out: dict[str, Any] = {}
        for where in ("step", "other"):
            out[where] = {
                f"{what}{unit}": round(table[where, what] / steps, 3)
                for what in ("rounding_calls", "launches")
                for unit, table in (("", self.count), ("_ms", self.ms))
            }
        for what in ("snapshot", "settle", "queue"):
            out[f"{what}_ms"] = round(self.ms["step", what] / steps, 3)
        out["wall_ms"] = round(self.wall_ms / steps, 3)
        return out


#: The driver calls a launch and a host synchronisation are made of, as torch's profiler names them.
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")


def _device_us(e: Any) -> float:
    """An averaged event's own time on the device (torch names it ``device`` now, ``cuda`` before)."""
    return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) or 0)


def _on_device(e: Any) -> bool:
    from torch.autograd import DeviceType

    return bool(e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False))


def torch_profile(run: Callable[[], object], sync: Callable[[], None], cuda: bool) -> dict[str, Any]:
    """One call of ``run`` (a step, synchronised after) under torch's profiler: its wall time, the
    device's kernel time, their ratio, the launches and synchronisations, the top ops."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    with profile(activities=acts) as tp:
        t0 = time.perf_counter()
        run()
        sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
    events = tp.key_averages()
    # the device's own events (kernels, copies), as torch's table adds up its "Self CUDA" column:
    # a CPU op's device time is its kernels' again
    device_ms = sum(_device_us(e) for e in events if _on_device(e)) * 1e-3
    return {
        "wall_ms": wall_ms,
        "device_ms": device_ms,
        "device_share": round(device_ms / wall_ms, 4) if wall_ms > 0 else None,
        "launches": sum(e.count for e in events if e.key in LAUNCHES),
        "syncs": sum(e.count for e in events if e.key in SYNCS),
        "ops": [
            {
                "name": e.key,
                "count": e.count,
                "cpu_total_ms": e.cpu_time_total * 1e-3,
                "device_own_ms": _device_us(e) * 1e-3,
            }
            for e in sorted(events, key=lambda e: -e.cpu_time_total)[:40]
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--profile", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--cuda-path-on-cpu",
        action="store_true",
        help="CPU tensors down the CUDA path in Triton's interpreter (checks the clocks without a GPU)",
    )
    args = ap.parse_args()
    if args.cuda_path_on_cpu:  # read by Triton when its kernels are first defined: before game's imports
        os.environ["TRITON_INTERPRET"] = "1"

    import torch

    from game.cli.options import parse_model_overrides, task_config
    from game.training.dispatch.profiles import get_profile
    from game.training.engine.step import StepEngine
    from game.training.engine.train import initial_step, train_step
    from game.training.state.leaves import LeafHasher
    from game.training.transcript.reader import Transcript
    from game.training.transcript.writer import TranscriptWriter

    cfg = task_config(args.preset, model=parse_model_overrides(args.model), batch_size=args.batch_size)
    warm = 1
    # steps: warm-up, cProfile's block, the host clocks' block, one under torch's profiler
    cfg = cfg.replace(steps=warm + 2 * args.steps + 1)
    engine = StepEngine(cfg, get_profile(args.profile))
    engine.defer_anywhere = args.cuda_path_on_cpu
    result: dict[str, Any] = {"preset": args.preset, "model": args.model, "batch_size": args.batch_size}
    cuda = torch.device(engine.profile.device).type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    profiled: dict[str, dict[str, Any]] = {}  # one step of each kind under torch's profiler
    host: dict[str, dict[str, Any]] = {}  # a role's host work by part and thread (HostClock)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t"
        with TranscriptWriter.create(out, cfg, args.profile) as writer:
            t0 = time.perf_counter()
            state = initial_step(engine, writer)
            result["init_s"] = time.perf_counter() - t0
            for step in range(1, warm + 1):
                train_step(engine, writer, state, step)
            writer.flush()
            sync()
            # cProfile's block, then the host clocks' (to ``hosted``), then one step under torch's
            first, last = warm + 1, warm + args.steps
            hosted = last + args.steps
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            for step in range(first, last + 1):
                train_step(engine, writer, state, step)
            writer.flush()
            sync()
            prof.disable()
            result["trainer_s_per_step"] = (time.perf_counter() - t0) / args.steps
            result["trainer_own"] = _top(prof, "tottime", 30)
            result["trainer_cum"] = _top(prof, "cumulative", 40)
            clock = HostClock()
            with clock.timing():
                for step in range(last + 1, hosted + 1):
                    train_step(engine, writer, state, step)
                writer.flush()
                sync()
            host["trainer"] = clock.report(args.steps)

            def one_trainer_step() -> None:
                train_step(engine, writer, state, hosted + 1)
                writer.flush()

            profiled["trainer"] = torch_profile(one_trainer_step, sync, cuda)
        # the auditor: replay the same steps from the transcript, leaves hashed beside the next step
        t = Transcript(out)
        astate = engine.init_state()
        for step in range(1, warm + 1):
            engine.run_step(astate, step, mode="replay", log=t.read_log(step), hash_state=False)
        sync()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        with LeafHasher() as hasher:
            pending = None
            for step in range(first, last + 1):
                engine.run_step(astate, step, mode="replay", log=t.read_log(step), hash_state=False)
                if pending is not None:
                    assert pending.leaf() == t.leaf(pending.step), pending.step
                pending = hasher.submit(astate)
            assert pending is not None and pending.leaf() == t.leaf(pending.step)
        sync()
        prof.disable()
        result["auditor_s_per_step"] = (time.perf_counter() - t0) / args.steps
        result["auditor_own"] = _top(prof, "tottime", 30)
        result["auditor_cum"] = _top(prof, "cumulative", 40)
        clock = HostClock()
        with clock.timing():
            for step in range(last + 1, hosted + 1):
                engine.run_step(astate, step, mode="replay", log=t.read_log(step), hash_state=False)
            sync()
        host["auditor"] = clock.report(args.steps)
        profiled["auditor"] = torch_profile(
            lambda: engine.run_step(
                astate, hosted + 1, mode="replay", log=t.read_log(hosted + 1), hash_state=False
            ),
            sync,
            cuda,
        )
        # plain float64 for scale
        pstate = engine.init_state()
        engine.run_step(pstate, 1, mode="plain")
        sync()
        t0 = time.perf_counter()
        for step in range(2, 2 + args.steps):
            engine.run_step(pstate, step, mode="plain")
        sync()
        result["fp64_s_per_step"] = (time.perf_counter() - t0) / args.steps
        step = 2 + args.steps
        profiled["plain"] = torch_profile(lambda: engine.run_step(pstate, step, mode="plain"), sync, cuda)
    result["torch_profile"] = profiled
    result["host"] = host
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {k: result[k] for k in ("init_s", "trainer_s_per_step", "auditor_s_per_step", "fp64_s_per_step")}
            | {f"{kind}_device_share": p["device_share"] for kind, p in profiled.items()}
            | {"host": host}
        )
    )


if __name__ == "__main__":
    main()
