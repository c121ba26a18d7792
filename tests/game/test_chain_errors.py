"""Custom errors: every ABI error decodes to its class with typed args; pre-checks agree with the contract.

Each refusal scenario is played three ways on the same state: with pre-checks (refused locally,
nothing sent), without (the gas estimate reverts, nothing sent) and with a fixed gas limit (the
transaction is mined, paid for, and its revert decoded). All three must raise the same exception
with the same arguments: that is what "the pre-check raises what the contract would" means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from eth_abi import encode as abi_encode
from hypothesis import given, settings
from hypothesis import strategies as st

from game.chain import errors as E
from game.chain.artifacts import abi_selector, abi_types, load_artifact
from game.chain.types import Outcome, Phase, TaskStatus, snake
from game.errors import ChainError, VerificationGameError
from tests.game.conftest import (
    AUDITOR_BOND,
    CLOCK,
    COMMIT_WINDOW,
    JUDGE_WINDOW,
    TRAINER_BOND,
    WINDOW,
    Setup,
    log_chunks,
)

ABI_ERRORS = load_artifact().items("error")


def test_everyAbiError_hasAClass_withTheAbiParamsInOrder() -> None:
    assert {e["name"] for e in ABI_ERRORS} == set(E.ERROR_CLASSES)
    for entry in ABI_ERRORS:
        cls = E.ERROR_CLASSES[entry["name"]]
        assert cls.params == tuple(snake(i["name"]) for i in entry["inputs"]), entry["name"]
        assert issubclass(cls, VerificationGameError) and issubclass(cls, ChainError)


def test_errorClasses_mixInTheBuiltinThatFits() -> None:
    assert issubclass(E.NotYourTurn, PermissionError)
    assert issubclass(E.Unauthorized, PermissionError)
    assert issubclass(E.ClockExpired, TimeoutError)
    assert issubclass(E.TaskNotFound, LookupError)
    assert issubclass(E.WrongBond, ValueError)
    assert issubclass(E.InvalidProof, ValueError)


def _value_for(abi_type: str, draw: Any) -> Any:
    if abi_type == "address":
        return draw(st.binary(min_size=20, max_size=20).map(lambda b: "0x" + b.hex()))
    if abi_type == "bytes32":
        return draw(st.binary(min_size=32, max_size=32))
    if abi_type == "bool":
        return draw(st.booleans())
    if abi_type == "uint8":  # the enums
        return draw(st.integers(0, 3))
    bits = int(abi_type.removeprefix("uint"))
    return draw(st.integers(0, 2**bits - 1))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ABI_ERRORS), st.data())
def test_decode_everyCustomError_roundTripsClassAndTypedArgs(
    entry: dict[str, Any], data: st.DataObject
) -> None:
    types = abi_types(entry)
    values = [_value_for(t, data.draw) for t in types]
    exc = E.decode_revert(abi_selector(entry) + abi_encode(types, values))
    cls = E.ERROR_CLASSES[entry["name"]]
    assert type(exc) is cls
    for (name, got), typ, sent in zip(exc.fields.items(), types, values, strict=True):
        assert getattr(exc, name) == got
        if typ == "address":
            assert got == E.to_checksum_address(sent)
        elif name in cls.enum_params:
            assert got == sent and isinstance(got, cls.enum_params[name])
        else:
            assert got == sent
    name, said = str(exc).split(": ", 1)  # the raw form for scripts, then what it means for people
    assert name.startswith(f"{entry['name']}(") and said
    for key, value in exc.fields.items():
        if "{" + key + "}" in cls.explain:
            assert E._show(value) in said or f"block time {value}" in said


def test_explain_saysWhatTheRefusalMeans() -> None:
    assert str(E.WrongTaskStatus(1, 1)) == (
        "WrongTaskStatus(task_id=1, status=OPEN): task 1 is OPEN: an OPEN task can be accepted or "
        "cancelled, an ACCEPTED one committed to (or cancelled once its commit window passed), a "
        "COMMITTED one challenged or finalized, a FINALIZED one's rewards claimed, a CANCELLED one "
        "nothing more"
    )
    assert str(E.WindowOpen(3, 1_800_000_000)).endswith(
        "task 3's challenge window is open until 2027-01-15 08:00:00 UTC (block time 1800000000); "
        "finalize after that"
    )
    assert "deadline is block time 18446744073709551615;" in str(E.ClockRunning(1, 2**64 - 1))  # no date
    assert all(cls.explain for cls in E.ERROR_CLASSES.values())


def test_decode_errorStringPanicUnknownAndEmpty() -> None:
    assert isinstance(
        E.decode_revert(bytes.fromhex("08c379a0") + abi_encode(["string"], ["no"])), E.RevertedWithReason
    )
    panic = E.decode_revert(bytes.fromhex("4e487b71") + abi_encode(["uint256"], [0x11]))
    assert isinstance(panic, E.ContractPanic) and panic.code == 0x11 and isinstance(panic, ArithmeticError)
    assert isinstance(E.decode_revert(b"\xde\xad\xbe\xef"), E.UnknownContractError)
    assert isinstance(E.decode_revert(b""), E.EmptyRevert)


# ------------------------------------------------------------------ refusal scenarios
# each returns (the client that acts, the action, the exception the contract raises)
Scenario = Callable[[Setup, Callable[..., Any], Any], tuple[Any, Callable[[Any], Any], E.ContractError]]


def _create(c: Any, **over: Any) -> Any:
    args: dict[str, Any] = dict(
        payment=1,
        trainer_bond=1,
        auditor_bond=1,
        clock_allowance=1,
        challenge_window=1,
        judge_window=1,
        commit_window=1,
        key_hash=b"\x00" * 32,
    )
    args.update(over)
    trainer = args.pop("trainer", "0x" + "22" * 20)
    judge = args.pop("judge", "0x" + "33" * 20)
    args.setdefault("num_leaves", 2)
    return c.create_task(b"\x00" * 32, trainer, judge, **args)


def zero_payment(s: Setup, gc: Any, chain: Any) -> Any:
    return s.client, lambda c: _create(c, payment=0), E.ZeroPayment()


def invalid_roles(s: Setup, gc: Any, chain: Any) -> Any:
    same = s.trainer.me
    return s.client, lambda c: _create(c, trainer=same, judge=same), E.InvalidRoles(same, same)


def invalid_durations(s: Setup, gc: Any, chain: Any) -> Any:
    return s.client, lambda c: _create(c, judge_window=0), E.InvalidDurations(1, 1, 0, 1)


def durations_too_long(s: Setup, gc: Any, chain: Any) -> Any:
    """Issue 44: a silent party could hold a payment for about 136 years (2^32 - 1 s clocks)."""
    act = lambda c: _create(c, clock_allowance=2**32 - 1, commit_window=30 * 86_400 + 1)  # noqa: E731
    return s.client, act, E.InvalidDurations(2**32 - 1, 1, 1, 30 * 86_400 + 1)


def invalid_bonds(s: Setup, gc: Any, chain: Any) -> Any:
    return s.client, lambda c: _create(c, auditor_bond=0), E.InvalidBonds(1, 0)


def accept_wrong_bond(s: Setup, gc: Any, chain: Any) -> Any:
    act = lambda c: c.accept(s.task_id, bond=TRAINER_BOND + 1)  # noqa: E731
    return s.trainer, act, E.WrongBond(TRAINER_BOND + 1, TRAINER_BOND)


def accept_by_stranger(s: Setup, gc: Any, chain: Any) -> Any:
    stranger = gc("stranger")
    return stranger, lambda c: c.accept(s.task_id), E.Unauthorized(stranger.me, s.trainer.me)


def accept_twice(s: Setup, gc: Any, chain: Any) -> Any:
    s.trainer.accept(s.task_id)
    return s.trainer, lambda c: c.accept(s.task_id), E.WrongTaskStatus(s.task_id, TaskStatus.ACCEPTED)


def cancel_accepted(s: Setup, gc: Any, chain: Any) -> Any:
    """Issue 44: the client front-running a commit with a cancel, after the trainer accepted."""
    s.trainer.accept(s.task_id)
    commit_by = s.client.task(s.task_id).commit_by
    return s.client, lambda c: c.cancel(s.task_id), E.CommitWindowOpen(s.task_id, commit_by)


def commit_unaccepted(s: Setup, gc: Any, chain: Any) -> Any:
    from game.merkle import MerkleTree

    tree = MerkleTree([bytes([i]) * 32 for i in range(2)])
    s.sized(2)
    act = lambda c: c.commit_tree(s.task_id, tree, b"\x00" * 32, b"\x00" * 32)  # noqa: E731
    return s.trainer, act, E.WrongTaskStatus(s.task_id, TaskStatus.OPEN)


def commit_too_late(s: Setup, gc: Any, chain: Any) -> Any:
    from game.merkle import MerkleTree

    tree = MerkleTree([bytes([i]) * 32 for i in range(2)])
    s.accepted(2)
    commit_by = s.client.task(s.task_id).commit_by
    chain.time_travel(COMMIT_WINDOW + 5)
    act = lambda c: c.commit_tree(s.task_id, tree, b"\x00" * 32, b"\x00" * 32)  # noqa: E731
    return s.trainer, act, E.CommitWindowClosed(s.task_id, commit_by)


def task_not_found(s: Setup, gc: Any, chain: Any) -> Any:
    return s.client, lambda c: c.cancel(99), E.TaskNotFound(99)


def cancel_wrong_status(s: Setup, gc: Any, chain: Any) -> Any:
    s.client.cancel(s.task_id)
    return s.client, lambda c: c.cancel(s.task_id), E.WrongTaskStatus(s.task_id, TaskStatus.CANCELLED)


def cancel_unauthorized(s: Setup, gc: Any, chain: Any) -> Any:
    return s.auditor, lambda c: c.cancel(s.task_id), E.Unauthorized(s.auditor.me, s.client.me)


def create_one_leaf(s: Setup, gc: Any, chain: Any) -> Any:
    return s.client, lambda c: _create(c, num_leaves=1), E.InvalidLeafCount(1)


def create_too_many_leaves(s: Setup, gc: Any, chain: Any) -> Any:
    return s.client, lambda c: _create(c, num_leaves=2**48 + 1), E.InvalidLeafCount(2**48 + 1)


def commit_zero_leaves(s: Setup, gc: Any, chain: Any) -> Any:
    z = b"\x00" * 32
    n = s.client.task(s.task_id).num_leaves
    s.accepted(n)
    return s.trainer, lambda c: c.commit(s.task_id, z, z, 0, z, z, [], z, []), E.LeafCountMismatch(n, 0)


def commit_truncated(s: Setup, gc: Any, chain: Any) -> Any:
    """Issue 44 exploit 1: a task of 16 steps, the trainer commits the initial state alone (valid
    proofs of a one-leaf tree)."""
    from game.merkle import MerkleTree

    s.accepted(17)
    tree = MerkleTree([b"\x01" * 32])
    act = lambda c: c.commit_tree(s.task_id, tree, b"\x00" * 32, b"\x00" * 32)  # noqa: E731
    return s.trainer, act, E.LeafCountMismatch(17, 1)


def commit_three_of_seventeen(s: Setup, gc: Any, chain: Any) -> Any:
    from game.merkle import MerkleTree

    s.accepted(17)
    tree = MerkleTree([bytes([i]) * 32 for i in range(3)])
    act = lambda c: c.commit_tree(s.task_id, tree, b"\x00" * 32, b"\x00" * 32)  # noqa: E731
    return s.trainer, act, E.LeafCountMismatch(17, 3)


def commit_bad_proof(s: Setup, gc: Any, chain: Any) -> Any:
    from game.merkle import MerkleTree

    tree = MerkleTree([bytes([i]) * 32 for i in range(5)])
    s.accepted(5)
    wrong = b"\x09" * 32
    act = lambda c: c.commit(  # noqa: E731
        s.task_id, tree.root, wrong, 5, wrong, wrong, tree.proof(0), tree.leaf(4), tree.proof(4)
    )
    return s.trainer, act, E.InvalidProof(0, wrong)


def commit_by_stranger(s: Setup, gc: Any, chain: Any) -> Any:
    from game.merkle import MerkleTree

    tree = MerkleTree([b"\x01" * 32])
    stranger = gc("stranger")
    s.accepted(s.client.task(s.task_id).num_leaves)
    act = lambda c: c.commit_tree(s.task_id, tree, b"\x00" * 32, b"\x00" * 32)  # noqa: E731
    return stranger, act, E.Unauthorized(stranger.me, s.trainer.me)


def _commit(s: Setup, n: int) -> None:
    s.commit(n)


def _log_proof(n: int, index: int) -> tuple[bytes, Any]:
    from game.chunkleaf import chunk_leaf
    from game.merkle import MerkleTree

    chunks = log_chunks(n)
    return chunks[index], MerkleTree([chunk_leaf(c) for c in chunks]).proof(index)


def demand_out_of_range(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    return s.auditor, lambda c: c.challenge_data(s.task_id, 9), E.DataIndexOutOfRange(9, 9)


def demand_posted_chunk(s: Setup, gc: Any, chain: Any) -> Any:
    """A chunk posted once is public: nobody can make the trainer post it again (left to the
    estimate: no view says which chunks were posted)."""
    _commit(s, 9)
    gid = s.auditor.challenge_data(s.task_id, 4).result
    s.trainer.provide_data(gid, *_log_proof(9, 4))
    other = gc("auditor2")
    return other, lambda c: c.challenge_data(s.task_id, 4), E.DataAlreadyProvided(s.task_id, 4, 0)


def demand_posted_piece_by_another_number(s: Setup, gc: Any, chain: Any) -> Any:
    """Once a chunk's piece count is known (here one piece), a demand's piece number is reduced by
    it: piece 5 of a one-piece chunk is piece 0, posted already."""
    _commit(s, 9)
    gid = s.auditor.challenge_data(s.task_id, 4, 3).result
    s.trainer.provide_data(gid, *_log_proof(9, 4))
    other = gc("auditor2")
    return other, lambda c: c.challenge_data(s.task_id, 4, 5), E.DataAlreadyProvided(s.task_id, 4, 0)


def provide_wrong_chunk(s: Setup, gc: Any, chain: Any) -> Any:
    from game.chunkleaf import chunk_leaf

    _commit(s, 9)
    gid = s.auditor.challenge_data(s.task_id, 4).result
    chunk, proof = _log_proof(9, 3)  # step 3's chunk, with its own valid proof
    act = lambda c: c.provide_data(gid, chunk, proof)  # noqa: E731
    return s.trainer, act, E.InvalidProof(4, chunk_leaf(chunk))


def provide_in_bisection(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    gid = s.auditor.challenge(s.task_id).result
    act = lambda c: c.provide_data(gid, *_log_proof(9, 4))  # noqa: E731
    return s.trainer, act, E.NotYourTurn(gid, Phase.AWAITING_REVEAL)


def claim_live_game(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    gid = s.auditor.challenge(s.task_id).result
    return s.client, lambda c: c.claim_reward(gid), E.NoReward(gid, Outcome.NONE)


def claim_unsettled(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    gid = s.auditor.challenge_data(s.task_id, 2).result
    chain.time_travel(CLOCK + 5)
    s.client.timeout(gid)  # the trainer posted nothing: the auditor won
    return s.client, lambda c: c.claim_reward(gid), E.WrongTaskStatus(s.task_id, TaskStatus.COMMITTED)


def claim_twice(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    gid = s.auditor.challenge_data(s.task_id, 2).result
    chain.time_travel(WINDOW + 5)
    s.client.timeout(gid)
    s.client.finalize(s.task_id)
    s.client.claim_reward(gid)
    return s.client, lambda c: c.claim_reward(gid), E.RewardAlreadyClaimed(gid)


def challenge_after_window(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    chain.time_travel(WINDOW + 5)
    ends = s.client.task(s.task_id).window_ends
    return s.auditor, lambda c: c.challenge(s.task_id), E.WindowClosed(s.task_id, ends)


def challenge_by_trainer(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    return s.trainer, lambda c: c.challenge(s.task_id), E.ChallengerNotAllowed(s.trainer.me)


def challenge_wrong_bond(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    return s.auditor, lambda c: c.challenge(s.task_id, bond=1), E.WrongBond(1, AUDITOR_BOND)


def reveal_unknown_game(s: Setup, gc: Any, chain: Any) -> Any:
    return s.trainer, lambda c: c.reveal(7, b"\x00" * 32, []), E.GameNotFound(7)


def respond_before_reveal(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    gid = s.auditor.challenge(s.task_id).result
    return s.auditor, lambda c: c.respond(gid, True), E.NotYourTurn(gid, Phase.AWAITING_REVEAL)


def reveal_by_auditor(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    gid = s.auditor.challenge(s.task_id).result
    tree = s.tree
    assert tree is not None
    return (
        s.auditor,
        lambda c: c.reveal(gid, tree.leaf(4), tree.proof(4)),
        E.Unauthorized(s.auditor.me, s.trainer.me),
    )


def reveal_wrong_leaf(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    gid = s.auditor.challenge(s.task_id).result
    tree = s.tree
    assert tree is not None
    return s.trainer, lambda c: c.reveal(gid, tree.leaf(3), tree.proof(4)), E.InvalidProof(4, tree.leaf(3))


def reveal_after_clock(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    gid = s.auditor.challenge(s.task_id).result
    g = s.auditor.game(gid)
    chain.time_travel(CLOCK + 10)
    tree = s.tree
    assert tree is not None
    act = lambda c: c.reveal(gid, tree.leaf(4), tree.proof(4))  # noqa: E731
    return s.trainer, act, E.ClockExpired(gid, g.last_move_at + g.trainer_clock)


def rule_after_deadline(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 2)
    gid = s.auditor.challenge(s.task_id).result
    g = s.judge.game(gid)
    chain.time_travel(JUDGE_WINDOW + 10)
    return s.judge, lambda c: c.rule(gid, b"\x00" * 32), E.ClockExpired(gid, g.last_move_at + JUDGE_WINDOW)


def rule_twice(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 2)
    gid = s.auditor.challenge(s.task_id).result
    assert s.tree is not None
    s.judge.rule(gid, s.tree.leaf(1))
    return s.judge, lambda c: c.rule(gid, b"\x00" * 32), E.GameOver(gid, Outcome.TRAINER_WON)


def timeout_too_early(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    gid = s.auditor.challenge(s.task_id).result
    due = s.auditor.deadline(gid)
    return s.auditor, lambda c: c.timeout(gid), E.ClockRunning(gid, due)


def finalize_too_early(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    ends = s.client.task(s.task_id).window_ends
    return s.client, lambda c: c.finalize(s.task_id), E.WindowOpen(s.task_id, ends)


def finalize_with_live_game(s: Setup, gc: Any, chain: Any) -> Any:
    _commit(s, 9)
    s.auditor.challenge(s.task_id)
    chain.time_travel(WINDOW + 5)
    return s.client, lambda c: c.finalize(s.task_id), E.GamesLive(s.task_id, 1)


def withdraw_nothing(s: Setup, gc: Any, chain: Any) -> Any:
    stranger = gc("stranger")
    return stranger, lambda c: c.withdraw(), E.NothingToWithdraw(stranger.me)


SCENARIOS: list[Scenario] = [
    zero_payment,
    invalid_roles,
    invalid_durations,
    durations_too_long,
    invalid_bonds,
    task_not_found,
    cancel_wrong_status,
    cancel_unauthorized,
    cancel_accepted,
    accept_wrong_bond,
    accept_by_stranger,
    accept_twice,
    commit_unaccepted,
    commit_too_late,
    create_one_leaf,
    create_too_many_leaves,
    commit_zero_leaves,
    commit_truncated,
    commit_three_of_seventeen,
    commit_bad_proof,
    commit_by_stranger,
    challenge_after_window,
    challenge_by_trainer,
    challenge_wrong_bond,
    reveal_unknown_game,
    respond_before_reveal,
    reveal_by_auditor,
    reveal_wrong_leaf,
    reveal_after_clock,
    rule_after_deadline,
    rule_twice,
    timeout_too_early,
    finalize_too_early,
    finalize_with_live_game,
    demand_out_of_range,
    demand_posted_chunk,
    demand_posted_piece_by_another_number,
    provide_wrong_chunk,
    provide_in_bisection,
    claim_live_game,
    claim_unsettled,
    claim_twice,
    withdraw_nothing,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", ["precheck", "estimate", "mined"])
def test_refusal_sameExceptionWhicheverLayerRefuses(
    scenario: Scenario, mode: str, open_task: Setup, game_client: Callable[..., Any], chain: Any
) -> None:
    actor, act, expected = scenario(open_task, game_client, chain)
    if mode == "estimate":
        actor = actor.with_options(prechecks=False)
    elif mode == "mined":
        actor = actor.with_options(prechecks=False, fixed_gas=500_000)
    nonce = chain.nonce(actor.me)
    with pytest.raises(type(expected)) as info:
        act(actor)
    assert info.value == expected, f"{info.value} != {expected}"
    # pre-checks and estimates send nothing; a fixed gas limit gets the revert mined (and paid)
    assert chain.nonce(actor.me) == nonce + (1 if mode == "mined" else 0)


def test_precheck_wrongTurn_raisesBeforeAnyTransaction(open_task: Setup, chain: Any) -> None:
    _commit(open_task, 17)
    gid = open_task.auditor.challenge(open_task.task_id).result
    block = chain.block_number()
    with pytest.raises(E.NotYourTurn) as info:
        open_task.auditor.respond(gid, False)
    assert isinstance(info.value, PermissionError) and info.value.phase is Phase.AWAITING_REVEAL
    assert chain.block_number() == block
