"""What a trainer node asks of a task before it accepts it: the pure check, no chain, no files.

Why its own module: the contract checks what every task must satisfy (bonds of at least 1 wei,
every clock and window 1 s to 30 days, 2 to 2^48 leaves); a trainer has its own reasons to refuse
work that the contract cannot know of: a data key that is not the task's, a clock too short for it
to answer every game under congestion, a client judging its own task, a commit window too short
for its own hardware to train the task in, log chunks too large to post when an auditor demands one. The trainer node accepts a
task (and locks its bond) only when :func:`terms_problems` finds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from game.chain.types import Task


@dataclass(frozen=True)
class TermsPolicy:
    """What a trainer node asks of a task's terms before it accepts one, beyond what the contract
    checks itself (bonds of at least 1 wei, every clock and window 1 s to 30 days)."""

    #: Each game gives each party this many seconds at least: a trainer must answer every game
    #: opened against it within its clock, so a short clock under congestion (or under many
    #: challenges at once) is a lever against an honest trainer.
    min_clock_allowance: int = 30
    #: Whether the client may be the judge: the judge's ruling is trusted, and a client judging its
    #: own task can rule an honest trainer wrong.
    judge_may_be_client: bool = False
    #: The least payment (wei) worth the training; 0 takes any.
    min_payment: int = 0
    #: The most bond (wei) this trainer locks at its accept (None: any).
    max_bond: int | None = None
    #: The longest challenge window (seconds) this trainer waits after its commit before it can be
    #: paid, games aside (None: any the contract allows, up to 30 days).
    max_challenge_window: int | None = None
    #: The commit window must hold the training's estimated time this many times over (0: no
    #: estimate): a trainer that cannot commit in time loses its bond to the client, however
    #: honest its work. The estimate is the node's own, from a step timed before the accept.
    commit_margin: float = 2.0
    #: The largest log chunk this trainer takes a task for (None: any). No chunk is too large to
    #: defend: an availability demand is answered with one piece of it, at most 120 KiB, in one
    #: ``provideData`` (:mod:`game.chunkleaf`). A cap bounds how many pieces there are to demand,
    #: each of which costs this trainer a transaction's gas to post once.
    max_chunk_bytes: int | None = None


@dataclass(frozen=True)
class Estimate:
    """What a trainer measured of a task before accepting it (``train.probe_steps``)."""

    training_s: float  # the whole training's wall seconds
    chunk_bytes: int  # a log chunk's size


def terms_problems(
    task: Task, key_hash: bytes, policy: TermsPolicy | None = None, *, estimate: Estimate | None = None
) -> list[str]:
    """Why a trainer should not work on ``task`` (empty when it may): its data key is not the
    task's (its transcript would be sealed under a key nobody else holds), or the terms are
    outside ``policy``. ``estimate``: this trainer's measure of the task (None: not weighed), whose
    training the commit window must hold ``commit_margin`` times, and whose chunks it must be able
    to post."""
    policy = policy or TermsPolicy()
    out = []
    if task.key_hash != key_hash:
        out.append(
            f"the data key given is not the task's (its sha256 is {key_hash.hex()[:16]}..., the task's "
            f"{task.key_hash.hex()[:16]}...): the transcript would be sealed under a key nobody else holds"
        )
    if task.clock_allowance < policy.min_clock_allowance:
        out.append(
            f"the clock allowance is {task.clock_allowance} s, under the {policy.min_clock_allowance} s "
            "this trainer needs to answer every game opened against it"
        )
    if not policy.judge_may_be_client and task.judge.lower() == task.client.lower():
        out.append("the client is its own task's judge: it could rule honest work wrong")
    if task.payment < policy.min_payment:
        out.append(f"the payment is {task.payment} wei, under the {policy.min_payment} wei this trainer asks")
    if policy.max_bond is not None and task.trainer_bond > policy.max_bond:
        out.append(
            f"the trainer's bond is {task.trainer_bond} wei, over the {policy.max_bond} wei this trainer locks"
        )
    if policy.max_challenge_window is not None and task.challenge_window > policy.max_challenge_window:
        out.append(
            f"the challenge window is {task.challenge_window} s, longer than the "
            f"{policy.max_challenge_window} s this trainer waits to be paid"
        )
    if estimate is not None:
        out += _estimate_problems(task, policy, estimate)
    return out


def _estimate_problems(task: Task, policy: TermsPolicy, estimate: Estimate) -> list[str]:
    out = []
    if policy.commit_margin > 0 and task.commit_window < policy.commit_margin * estimate.training_s:
        out.append(
            f"the commit window is {task.commit_window} s, and training the task takes this trainer "
            f"about {estimate.training_s:.0f} s: it asks for {policy.commit_margin:g}x that, so as not "
            "to lose its bond to a late commit"
        )
    if policy.max_chunk_bytes is not None and estimate.chunk_bytes > policy.max_chunk_bytes:
        out.append(
            f"a log chunk of the task is about {estimate.chunk_bytes} bytes, over the "
            f"{policy.max_chunk_bytes} bytes this trainer takes: each of its pieces is one more "
            "availability demand it may have to answer on-chain"
        )
    return out


__all__ = ["Estimate", "TermsPolicy", "terms_problems"]
