"""Helpers shared by the training tests: synthetic packed and sparse logs and a directory's files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from hypothesis import strategies as st

from game.fsio import atomic_write
from game.training.log.chunks import chunk_hash
from game.training.log.formats import ChunkLog
from game.training.log.packed import StepLog
from game.training.log.sparse import SparseStepLog
from game.training.transcript.layout import chunk_file_name

#: A payload, a block, a level and a thread count for zlib in blocks (``codec.zlib_blocks``): many
#: blocks and few, a short last block, a block larger than the payload.
ZLIB_BLOCK_CASES = st.tuples(
    st.binary(min_size=0, max_size=12000),
    st.integers(min_value=1, max_value=5000),
    st.sampled_from([1, 6, 9]),
    st.integers(min_value=1, max_value=6),
)


def random_trits(n: int, seed: int) -> torch.Tensor:
    """``n`` random trits (uint8, 0..2)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (n,), generator=gen, dtype=torch.uint8)


def sample_packed_log(seed: int = 0) -> StepLog:
    """A packed log of five records (296 trits: whole blocks and a tail, an empty record)."""
    step_log = StepLog()
    step_log.append(0, "aten.mm.default", random_trits(12, seed).reshape(3, 4))
    step_log.append(1, "aten.sum.dim_IntList", random_trits(1, seed + 1))
    step_log.append(2, "aten.native_layer_norm.default", random_trits(0, seed + 2))
    step_log.append(7, "aten._softmax.default", random_trits(33, seed + 3))
    step_log.append(9, "aten.mm.default", random_trits(250, seed + 4))  # whole blocks and a tail
    return step_log


def random_sparse_log(
    step: int,
    *,
    codec: str = "auto",
    records: int = 6,
    seed: int = 0,
    max_count: int = 5000,
    max_entries: int = 40,
    index_stride: int = 1,
    ops: Sequence[str] = ("aten.mm.default", "aten.addmm.default", "aten._softmax.default"),
) -> SparseStepLog:
    """A sparse log of ``records`` records with random sizes and positions (a step's shape)."""
    g = torch.Generator().manual_seed(seed)
    out = SparseStepLog(step, codec=codec)
    for i in range(records):
        count = int(torch.randint(1, max_count, (1,), generator=g))
        k = int(torch.randint(0, min(count, max_entries) + 1, (1,), generator=g))
        pos = torch.randperm(count, generator=g)[:k].sort().values
        out.append(index_stride * i, ops[i % len(ops)], count, pos)
    return out


def file_tree(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` by its relative path, with its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def total_values(step_log: ChunkLog) -> int:
    """Rounded values a step's log holds records for (in or out of band): its records' counts."""
    return sum(r.count for r in step_log.records)


def write_chunk(directory: Path, step: int, step_log: ChunkLog, spec_hash: bytes) -> bytes:
    """Step ``step``'s chunk file as the transcript writer lays it down (encoded, written to a temp
    file, fsynced, renamed into place); returns the chunk hash."""
    directory.mkdir(parents=True, exist_ok=True)
    data = step_log.encode(step, spec_hash)
    atomic_write(directory / chunk_file_name(step), data)
    return chunk_hash(data)
