"""The device leaf on a real GPU (issue 46): the compiled SHA-256 kernel against hashlib, the device
leaf against the host's for a state of ``--gb`` gigabytes of float64, and their times. Run by
scripts/gpu_measure.sh (stage leafcheck) from the repository root:

    python3 scripts/gpu_leaf_check.py --gb 1 --reps 5

On a CPU, in Triton's interpreter (what the tests run; the times mean nothing there):

    TRITON_INTERPRET=1 python3 scripts/gpu_leaf_check.py --device cpu --gb 0.000001 --reps 1

Any mismatch exits with a message and status 1; a run that ends prints ``leafcheck: ok``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from game.training.state import device_leaf, leafhash, sha256_kernel
from game.training.state.canonical import encode_state
from game.training.state.tensors import TrainState

#: Bytes hashed per chunk by the kernel (a leaf's first level).
CHUNK = 4096


def check_kernel(dev: torch.device) -> None:
    """The compiled kernel against hashlib: ragged last chunks, exact chunks, many programs, one to
    three levels. In the interpreter a few sizes only, one of each kind: there a chunk takes
    seconds, and tests/training/test_cuda_leaf.py holds the kernel to hashlib."""
    if dev.type == "cuda":
        sizes = [1, 55, 56, 63, 64, 65, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 1000]
        sizes += [129 * CHUNK + 7, 3_000_001, 40_000_000]
    else:
        sizes = [1, 55, 64, CHUNK + 1]
    for n in sizes:
        data = torch.randint(0, 256, (n,), dtype=torch.uint8)
        raw = data.numpy().tobytes()
        padded = torch.zeros(-(-n // 64) * 64, dtype=torch.uint8)
        padded[:n] = data
        on_dev = padded.to(dev)
        got = sha256_kernel.hash_chunks(on_dev.view(torch.int32), n).cpu().numpy().tobytes()
        want = b"".join(hashlib.sha256(raw[i : i + CHUNK]).digest() for i in range(0, n, CHUNK))
        if got != want:
            sys.exit(f"leafcheck: the kernel's chunk hashes differ from hashlib's at {n} bytes")
        if leafhash.finish(sha256_kernel.device_levels(on_dev, n).cpu().numpy(), n) != leafhash.leaf_of(raw):
            sys.exit(f"leafcheck: device_levels differs from leaf_of at {n} bytes")
    print("kernel == hashlib, device_levels == leaf_of:", sizes)


def grid_state(dev: torch.device, gb: float) -> TrainState:
    """A state of ``gb`` GB of float64 values on the float32 grid (8 parameters), with host float32
    step counters beside it, as AdamW keeps them."""
    per = max(1, int(gb * 2**30 / 8 / 8))
    model = nn.Module()
    for i in range(8):
        model.register_parameter(f"p{i}", nn.Parameter(torch.randn(per, device=dev).double()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        opt.state[p] = {"step": torch.tensor(3.0)}
    return TrainState(model=model, optimizer=opt, step=5)


def median_ms(times: list[float]) -> float:
    return sorted(times)[len(times) // 2] * 1e3


def check_leaf(state: TrainState, reps: int, sync: Callable[[], None]) -> None:
    """The device leaf equals the host's (encode_state, then leaf_of), and their times."""
    t = time.perf_counter()
    first = device_leaf.DeviceLeaf.start(state).leaf()
    print(f"first leaf (compiles): {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    canonical = encode_state(state)
    encode_s = time.perf_counter() - t
    t = time.perf_counter()
    ref = leafhash.leaf_of(canonical)
    hash_s = time.perf_counter() - t
    if first != ref:
        sys.exit("leafcheck: the device leaf differs from the host's")
    if device_leaf.DeviceLeaf.start(state).canonical_bytes().tobytes() != canonical:
        sys.exit("leafcheck: the device's canonical bytes differ from encode_state's")
    print(
        f"{len(canonical) / 2**20:.0f} MiB canonical bytes; host path: encode_state {encode_s:.2f} s + leaf_of {hash_s:.2f} s"
    )

    times, starts = [], []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        pending = device_leaf.DeviceLeaf.start(state)
        starts.append(time.perf_counter() - t)
        if pending.leaf() != ref:
            sys.exit("leafcheck: a later device leaf differs from the host's")
        times.append(time.perf_counter() - t)
    print(
        f"DeviceLeaf.start(state).leaf(): median {median_ms(times):.1f} ms (min {min(times) * 1e3:.1f}); "
        f"start() alone {median_ms(starts):.2f} ms"
    )

    # the kernels alone, on the canonical bytes already on the device
    on_dev, _ = device_leaf.canonical_bytes_on_device(state)
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        sha256_kernel.device_levels(on_dev, len(canonical))
    sync()
    print(
        f"device_levels alone: {(time.perf_counter() - t) / reps * 1e3:.1f} ms for {leafhash.level_sizes(len(canonical))}"
    )
    t = time.perf_counter()
    for _ in range(reps):
        device_leaf.canonical_bytes_on_device(state)
    sync()
    print(f"canonical_bytes_on_device alone: {(time.perf_counter() - t) / reps * 1e3:.1f} ms")


def check_off_grid(state: TrainState) -> None:
    """An off-grid value: the host path's error, naming the tensor."""
    p3 = state.model.get_parameter("p3")
    with torch.no_grad():
        p3.view(-1)[p3.numel() // 2] = 1.0 / 3.0
    try:
        device_leaf.DeviceLeaf.start(state).leaf()
    except Exception as e:  # the error's kind and words are what this check shows
        if "p3" not in str(e):
            sys.exit(f"leafcheck: the off-grid error does not name the tensor: {type(e).__name__}: {e}")
        print("off grid:", type(e).__name__, e)
        return
    sys.exit("leafcheck: no error for an off-grid value")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, or cpu in Triton's interpreter")
    ap.add_argument("--gb", type=float, default=1.0, help="the state's size in GB of float64")
    ap.add_argument("--reps", type=int, default=10, help="timed leaves")
    args = ap.parse_args()
    if args.reps < 1 or args.gb <= 0:
        sys.exit("leafcheck: --reps must be at least 1 and --gb above 0")
    dev = torch.device(args.device)
    sync: Callable[[], None] = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    check_kernel(dev)
    state = grid_state(dev, args.gb)
    check_leaf(state, args.reps, sync)
    check_off_grid(state)
    print("leafcheck: ok")


if __name__ == "__main__":
    main()
