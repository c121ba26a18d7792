"""The device leaf on a real GPU (issue 46): the compiled SHA-256 kernel against hashlib, the device
leaf against the host's for a state of GB gigabytes of float64, and their times. Run by
scripts/gpu_measure.sh (stage leafcheck) from the repository root:

    GB=1 REPS=5 python3 scripts/gpu_leaf_check.py

A smoke test of the script on a CPU: TRITON_INTERPRET=1 DEV=cpu GB=0.0001 python3 scripts/gpu_leaf_check.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hashlib
import os
import time

import torch
from torch import nn

from game.training.state import device_leaf, leafhash, sha256_kernel
from game.training.state.canonical import encode_state
from game.training.state.tensors import TrainState

dev = torch.device(os.environ.get("DEV", "cuda"))
gb = float(os.environ.get("GB", "1"))
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

# 1. compiled kernel against hashlib: ragged last chunks, exact chunks, many programs, 1-3 levels
sizes = [1, 55, 56, 63, 64, 65, 4095, 4096, 4097, 3 * 4096 + 1000] + ([129 * 4096 + 7, 3_000_001, 40_000_000] if dev.type == "cuda" else [])
for n in sizes:
    data = torch.randint(0, 256, (n,), dtype=torch.uint8)
    raw = data.numpy().tobytes()
    buf = torch.zeros(-(-n // 64) * 64, dtype=torch.uint8)
    buf[:n] = data
    buf = buf.to(dev)
    got = sha256_kernel.hash_chunks(buf.view(torch.int32), n).cpu().numpy().tobytes()
    assert got == b"".join(hashlib.sha256(raw[i : i + 4096]).digest() for i in range(0, n, 4096)), n
    assert leafhash.finish(sha256_kernel.device_levels(buf, n).cpu().numpy(), n) == leafhash.leaf_of(raw), n
print("kernel == hashlib, device_levels == leaf_of:", sizes)

# 2. a state of `gb` GB of float64 values on the float32 grid (8 parameters), with host float32
#    step counters beside it (as AdamW keeps them)
per = int(gb * 2**30 / 8 / 8)
model = nn.Module()
for i in range(8):
    model.register_parameter(f"p{i}", nn.Parameter(torch.randn(per, device=dev).double()))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for p in model.parameters():
    opt.state[p] = {"step": torch.tensor(3.0)}
state = TrainState(model=model, optimizer=opt, step=5)

t = time.perf_counter(); first = device_leaf.DeviceLeaf.start(state).leaf(); print(f"first leaf (compiles): {time.perf_counter() - t:.2f} s")
t = time.perf_counter(); data = encode_state(state); enc = time.perf_counter() - t
t = time.perf_counter(); ref = leafhash.leaf_of(data); hsh = time.perf_counter() - t
assert first == ref, "device leaf != host leaf"
assert device_leaf.DeviceLeaf.start(state).canonical_bytes().tobytes() == data
print(f"{len(data) / 2**20:.0f} MiB canonical bytes; host path: encode_state {enc:.2f} s + leaf_of {hsh:.2f} s")

times, starts = [], []
for _ in range(int(os.environ.get('REPS', '10'))):
    sync(); t = time.perf_counter()
    pending = device_leaf.DeviceLeaf.start(state)
    starts.append(time.perf_counter() - t)
    assert pending.leaf() == ref
    times.append(time.perf_counter() - t)
times.sort(); starts.sort()
print(f"DeviceLeaf.start(state).leaf(): median {times[len(times) // 2] * 1e3:.1f} ms (min {times[0] * 1e3:.1f}); start() alone {starts[len(starts) // 2] * 1e3:.2f} ms")

# the kernels alone, on the canonical bytes already on the device
buf, _ = device_leaf.canonical_bytes_on_device(state)
sync(); t = time.perf_counter()
reps = int(os.environ.get("REPS", "10"))
for _ in range(reps):
    last = sha256_kernel.device_levels(buf, len(data))
sync(); print(f"device_levels alone: {(time.perf_counter() - t) / reps * 1e3:.1f} ms for {leafhash.level_sizes(len(data))}")
sync(); t = time.perf_counter()
for _ in range(reps):
    device_leaf.canonical_bytes_on_device(state)
sync(); print(f"canonical_bytes_on_device alone: {(time.perf_counter() - t) / reps * 1e3:.1f} ms")

# an off-grid value: the host path's error, naming the tensor
with torch.no_grad():
    model.p3.view(-1)[per // 2] = 1.0 / 3.0
try:
    device_leaf.DeviceLeaf.start(state).leaf()
    raise SystemExit("no error for an off-grid value")
except Exception as e:
    print("off grid:", type(e).__name__, e)
