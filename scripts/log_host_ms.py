"""What a step's rounding log costs the host on a deferring (CUDA) step, on any machine (issue 46).

At the GPT-2-small shape a step lists some ten million in-band values, so a step's log is large:
the trainer's thread turns the positions read back from the GPU into the log and builds the
chunk's payload, and the auditor's thread reads, checks and decodes the chunk and gathers its
entries for one copy to the GPU. On a GPU that work waits for nothing but the host. This script
times it on a transcript's own chunks, through the code a step runs:

* auditor: ``Transcript.read_log`` (read, hash check, decompress, decode), alone and with a thread
  of Python beside it (``auditor_read_busy_ms``: each time the read lets the GIL go, it waits to
  take it back, as beside a GPU step's host work), then the set-up of a
  deferring replay interceptor (the chunk's entries checked and gathered for the device); and
  how long the auditor's thread waits for each chunk where ``vgame audit`` reads it, on a thread
  while a step runs (``ReadAhead``), with ``--step-ms`` of Python (which holds the GIL, as a GPU
  step's host work does; ``--step-sleeps``: a sleep, as a step waiting for its GPU) standing in
  for each step (``auditor_wait_ms``; the first step reads its own), reading one chunk ahead and
  as a GPU auditor reads them (``auditor_wait_ms_by_depth``, ``GPU_DEPTH`` side by side);
* trainer: ``Deferred.settle`` with each record's flags as the kernels would leave them, the
  interceptor's read-back into its log (``deferred_failed``), and ``prepare`` (the payload, but
  for a log of ``BUILD_LATER_MIN`` entries or more, whose payload the writer's thread builds:
  ``writer_build_ms``). The flags' join, ``nonzero`` and the lanes made relative to their calls'
  flags (``listed_lanes``) are device work on a GPU: they are timed apart
  (``trainer_device_work_ms``), and ``trainer_host_ms`` is timed with their result handed over;
* writer: the chunk's payload compressed as the writer's thread compresses it (``writer.c`` where it
  is used), on one thread, two, and ``compress_threads()``, beside zlib's one piece at the same level,
  the way before a large payload was cut into blocks (``writer``).

    python3 scripts/log_host_ms.py --transcript DIR [--steps 1,2,3] [--repeats 3] [--step-ms MS] [--step-sleeps]

Prints one JSON object: per step its listed values, the best of ``--repeats`` host ms of each
part, and whether the trainer's side rebuilt the step's chunk byte for byte (``same_chunk``). Runs the Triton kernels nowhere: the steps' tensors are CPU tensors down the CUDA path.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import cuda_on_cpu  # first: it sets Triton's interpreter switch


def best_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The best of ``repeats`` timings of ``fn()`` in ms, and its last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return round(best * 1e3, 2), out


def device_work(mode: Any) -> Any:
    """What a deferring record step's read-back does on the device (``listed_lanes``): the flags
    of every call with listed lanes joined, their ``nonzero``, each lane made relative to its call's
    flags, and each call's count."""
    import torch

    from game.training.numerics.cuda_deferred import listed_lanes

    d = mode._defer
    pieces, lanes_of, _ = d.listed_pieces(torch.cat(d._buffers)[: d._rows, 4].tolist())
    return listed_lanes(pieces, lanes_of)


