"""A judge's evidence from the log posted on-chain, where the transcript cannot be had.

Why: a trainer that withholds its transcript but answers availability demands can have its whole
log read off the chain (:mod:`auditor_node.chainlog`). The judge has no transcript either, so it
takes the pinned step's chunk from the chain, with its proof in the log tree of every chunk there;
the config and the pre-state come from the evidence directory as ever (the auditor leaves both),
and a pre-state nobody left is replayed from the chunks. A synchronous task only, as the auditor's
reading.
"""

from __future__ import annotations

from collections.abc import Callable

from game.chain.client import VerificationGameClient
from game.chain.types import Game, Task
from game.chunkleaf import chunk_leaf
from game.evidence import Evidence
from game.merkle import MerkleTree
from game.onchainlog import OnChainLog
from game.protocol.solver import pinned_step
from game.training.task.config import TaskConfig


def evidence_on_chain(
    client: VerificationGameClient,
    g: Game,
    task: Task,
    config: Callable[[], TaskConfig],
    left: bytes | None,
    profile: str,
    why: Exception,
) -> Evidence:
    """The evidence of pinned game ``g`` from the chain: ``why`` (the transcript's unavailability)
    is raised where the log is not whole on-chain, or the task is asynchronous; ``config`` gives the
    config left for the judge (raising its own evidence error where none was)."""
    chunks = OnChainLog.read(client, g.task_id, task.num_leaves).chunks(task.log_root)
    if chunks is None:
        raise why
    cfg = config()
    if cfg.scheduled:
        raise why
    if left is None:
        from game.training.engine.chunkaudit import state_after_chunks

        left = state_after_chunks(cfg, profile, chunks, g.lo)
    step = pinned_step(g)
    proof = MerkleTree([chunk_leaf(c) for c in chunks]).proof(step)
    return Evidence(config=cfg, chunk=chunks[step], chunk_proof=proof, pre_state=left)


__all__ = ["evidence_on_chain"]
