"""Random games between honest and dishonest actors (Hypothesis stateful test).

One task per example: the trainer is honest or lies from a fuzzed step ``s`` on (a poisoned step: its
later steps are computed correctly from the wrong state, so only step ``s`` is a wrong transition).
Up to three auditors challenge, each honest (answers by comparing with the honest run) or dishonest
(answers at random, may stall). Dishonest parties may stall until they are timed out; honest ones
always move in time. The judge is honest. Random out-of-turn, repeated and late moves by anyone are
thrown in and must revert with the documented error and change nothing.

A trainer first tries to commit a tree of another size (fewer leaves, N = 1 included, or more),
which must revert ``LeafCountMismatch`` (the task fixed its leaf count at creation).

Invariants after every step: the contract's balance equals credits plus escrow, every account's
credit equals the model's, and when a game ends the honest side has won it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from game.merkle import MerkleTree
from tests.contracts.driver import (
    AUDITOR_BOND,
    AUDITOR_WON,
    AWAITING_RESPONSE,
    AWAITING_REVEAL,
    ENDED,
    PAYMENT,
    PINNED,
    TRAINER_BOND,
    TRAINER_WON,
    Env,
    leaves,
)

MAX_GAMES = 3


@dataclass
class GameModel:
    game_id: int
    auditor: str
    honest: bool
    ended: bool = False


def _make_machine(env: Env) -> type[RuleBasedStateMachine]:
    class VerificationGameMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.snap = env.chain.snapshot()
            self.games: list[GameModel] = []
            self.expected_credit: dict[str, int] = {}
            self.trainer_lost = False
            self.finalized = False

        # ------------------------------------------------------------ setup
        @initialize(
            n=st.integers(2, 40),
            lie=st.booleans(),
            diverge=st.integers(1, 39),
            truncate=st.integers(1, 44),
        )
        def setup(self, n: int, lie: bool, diverge: int, truncate: int) -> None:
            self.n = n
            self.s = min(diverge, n - 1) if lie else None
            self.honest = leaves(n)
            self.tree = MerkleTree(leaves(n, diverge_at=self.s))
            self.task = env.create_task(n)
            if truncate != n:
                # the trainer first tries a commitment of another size (issue 44: truncated, N = 1
                # included, or padded), with proofs that verify: refused, and nothing changes
                short = MerkleTree(leaves(truncate, diverge_at=self.s))
                assert env.reverts(env.commit_fn(self.task, short), env.trainer, TRAINER_BOND) == (
                    "LeafCountMismatch",
                    (n, truncate),
                )
            env.commit(self.task, self.tree)
            self.window_ends = env.task(self.task).windowEnds

        # ------------------------------------------------------------ helpers
        def _credit(self, who: str, amount: int) -> None:
            self.expected_credit[who] = self.expected_credit.get(who, 0) + amount

        def _live(self, phase: int | None = None) -> list[GameModel]:
            out = [g for g in self.games if not g.ended]
            if phase is not None:
                out = [g for g in out if env.game_state(g.game_id).phase == phase]
            return out

        def _mover_honest(self, g: GameModel, phase: int) -> bool:
            if phase == AWAITING_REVEAL:
                return self.s is None
            if phase == AWAITING_RESPONSE:
                return g.honest
            return phase == PINNED  # the judge is honest

        def _honest_limit(self) -> int:
            """Time travel must stay before this: the earliest deadline of an honest party to move
            (honest parties always move in time, in every game at once)."""
            limits = [
                env.deadline(g.game_id)
                for g in self._live()
                if self._mover_honest(g, env.game_state(g.game_id).phase)
            ]
            return min(limits, default=2**63)

        def _move_time(self, g: GameModel, delay: int) -> bool:
            """Pick the time of the next move in ``g``: ``delay`` seconds on, but within the mover's
            clock and before any honest party's deadline. False when no such time is left."""
            latest = min(env.deadline(g.game_id), self._honest_limit())
            ts = min(env.now() + delay, latest)
            if ts <= env.now():
                return False
            env.at(ts)
            return True

        def _record_end(self, g: GameModel, receipt: object) -> None:
            ev = env.event(receipt, "GameEnded")
            g.ended = True
            trainer_honest = self.s is None
            if trainer_honest:
                assert ev["outcome"] == TRAINER_WON, "an honest trainer lost a game"
            elif g.honest:
                assert ev["outcome"] == AUDITOR_WON, "an honest auditor lost against a lying trainer"
            if ev["outcome"] == TRAINER_WON:
                self._credit(env.trainer, AUDITOR_BOND)
            elif ev["outcome"] == AUDITOR_WON:
                self._credit(g.auditor, AUDITOR_BOND + (0 if self.trainer_lost else TRAINER_BOND))
                self.trainer_lost = True

        # ------------------------------------------------------------ rules
        @precondition(lambda self: not self.finalized and len(self.games) < MAX_GAMES)
        @rule(idx=st.integers(0, 3), honest=st.booleans())
        def challenge(self, idx: int, honest: bool) -> None:
            if env.now() + 1 >= self.window_ends:
                return
            auditor = env.auditors[idx]
            game_id = env.challenge(self.task, auditor)
            self.games.append(GameModel(game_id, auditor, honest))

        @precondition(lambda self: any(not g.ended for g in self.games))
        @rule(data=st.data())
        def trainer_reveals(self, data: st.DataObject) -> None:
            live = self._live(AWAITING_REVEAL)
            if not live:
                return
            g = data.draw(st.sampled_from(live))
            if self._move_time(g, data.draw(st.integers(1, 600))):
                env.reveal(g.game_id, self.tree)

        @precondition(lambda self: any(not g.ended for g in self.games))
        @rule(data=st.data())
        def auditor_responds(self, data: st.DataObject) -> None:
            live = self._live(AWAITING_RESPONSE)
            if not live:
                return
            g = data.draw(st.sampled_from(live))
            mid = env.mid(g.game_id)
            agree = self.tree.leaf(mid) == self.honest[mid] if g.honest else data.draw(st.booleans())
            if not self._move_time(g, data.draw(st.integers(1, 600))):
                return
            env.respond(g.game_id, agree)
            state = env.game_state(g.game_id)
            if state.phase == PINNED and g.honest and self.s is not None:
                assert state.hi == self.s, "an honest auditor must pin the first wrong step"

        @precondition(lambda self: any(not g.ended for g in self.games))
        @rule(data=st.data())
        def judge_rules(self, data: st.DataObject) -> None:
            live = self._live(PINNED)
            if not live:
                return
            g = data.draw(st.sampled_from(live))
            if not self._move_time(g, data.draw(st.integers(1, 600))):
                return
            state = env.game_state(g.game_id)
            hi = state.hi
            if state.disputeInit:
                computed = self.honest[0]
            elif hi == self.s:
                computed = self.honest[hi]  # re-running the poisoned step correctly
            else:
                computed = self.tree.leaf(hi)  # every other step of the trainer is a correct transition
            self._record_end(g, env.rule(g.game_id, computed))

        @precondition(lambda self: any(not g.ended for g in self.games))
        @rule(data=st.data())
        def dishonest_party_stalls(self, data: st.DataObject) -> None:
            """A dishonest mover stops answering; anyone claims the timeout (possibly much later)."""
            candidates = []
            for g in self._live():
                phase = env.game_state(g.game_id).phase
                if (phase == AWAITING_REVEAL and self.s is not None) or (
                    phase == AWAITING_RESPONSE and not g.honest
                ):
                    candidates.append(g)
            if not candidates:
                return
            g = data.draw(st.sampled_from(candidates))
            earliest = max(env.deadline(g.game_id) + 1, env.now() + 1)
            ts = min(earliest + data.draw(st.integers(0, 5000)), self._honest_limit() - 1)
            if ts < earliest:
                return  # an honest party elsewhere must move first
            env.at(ts)
            self._record_end(
                g, env.timeout(g.game_id, caller=data.draw(st.sampled_from([*env.auditors, env.outsider])))
            )

        @precondition(lambda self: bool(self.games))
        @rule(data=st.data())
        def someone_moves_out_of_turn(self, data: st.DataObject) -> None:
            """A move by the wrong party, in the wrong phase, twice, late or after the end: it reverts
            with the documented error (checks: ended, phase, caller, clock) and changes nothing."""
            g = data.draw(st.sampled_from(self.games))
            before = env.game_state(g.game_id)
            who = data.draw(
                st.sampled_from([env.trainer, env.judge, env.client, env.outsider, *env.auditors])
            )
            move = data.draw(st.sampled_from(["reveal", "respond", "rule", "timeout"]))
            need = {"reveal": AWAITING_REVEAL, "respond": AWAITING_RESPONSE, "rule": PINNED}
            mover = {"reveal": env.trainer, "respond": g.auditor, "rule": env.judge}
            if move == "timeout":
                fn = env.game.functions.timeout(g.game_id)
                if before.phase == ENDED:
                    expected = "GameOver"
                elif env.now() + 1 <= env.deadline(g.game_id):
                    expected = "ClockRunning"
                else:
                    return  # a legal timeout: not this rule's business
            else:
                if move == "reveal":
                    i = (before.lo + before.hi) // 2
                    fn = env.game.functions.reveal(
                        g.game_id, self.tree.leaf(i), list(self.tree.proof(i).siblings)
                    )
                elif move == "respond":
                    fn = env.game.functions.respond(g.game_id, data.draw(st.booleans()))
                else:
                    fn = env.game.functions.rule(g.game_id, self.honest[before.hi])
                if before.phase == ENDED:
                    expected = "GameOver"
                elif before.phase != need[move]:
                    expected = "NotYourTurn"
                elif who != mover[move]:
                    expected = "Unauthorized"
                elif env.now() + 1 > env.deadline(g.game_id):
                    expected = "ClockExpired"
                else:
                    return  # a legal move
            assert env.reverts(fn, who)[0] == expected
            assert env.game_state(g.game_id) == before

        @precondition(lambda self: not self.finalized and all(g.ended for g in self.games))
        @rule()
        def finalize(self) -> None:
            if env.now() + 1 < self.window_ends:
                env.at(self.window_ends)
            assert not self._live()
            receipt = env.finalize(self.task)
            paid = env.event(receipt, "TaskFinalized")["trainerPaid"]
            assert paid == (not self.trainer_lost)
            if self.s is None:
                assert paid, "an honest trainer whose games all ended must be paid"
            if paid:
                self._credit(env.trainer, PAYMENT + TRAINER_BOND)
            else:
                self._credit(env.client, PAYMENT)
            self.finalized = True

        @precondition(lambda self: self.finalized)
        @rule(data=st.data())
        def someone_withdraws(self, data: st.DataObject) -> None:
            who = data.draw(st.sampled_from([env.trainer, env.client, *env.auditors]))
            if self.expected_credit.get(who, 0) == 0:
                assert env.reverts(env.game.functions.withdraw(), who) == ("NothingToWithdraw", (who,))
                return
            receipt = env.send(env.game.functions.withdraw(), who)
            assert env.event(receipt, "Withdrawn")["amount"] == self.expected_credit.pop(who)

        # ------------------------------------------------------------ invariants
        @invariant()
        def solvent_and_credits_match(self) -> None:
            if not hasattr(self, "task"):
                return
            # Only these accounts are ever credited in this machine, so their sum is all the credit.
            credits = {who: env.credit(who) for who in (env.trainer, env.client, *env.auditors)}
            assert env.balance() == sum(credits.values()) + env.escrow()
            for who, amount in credits.items():
                assert amount == self.expected_credit.get(who, 0), who

        def teardown(self) -> None:
            try:
                if hasattr(self, "task") and self.finalized:
                    for who in {env.trainer, env.client, *env.auditors}:
                        if env.credit(who):
                            env.send(env.game.functions.withdraw(), who)
                    assert env.balance() == 0, "everything is withdrawable at the end"
            finally:
                env.chain.revert(self.snap)

    return VerificationGameMachine


@pytest.mark.embedded_only
def test_randomGames_honestSideWins_andSolvent(env: Env) -> None:
    machine = _make_machine(env)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get("VGAME_SM_EXAMPLES", "15")),
            stateful_step_count=25,
            deadline=None,
            # Shrinking a 25-step chain game takes minutes; a failure prints its full step list anyway.
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
