"""A judge's evidence from the log posted on-chain, where the transcript cannot be had.

Why: a trainer that withholds its transcript but answers availability demands can have its whole
log read off the chain (:mod:`auditor_node.chainlog`). The judge has no transcript either, so it
takes the pinned step's chunk from the chain, with its proof in the log tree of every chunk there;
the config and the pre-state come from the evidence directory as ever (the auditor leaves both),
and a pre-state nobody left is replayed from the chunks.

An asynchronous update computes on older states too, which a ruling from the transcript proves
against the committed state tree. Without the transcript nobody has the trainer's leaves to prove
them by, so the judge replays them itself from the chunks (``Evidence.replayed``): the replay is
bit-exact, so an honest trainer's states are these, and so are an honest auditor's, whose leaves
came from the same replay. A micro-batch applied again is shown by the earlier chunk on-chain.
"""

from __future__ import annotations

from collections.abc import Callable

from game.chain.client import VerificationGameClient
from game.chain.types import Game, Task
from game.chunkleaf import chunk_leaf
from game.errors import RoundingLogError
from game.evidence import Evidence, PreStateEvidenceError, versions_named
from game.judgeupdate import witness_among
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
    is raised where the log is not whole on-chain; ``config`` gives the config left for the judge
    (raising its own evidence error where none was)."""
    chunks = OnChainLog.read(client, g.task_id, task.num_leaves).chunks(task.log_root)
    if chunks is None:
        raise why
    cfg = config()
    step = pinned_step(g)
    named = set(versions_named(cfg, chunks[step], step)) - {g.lo}
    wanted = named | ({g.lo} if left is None else set())
    replayed: dict[int, bytes] = {}
    if wanted:
        from game.training.engine.chunkaudit import states_after_chunks

        try:
            states = states_after_chunks(cfg, profile, chunks, wanted)
        except RoundingLogError as exc:  # an earlier update's schedule breaks the rules
            raise PreStateEvidenceError(f"no state to rule from: {exc}") from exc
        left = states[g.lo] if left is None else left
        replayed = {v: states[v] for v in named}
    tree = MerkleTree([chunk_leaf(c) for c in chunks])
    earlier = {}
    found = witness_among(cfg, chunks[step], step, chunks.__getitem__)
    if found is not None:
        earlier[found[0]] = (found[1], tree.proof(found[0]))
    return Evidence(
        config=cfg, chunk=chunks[step], chunk_proof=tree.proof(step), pre_state=left,
        earlier=earlier, replayed=replayed,
    )  # fmt: skip


__all__ = ["evidence_on_chain"]
