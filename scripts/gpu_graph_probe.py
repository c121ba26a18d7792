"""What a captured CUDA graph would take off a step (issue 46): a probe for a lent GPU, not a
feature.

After the group kernels and the C++ front, what is left of a CUDA step's overhead is the host's
per-op work: a Python call and a Triton launch for each op that rounds. A CUDA graph replays a
step's launches without any of it. Capturing a step needs a task-format change (the per-step
scalars on the device, a capturable optimizer), so before making it this probe measures what it
would buy, on the step as it is:

* the forward and backward pass of one step, under the rounding mode (record, replay) or plain, is
  captured once and replayed; the optimizer's update runs eagerly after each replay (torch's Adam
  is not capturable as the tasks build it), then the deferred checks are read back, as a step does;
* the captured pass is first checked against the same pass run eagerly from the same state: their
  gradients must be equal bit for bit (record and replay; plain's dropout is torch's own, a new
  mask each pass);
* eager steps (``StepEngine.run_step``) are timed beside it, in the same process.

What a replayed graph does not do, so its figures are a bound, not a step: it draws the capture
step's dropout words and takes its batch (per-step scalars baked in), and a replayed auditor's
entries are the capture step's (its later checks may fail; counted, not acted on). The optimizer
runs in record mode on every path (its own log would need the update's records apart).

    python3 scripts/gpu_graph_probe.py --preset gpt-shakespeare [--model ...] --out graph.json

``--dry-run`` runs the same code on CPU tensors down the CUDA path, with a stand-in graph that runs
the captured pass again on each replay (nothing is captured): it checks the probe's own logic
without a GPU, and its times mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from game.training.dispatch.modestate import Mode

MODES: tuple[Mode, ...] = ("plain", "record", "replay")
WARM = 3  # eager steps before a capture: kernels compiled, optimizer state made, lazy tables built


class _Rerun:
    """The dry run's stand-in for ``torch.cuda.CUDAGraph``: replay runs the pass again."""

    passes = 1  # the pass runs this many times in :meth:`capture`

    def __init__(self) -> None:
        self._fn: Callable[[], None] | None = None

    def capture(self, fn: Callable[[], None]) -> None:
        self._fn = fn
        fn()

    def replay(self) -> None:
        assert self._fn is not None
        self._fn()


class _Cuda:
    """A CUDA graph, captured on a side stream after two warm-up passes there (torch's advice)."""

    passes = 3  # the pass runs this many times in :meth:`capture`

    def __init__(self, error_mode: str) -> None:
        import torch

        self.graph = torch.cuda.CUDAGraph()
        self.error_mode = error_mode

    def capture(self, fn: Callable[[], None]) -> None:
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.passes - 1):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, stream=side, capture_error_mode=self.error_mode):
            fn()

    def replay(self) -> None:
        self.graph.replay()