@contextlib.contextmanager
def python_beside() -> Iterator[None]:
    """A thread running Python while the block runs: it holds the GIL but for its switch interval,
    as a GPU step's host work does, so each time the block lets the GIL go it waits to take it back."""
    import threading

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    thread = threading.Thread(target=spin, name="python-beside")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def read_back(listed: Any) -> Iterator[None]:
    """``Deferred.settle``'s device work (``listed_lanes``) stands in by its result ``listed``,
    computed before the clock started."""
    from game.training.numerics import cuda_deferred

    with mock.patch.object(cuda_deferred, "listed_lanes", lambda *_: listed):
        yield


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transcript", required=True)
    ap.add_argument("--steps", default=None, help="comma-separated steps (default: every step)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=300.0, help="the stand-in step of auditor_wait_ms")
    ap.add_argument("--step-sleeps", action="store_true", help="the stand-in step sleeps (waits for its GPU)")
    args = ap.parse_args()

    from game.training.dispatch.profiles import get_profile
    from game.training.engine.step import StepEngine
    from game.training.transcript.readahead import GPU_DEPTH
    from game.training.transcript.reader import Transcript

    cuda_on_cpu.stub_kernels(lambda *_: None)
    t = Transcript(args.transcript)
    engine = StepEngine(t.config, get_profile("cpu-1t"))
    engine.defer_anywhere = True
    steps = [int(s) for s in args.steps.split(",")] if args.steps else list(range(1, t.steps + 1))
    out: dict[str, Any] = {"transcript_steps": t.steps, "steps": {}}
    for step in steps:
        out["steps"][step] = measure(t, engine, step, args.repeats)
    for depth in sorted({1, GPU_DEPTH}):
        for step, ms in waits(t, steps, args.step_ms, depth, args.step_sleeps).items():
            if depth == 1:
                out["steps"][step]["auditor_wait_ms"] = ms
            out["steps"][step].setdefault("auditor_wait_ms_by_depth", {})[depth] = ms
    print(json.dumps(out))


def waits(t: Any, steps: list[int], step_ms: float, depth: int, sleeps: bool) -> dict[int, float]:
    """The ms the auditor's thread waits for each step's chunk through a ``ReadAhead`` of ``depth``,
    with a stand-in step of ``step_ms`` between two reads: Python, or a sleep (``sleeps``)."""
    from game.training.transcript.readahead import ReadAhead

    out = {}
    with ReadAhead(t, steps[-1], depth=depth) as logs:
        for step in steps:
            t0 = time.perf_counter()
            logs.read_log(step)
            out[step] = round((time.perf_counter() - t0) * 1e3, 2)
            if sleeps:  # a step that waits for its GPU, without the GIL
                time.sleep(step_ms / 1e3)
                continue
            end = time.perf_counter() + step_ms / 1e3
            while time.perf_counter() < end:  # Python, holding the GIL but for its switch interval
                pass
    return out


def measure(t: Any, engine: Any, step: int, repeats: int) -> dict[str, Any]:
    """The host ms of ``step``'s log on each side (module docstring), the best of ``repeats``."""
    import torch

    from game.training.log.formats import new_step_log
    from game.training.numerics.cuda_deferred import Deferred

    read_ms, log = best_ms(lambda: t.read_log(step), repeats)
    with python_beside():
        read_busy_ms, _ = best_ms(lambda: t.read_log(step), repeats)
    setup_ms, _ = best_ms(lambda: engine.interceptor(step, "replay", log, defer=True), repeats)
    records = [(e.record, e.positions) for e in log.entries()]

    def deferred_step() -> Any:
        """A record interceptor whose deferred calls left ``records``' flags and counters."""
        mode = engine.interceptor(step, "record", new_step_log(t.config.log_format, step), defer=True)
        d = mode._defer
        assert isinstance(d, Deferred)
        for ticket, (record, positions) in enumerate(records):
            flags = torch.zeros(record.count, dtype=torch.int8)
            flags[positions] = 1
            row = d._row()
            row[4] = positions.numel()
            d._tickets.append((d._rows - 1, len(d._pieces), record.count))
            d._pieces.append(flags)
            mode._pending.append((record.op_index, record.op_name, record.count, ticket))
        return mode

    def settle(mode: Any) -> Any:
        mode.deferred_failed()
        return mode.log.prepare(step, t.spec_hash)

    chunks: list[bytes] = []
    payloads: list[bytes] = []

    def once() -> tuple[float, float, float]:
        mode = deferred_step()
        device_ms, listed = best_ms(lambda: device_work(mode), 1)
        with read_back(listed):
            host_ms, prepared = best_ms(lambda: settle(mode), 1)
        # what is left of the payload to build, on the writer's thread (a large log's, BUILD_LATER_MIN)
        build_ms, compressible = best_ms(lambda: prepared.compressible, 1)
        chunks.append(prepared.encode(step, t.spec_hash))
        if compressible is not None:  # a sparse chunk: its payload is what the writer compresses
            payloads.append(compressible.payload)
        return host_ms, device_ms, build_ms

    host, device, build = (min(ms) for ms in zip(*(once() for _ in range(repeats)), strict=True))
    return {
        "listed": sum(int(p.numel()) for _, p in records),
        "auditor_read_ms": read_ms,
        "auditor_read_busy_ms": read_busy_ms,
        "auditor_setup_ms": setup_ms,
        "trainer_host_ms": host,
        "trainer_device_work_ms": device,
        "writer_build_ms": build,
        # the trainer's side rebuilt the step's chunk byte for byte: the work timed is the real one
        "same_chunk": all(c == t.chunk_bytes(step) for c in chunks),
        "writer": writer_ms(payloads[-1], repeats) if payloads else None,
    }


def writer_ms(payload: bytes, repeats: int) -> dict[str, Any]:
    """The writer's zlib of ``payload``: its bytes and best ms on one thread and on the threads the
    writer uses, beside zlib's one piece at the same level; every way's bytes decode to the payload."""
    import zlib

    from game.training.log.codec import compress_threads, compress_with, zlib_block, zlib_level
    from game.training.transcript import stepwriter

    size = len(payload)
    level, block = zlib_level(size), zlib_block(size)
    c_call = stepwriter.available()

    def ours(threads: int) -> bytes:
        got = stepwriter.compress(payload, "zlib", threads=threads) if c_call else None
        return got if got is not None else compress_with(payload, "zlib", threads=threads)

    one_ms, one = best_ms(lambda: zlib.compress(payload, level), repeats)
    by_threads = {}
    for threads in sorted({1, 2, compress_threads()}):
        ms, got = best_ms(functools.partial(ours, threads), repeats)
        assert zlib.decompress(got) == payload
        by_threads[threads] = {"ms": ms, "bytes": len(got)}
    assert zlib.decompress(one) == payload
    return {
        "payload_bytes": size,
        "level": level,
        "block": block,
        "by": "c" if c_call else "python",
        "ms_by_threads": by_threads,
        "one_piece_ms": one_ms,
        "one_piece_bytes": len(one),
    }


if __name__ == "__main__":
    cuda_on_cpu.run(main)
