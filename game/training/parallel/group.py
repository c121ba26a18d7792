"""The W processes of a data-parallel run as torch.distributed sees them, and the few collectives a
step needs: micro-batch results gathered to rank 0, tensors broadcast from one rank.

Why these and no all-reduce: a ring all-reduce sums the gradients in an order that follows the ring
(and W), and the sum is rounded, so its bits depend on W. Rank 0 gathers every micro-batch's own
gradient instead and folds them in micro-batch order
(:func:`~game.training.engine.microbatch.fold_grads`); a broadcast is a copy, exact whatever the
backend. The backend is gloo on CPU, and nccl where the profile's device is CUDA and every rank has
a GPU of its own (else gloo, through the host); torchrun's environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ...) says who is who.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from game.errors import TrainingError
from game.training.engine.microbatch import MicroResult, Segment, compact

#: How long a rank waits in a collective for the others before it gives up (a rank that died is
#: seen at once, by its closed connection; this is for one that hangs).
TIMEOUT = datetime.timedelta(minutes=10)


class WorkerGroup:
    """This process's place among the workers, and the step's collectives."""

    def __init__(self, device: torch.device) -> None:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        use_nccl = device.type == "cuda" and dist.is_nccl_available() and torch.cuda.device_count() >= world
        if use_nccl:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        self.backend = "nccl" if use_nccl else "gloo"
        #: where tensors go for a collective: the device itself with nccl, the host with gloo
        self.wire = torch.device("cuda", torch.cuda.current_device()) if use_nccl else torch.device("cpu")
        dist.init_process_group(self.backend, timeout=TIMEOUT)
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of rank ``src``, on every rank (pickled)."""
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, device=self.wire)
        return box[0]

    def broadcast_tensors(self, tensors: Sequence[Tensor], src: int) -> None:
        """Rank ``src``'s values of ``tensors`` copied into every rank's (in place, the tensors
        kept): one broadcast per dtype, bit for bit."""
        if self.size == 1:
            return
        by_dtype: dict[torch.dtype, list[Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        with torch.no_grad():
            for dtype, group in by_dtype.items():
                if self.rank == src:
                    flat = torch.cat([t.detach().reshape(-1).to(self.wire) for t in group])
                else:
                    flat = torch.empty(sum(t.numel() for t in group), dtype=dtype, device=self.wire)
                dist.broadcast(flat, src=src)
                if self.rank != src:  # through .data: the model's own writes alone move a version
                    for t, piece in zip(group, flat.split([t.numel() for t in group]), strict=True):
                        t.data.copy_(piece.view_as(t))

    def gather_micro(
        self, results: Sequence[MicroResult], params: Sequence[Tensor]
    ) -> list[MicroResult] | None:
        """Every rank's micro-batch results, on rank 0 in micro-batch order (None elsewhere). Each
        rank runs as many micro-batches; a gradient travels as float64 values (its bits), its
        log segment in columns (:func:`~game.training.engine.microbatch.compact`)."""
        shapes = [p.shape for p in params]
        numels = [p.numel() for p in params]
        total = sum(numels)
        rows = torch.zeros(len(results), total, dtype=torch.float64, device=self.wire)
        meta: list[tuple[int, list[bool], Segment, float]] = []
        for i, r in enumerate(results):
            present = [g is not None for g in r.grads]
            if any(g is not None and g.dtype != torch.float64 for g in r.grads):
                raise TrainingError("data-parallel training sends float64 gradients only (a float64 task)")
            if total:
                rows[i] = torch.cat(
                    [
                        g.detach().reshape(-1).to(self.wire) if g is not None else rows.new_zeros(n)
                        for g, n in zip(r.grads, numels, strict=True)
                    ]
                )
            segment = Segment(compact(r.segment.log) if r.segment.log is not None else None, r.segment.logged)
            meta.append((r.index, present, segment, r.loss))
        lead = self.rank == 0
        tensors = [torch.empty_like(rows) for _ in range(self.size)] if lead else None
        dist.gather(rows, tensors, dst=0)
        metas: list[Any] | None = [None] * self.size if lead else None
        dist.gather_object(meta, metas, dst=0)
        if not lead:
            return None
        assert tensors is not None and metas is not None
        device = params[0].device if params else self.wire
        out: list[MicroResult] = []
        for rank_rows, rank_meta in zip(tensors, metas, strict=True):
            for row, (index, present, segment, loss) in zip(rank_rows, rank_meta, strict=True):
                pieces = row.to(device).split(numels)
                grads = [
                    piece.view(shape).clone() if k else None
                    for piece, shape, k in zip(pieces, shapes, present, strict=True)
                ]
                out.append(MicroResult(index, grads, segment, loss))
        out.sort(key=lambda r: r.index)
        if [r.index for r in out] != list(range(len(out))):
            raise TrainingError(f"the workers ran micro-batches {[r.index for r in out]}, not each once")
        return out


__all__ = ["TIMEOUT", "WorkerGroup"]