@contextmanager
def _tables_in_one_arena(device: Any) -> Iterator[None]:
    """The group kernels' tables from one pinned arena kept alive, not a fresh pinned tensor a call:
    a captured copy reads its host block again at every replay, so the block must outlive the
    graph and never be reused (and no pinned allocation may happen inside a capture)."""
    import torch

    from game.training.numerics import cuda_groups

    if device.type != "cuda":
        yield
        return
    arena = torch.empty(1 << 24, dtype=torch.int64, pin_memory=True)  # 128 MiB, never reused
    used = [0]
    real = cuda_groups._table

    def table(rows: list[int], device: torch.device) -> torch.Tensor:
        start, n = used[0], len(rows)
        if start + n > arena.numel():
            raise RuntimeError("the probe's table arena is full")
        used[0] += n
        host = arena[start : start + n]
        host.copy_(torch.tensor(rows, dtype=torch.int64))
        return host.to(device, non_blocking=True)

    cuda_groups._table = table
    try:
        yield
    finally:
        cuda_groups._table = real


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=20, help="timed steps a way")
    ap.add_argument("--modes", default="plain,record,replay")
    ap.add_argument("--error-mode", default="thread_local", help="torch.cuda.graph's capture_error_mode")
    ap.add_argument("--dry-run", action="store_true", help="CPU tensors, no capture: checks the probe only")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import torch

    from game.cli.options import parse_model_overrides, task_config
    from game.training.dispatch.profiles import get_profile
    from game.training.engine.step import StepEngine
    from game.training.log.formats import new_step_log
    from game.training.state.tensors import snapshot

    cfg = task_config(args.preset, model=parse_model_overrides(args.model), batch_size=args.batch_size)
    cfg = cfg.replace(steps=WARM + 2 + args.steps)
    engine = StepEngine(cfg, get_profile("cpu-1t" if args.dry_run else "cuda"))
    engine.defer_anywhere = args.dry_run
    device = torch.device(engine.profile.device)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    result: dict[str, Any] = {
        "preset": args.preset,
        "model": args.model,
        "batch_size": args.batch_size,
        "dry_run": args.dry_run,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }

    # eager steps, timed; the record run's logs are the replay runs' input
    logs: dict[int, Any] = {}

    def eager(state: Any, mode: Mode, steps: range) -> None:
        for s in steps:
            r = engine.run_step(
                state, s, mode=mode, log=logs[s] if mode == "replay" else None, hash_state=False
            )
            if mode == "record":
                logs[s] = r.log

    for mode in MODES:
        state = engine.init_state()
        eager(state, mode, range(1, WARM + 1))
        sync()
        t0 = time.perf_counter()
        eager(state, mode, range(WARM + 1, WARM + 1 + args.steps))
        sync()
        result[f"eager_{mode}_ms"] = (time.perf_counter() - t0) / args.steps * 1e3

    step = WARM + 1

    def probe(mode: Mode) -> dict[str, Any]:
        state = engine.init_state()
        eager(state, mode, range(1, step))
        model, optimizer = state.model, state.optimizer
        params = [p for p in model.parameters() if p.requires_grad]
        batch = engine.prepare_batch(engine.batch(step), rnd=mode != "plain")
        # static gradients: each pass zeroes them and its backward adds into them, in place
        grads = [torch.zeros_like(p) for p in params]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        serve = mode != "plain"

        def interceptor() -> Any:
            log = logs[step] if mode == "replay" else new_step_log(cfg.log_format, step)
            return engine.interceptor(step, mode, log, defer=True)

        made: list[Any] = []  # each pass's interceptor: a pass enters a fresh one, as a step does
        # made before a capture: an auditor's interceptor copies its chunk's entries to the device
        # from pageable memory, which a capturing stream refuses
        ready: list[Any] = []

        def fwd_bwd() -> None:
            rm = ready.pop(0) if ready else None if mode == "plain" else interceptor()
            made.append(rm)
            for g in grads:
                g.zero_()
            with engine.profile.apply():
                if rm is None:
                    engine.micro_batch(model, batch, step, 0, 1, serve=False)
                else:
                    with rm:
                        engine.micro_batch(model, batch, step, 0, 1, serve=serve)

        restore = snapshot(state)
        fwd_bwd()
        sync()
        eager_grads = [g.clone() for g in grads]
        restore()

        graph = _Rerun() if args.dry_run else _Cuda(args.error_mode)
        if mode != "plain":
            ready.extend(interceptor() for _ in range(graph.passes))
        graph.capture(fwd_bwd)
        captured = made[-1]  # the capture's: its deferred buffers are the graph's, zeroed by each replay
        graph.replay()
        sync()
        # plain draws dropout from torch's own generator, a new mask each pass: nothing to compare
        same = all(
            p.grad is g and torch.equal(a, g) for a, g, p in zip(eager_grads, grads, params, strict=True)
        )
        out: dict[str, Any] = {"grads_equal": None if mode == "plain" else same}

        def update() -> None:
            if mode == "plain":
                engine.update(state, step, serve=False)
                return
            u = engine.interceptor(step, "record", new_step_log(cfg.log_format, step), defer=True)
            with engine.profile.apply(), u:
                engine.update(state, step)
            u.finish()

        failed = 0
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            graph.replay()
            rm = made[-1] if args.dry_run else captured  # the dry run's replay made a fresh one
            if rm is not None and rm._defer is not None:
                failed += bool(rm._defer.settle().failed)  # the pass's checks, read back as a step does
            update()
        sync()
        out["captured_ms"] = (time.perf_counter() - t0) / args.steps * 1e3
        out["settles_failed"] = failed
        optimizer.zero_grad(set_to_none=True)
        return out

    with _tables_in_one_arena(device):
        for name in args.modes.split(","):
            mode = cast("Mode", name)
            try:
                result[f"captured_{mode}"] = probe(mode)
            except Exception as exc:  # one mode's failure must not hide the others' figures
                error = f"{type(exc).__name__}: {exc}"
                result[f"captured_{mode}"] = {"error": error, "trace": traceback.format_exc()}
            sync()
    plain = result["eager_plain_ms"]
    for mode in MODES:
        got = result.get(f"captured_{mode}", {})
        if "captured_ms" in got:
            got["over_eager_plain"] = round(got["captured_ms"] / plain, 3)
        result[f"eager_{mode}_over_plain"] = round(result[f"eager_{mode}_ms"] / plain, 3)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}))
    for mode in MODES:
        got = result.get(f"captured_{mode}")
        if got is not None:
            print(mode, {k: v for k, v in got.items() if k != "trace"})


if __name__ == "__main__":
    main()
