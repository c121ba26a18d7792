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
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _top(prof: cProfile.Profile, key: str, n: int) -> list[dict[str, Any]]:
    stats = pstats.Stats(prof, stream=io.StringIO())
    stats.sort_stats(key)
    rows = []
    for func in stats.fcn_list[:n]:  # type: ignore[attr-defined]
        _, nc, tt, ct, _ = stats.stats[func]  # type: ignore[attr-defined]
        rows.append({"func": f"{func[0]}:{func[1]}({func[2]})", "calls": nc, "own_s": tt, "cum_s": ct})
    return rows


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
    import torch

    from game.cli.options import parse_model_overrides, task_config
    from game.training.dispatch.profiles import get_profile
    from game.training.engine.step import StepEngine
    from game.training.engine.train import initial_step, train_step
    from game.training.state.leaves import LeafHasher
    from game.training.transcript.reader import Transcript
    from game.training.transcript.writer import TranscriptWriter

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--profile", default="cuda")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    cfg = task_config(args.preset, model=parse_model_overrides(args.model), batch_size=args.batch_size)
    warm = 1
    cfg = cfg.replace(steps=warm + 2 * args.steps)
    engine = StepEngine(cfg, get_profile(args.profile))
    result: dict[str, Any] = {"preset": args.preset, "model": args.model, "batch_size": args.batch_size}
    cuda = torch.device(engine.profile.device).type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    profiled: dict[str, dict[str, Any]] = {}  # one step of each kind under torch's profiler
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
            first, last = warm + 1, warm + args.steps
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

            def one_trainer_step() -> None:
                train_step(engine, writer, state, last + 1)
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
        profiled["auditor"] = torch_profile(
            lambda: engine.run_step(
                astate, last + 1, mode="replay", log=t.read_log(last + 1), hash_state=False
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
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {k: result[k] for k in ("init_s", "trainer_s_per_step", "auditor_s_per_step", "fp64_s_per_step")}
            | {f"{kind}_device_share": p["device_share"] for kind, p in profiled.items()}
        )
    )


if __name__ == "__main__":
    main()
