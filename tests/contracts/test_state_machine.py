"""Random games between honest and dishonest actors (Hypothesis stateful test).

One task per example. The trainer accepts it (the client's cancel is then refused) and is honest or
lies from a fuzzed step ``s`` on (a poisoned step: its later steps are computed correctly from the
wrong state, so only step ``s`` is a wrong transition). Its transcript is

* ``available``: nobody honest needs to demand data (a dishonest auditor may, and is answered);
* ``wrong-key``: sealed under another key than the task's, so honest auditors cannot open it and
  demand log chunks on-chain; the trainer holds the plaintext and posts them;
* ``unavailable``: withheld or garbled: a demanded chunk cannot be posted (a garbled one reverts
  ``InvalidProof``), the trainer's clock runs out and it loses.

Up to four challenges: an honest auditor (challenges only what it must: a lying trainer, a transcript
it cannot open), a dishonest one (any game, random answers, may stall), and the trainer's sybils
(challenge a lying trainer like an honest auditor, to win a share of its forfeited bond; the liar
loses to them at once). The judge is honest or silent (it never rules: pinned games end void).
Random out-of-turn, repeated and late moves by anyone must revert with the documented error and change
nothing. A trainer first tries to commit a tree of another size, which must revert
``LeafCountMismatch``.

Invariants after every step: the contract's balance equals credits plus escrow plus burnt wei, every
account's credit equals the model's, no game ends against the side the rules protect (an honest
trainer with its data never loses a game, an honest auditor never loses its bond), and once settled,
every winning game's share is the rule's, the sybils' shares equal the honest auditor's, and the liar
and its sybils together lose at least half the bond. At every end of a demand the challenge window
ends where the model says: no sooner than the time the demand was met (its piece posted, here or in
another game) plus what was left of the window at the demand; an unmet demand extends nothing.
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
    ANSWERED,
    AUDITOR_BOND,
    AUDITOR_WON,
    AWAITING_DATA,
    AWAITING_RESPONSE,
    AWAITING_REVEAL,
    ENDED,
    PAYMENT,
    PINNED,
    TRAINER_BOND,
    TRAINER_WON,
    VOID,
    Env,
    chunks,
    leaves,
    log_tree,
)

MAX_GAMES = 4
DATA = ("available", "wrong-key", "unavailable")
KINDS = ("honest", "dishonest", "sybil")


@dataclass
class GameModel:
    game_id: int
    auditor: str
    kind: str  # one of KINDS
    data: bool  # an availability challenge
    outcome: int = 0  # 0 while live
    window_left: int = 0  # availability: seconds of the window left when it was demanded

    @property
    def ended(self) -> bool:
        return self.outcome != 0

    @property
    def plays_right(self) -> bool:
        """Answers from the honest run (an honest auditor, or a sybil winning for its liar)."""
        return self.kind != "dishonest"


def _make_machine(env: Env) -> type[RuleBasedStateMachine]:
    class VerificationGameMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.snap = env.chain.snapshot()
            self.games: list[GameModel] = []
            self.expected_credit: dict[str, int] = {}
            self.finalized = False
            self.share = 0
            self.posted_at: dict[int, int] = {}  # chunk -> when its (one) piece was posted

        # ------------------------------------------------------------ setup
        @initialize(
            n=st.integers(2, 40),
            lie=st.booleans(),
            diverge=st.integers(1, 39),
            truncate=st.integers(1, 44),
            data=st.sampled_from(DATA),
            silent_judge=st.booleans(),
        )
        def setup(
            self, n: int, lie: bool, diverge: int, truncate: int, data: str, silent_judge: bool
        ) -> None:
            self.n = n
            self.s = min(diverge, n - 1) if lie else None
            self.data = data
            self.silent_judge = silent_judge
            self.honest = leaves(n)
            self.tree = MerkleTree(leaves(n, diverge_at=self.s))
            self.chunks = chunks(n)
            self.task = env.create_task(n, accept=False)
            env.accept(self.task)
            # the client cannot take an accepted task back while its trainer may commit
            commit_by = env.task(self.task).commitBy
            assert env.reverts(env.game.functions.cancel(self.task), env.client) == (
                "CommitWindowOpen",
                (self.task, commit_by),
            )
            if truncate != n:
                # the trainer first tries a commitment of another size (issue 44: truncated, N = 1
                # included, or padded), with proofs that verify: refused, and nothing changes
                short = MerkleTree(leaves(truncate, diverge_at=self.s))
                assert env.reverts(env.commit_fn(self.task, short), env.trainer) == (
                    "LeafCountMismatch",
                    (n, truncate),
                )
            env.commit(self.task, self.tree, log_root=log_tree(self.chunks).root)
            self.window_ends = env.task(self.task).windowEnds
            self.sybils = list(env.auditors[2:4])

        # ------------------------------------------------------------ helpers
        @property
        def trainer_lies(self) -> bool:
            return self.s is not None

        @property
        def trainer_answers_data(self) -> bool:
            return self.data != "unavailable"

        def _credit(self, who: str, amount: int) -> None:
            self.expected_credit[who] = self.expected_credit.get(who, 0) + amount

        def _live(self, phase: int | None = None) -> list[GameModel]:
            out = [g for g in self.games if not g.ended]
            if phase is not None:
                out = [g for g in out if env.game_state(g.game_id).phase == phase]
            return out

        def _mover_honest(self, g: GameModel, phase: int) -> bool:
            """Whether the party to move in ``g`` always moves in time."""
            if phase == AWAITING_REVEAL:
                return not self.trainer_lies
            if phase == AWAITING_DATA:
                return self.trainer_answers_data
            if phase == AWAITING_RESPONSE:
                return g.plays_right
            return phase == PINNED and not self.silent_judge

        def _honest_limit(self) -> int:
            """Time travel must stay before this: the earliest deadline of a party that always moves
            in time (in every game at once)."""
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
            g.outcome = outcome = ev["outcome"]
            if g.data:
                self._window_after_demand(g, receipt, outcome)
            # the honest side is never worse off than the rules promise
            if not self.trainer_lies and (not g.data or self.trainer_answers_data):
                assert outcome != AUDITOR_WON, "an honest trainer holding its data lost a game"
            if g.kind == "honest":
                assert outcome != TRAINER_WON, "an honest auditor lost its bond"
                if self.trainer_lies and not g.data and not self.silent_judge:
                    assert outcome == AUDITOR_WON, "an honest auditor lost against a lying trainer"
            if g.data and not self.trainer_answers_data:
                assert outcome == AUDITOR_WON, "a trainer that could not post a demanded chunk did not lose"
            if outcome == VOID:
                assert self.silent_judge, "a game went void with a judge that rules"
            if outcome == TRAINER_WON:
                self._credit(env.trainer, AUDITOR_BOND)
            else:  # AuditorWon, Void, Answered: the auditor's bond goes back
                self._credit(g.auditor, AUDITOR_BOND)

        def _window_after_demand(self, g: GameModel, receipt: object, outcome: int) -> None:
            """The time the trainer takes over a demand is given back: once met (when its piece was
            posted, in this game or another), the window ends no sooner than then plus what was
            left of it at the demand. A demand not met extends nothing (the trainer lost)."""
            index = env.game_state(g.game_id).lo
            before = self.window_ends
            if env.events(receipt, "DataProvided"):
                self.posted_at[index] = env.now()
            if outcome == ANSWERED:
                self.window_ends = max(before, self.posted_at[index] + g.window_left)
            extended = [e["windowEnds"] for e in env.events(receipt, "WindowExtended")]
            assert extended == ([self.window_ends] if self.window_ends > before else []), extended
            assert env.task(self.task).windowEnds == self.window_ends

        def _open(self, auditor: str, kind: str, data: bool, index: int, piece: int = 0) -> None:
            if data:
                if index in self.provided:
                    # every chunk here is one piece: once posted, any piece number names it
                    fn = env.game.functions.challengeData(self.task, index, piece)
                    assert env.reverts(fn, auditor, AUDITOR_BOND) == (
                        "DataAlreadyProvided",
                        (self.task, index, 0),
                    )
                    return
                game_id = env.challenge_data(self.task, auditor, index, piece=piece)
                model = GameModel(game_id, auditor, kind, data, window_left=self.window_ends - env.now())
                assert env.game_state(game_id).windowLeft == model.window_left
                self.games.append(model)
                return
            game_id = env.challenge(self.task, auditor)
            self.games.append(GameModel(game_id, auditor, kind, data))

        @property
        def provided(self) -> set[int]:
            return {env.game_state(g.game_id).lo for g in self.games if g.data and g.outcome == ANSWERED}

        # ------------------------------------------------------------ rules
        @precondition(lambda self: not self.finalized and len(self.games) < MAX_GAMES)
        @rule(data=st.data())
        def challenge(self, data: st.DataObject) -> None:
            """An auditor opens a game: the honest one only where it must, sybils only against a liar."""
            if env.now() + 1 >= self.window_ends:
                return
            kind = data.draw(st.sampled_from(KINDS))
            index = data.draw(st.integers(0, self.n - 1))
            piece = data.draw(st.integers(0, 2))  # of a one-piece chunk: reduced to 0
            if kind == "honest":
                if self.data != "available":  # it cannot open the transcript: it demands a chunk
                    self._open(env.auditors[0], kind, True, index, piece)
                elif self.trainer_lies:
                    self._open(env.auditors[0], kind, False, index)
            elif kind == "sybil":
                if self.trainer_lies:
                    self._open(data.draw(st.sampled_from(self.sybils)), kind, False, index)
            else:
                self._open(env.auditors[1], kind, data.draw(st.booleans()), index, piece)

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
        def trainer_posts_data(self, data: st.DataObject) -> None:
            """The trainer answers a demand: the committed chunk, or, without its data, garbage that
            the contract refuses."""
            live = self._live(AWAITING_DATA)
            if not live:
                return
            g = data.draw(st.sampled_from(live))
            if not self._move_time(g, data.draw(st.integers(1, 600))):
                return
            if not self.trainer_answers_data:
                index = env.game_state(g.game_id).lo
                garbled = env.provide_data_fn(g.game_id, self.chunks, data=b"garbled" + self.chunks[index])
                assert env.reverts(garbled, env.trainer)[0] == "InvalidPieceProof"
                return
            receipt = env.provide_data(g.game_id, self.chunks)
            index = env.game_state(g.game_id).lo
            assert env.event(receipt, "DataProvided")["data"] == self.chunks[index]
            self._record_end(g, receipt)

        @precondition(lambda self: any(not g.ended for g in self.games))
        @rule(data=st.data())
        def auditor_responds(self, data: st.DataObject) -> None:
            live = self._live(AWAITING_RESPONSE)
            if not live:
                return
            g = data.draw(st.sampled_from(live))
            mid = env.mid(g.game_id)
            agree = self.tree.leaf(mid) == self.honest[mid] if g.plays_right else data.draw(st.booleans())
            if not self._move_time(g, data.draw(st.integers(1, 600))):
                return
            env.respond(g.game_id, agree)
            state = env.game_state(g.game_id)
            if state.phase == PINNED and g.plays_right and self.trainer_lies:
                assert state.hi == self.s, "an honest auditor must pin the first wrong step"

        @precondition(lambda self: any(not g.ended for g in self.games))
        @rule(data=st.data())
        def judge_rules(self, data: st.DataObject) -> None:
            live = self._live(PINNED)
            if not live or self.silent_judge:
                return
            g = data.draw(st.sampled_from(live))
            if not self._move_time(g, data.draw(st.integers(1, 600))):
                return
            self._record_end(g, env.rule(g.game_id, self._ruling(env.game_state(g.game_id))))

        @precondition(lambda self: any(not g.ended for g in self.games))
        @rule(data=st.data())
        def someone_claims_a_timeout(self, data: st.DataObject) -> None:
            """A party that does not move in time (a dishonest mover, a trainer without its data, a
            silent judge) is timed out by anyone, possibly much later."""
            candidates = [
                g for g in self._live() if not self._mover_honest(g, env.game_state(g.game_id).phase)
            ]
            if not candidates:
                return
            g = data.draw(st.sampled_from(candidates))
            earliest = max(env.deadline(g.game_id) + 1, env.now() + 1)
            ts = min(earliest + data.draw(st.integers(0, 5000)), self._honest_limit() - 1)
            if ts < earliest:
                return  # an honest party elsewhere must move first
            env.at(ts)
            caller = data.draw(st.sampled_from([*env.auditors, env.outsider, env.client]))
            self._record_end(g, env.timeout(g.game_id, caller=caller))

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
            move = data.draw(st.sampled_from(["reveal", "respond", "rule", "provideData", "timeout"]))
            need = {
                "reveal": AWAITING_REVEAL,
                "respond": AWAITING_RESPONSE,
                "rule": PINNED,
                "provideData": AWAITING_DATA,
            }
            mover = {
                "reveal": env.trainer,
                "respond": g.auditor,
                "rule": env.judge,
                "provideData": env.trainer,
            }
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
                elif move == "provideData":
                    fn = env.provide_data_fn(g.game_id, self.chunks)
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

        @precondition(lambda self: not self.finalized and bool(self.games))
        @rule(data=st.data())
        def everyone_plays_to_the_end(self, data: st.DataObject) -> None:
            """Every live game is played out: each party that moves does so a second later (a lying
            trainer reveals its tree, a dishonest auditor answers at random); games waiting on a party
            that never moves (a trainer without its data, a silent judge, a clock run out) are timed
            out once every other move is made. Then the task is settled and every reward claimed."""
            for _ in range(500):
                live = self._live()
                if not live:
                    break
                ready = [g for g in live if self._moves_now(g)]
                if ready:
                    self._move(ready[0], data)
                    continue
                g = min(live, key=lambda g: env.deadline(g.game_id))
                env.at(max(env.now() + 1, env.deadline(g.game_id) + 1))
                self._record_end(g, env.timeout(g.game_id, caller=env.outsider))
            assert not self._live(), "games still live after every move was made"
            self._finalize()

        def _moves_now(self, g: GameModel) -> bool:
            """Whether the party to move in ``g`` moves (and still can, a second from now)."""
            phase = env.game_state(g.game_id).phase
            if env.now() + 1 > env.deadline(g.game_id):
                return False
            if phase == AWAITING_DATA:
                return self.trainer_answers_data
            if phase == PINNED:
                return not self.silent_judge
            return True

        def _move(self, g: GameModel, data: st.DataObject) -> None:
            state = env.game_state(g.game_id)
            env.at(env.now() + 1)
            if state.phase == AWAITING_REVEAL:
                env.reveal(g.game_id, self.tree)
            elif state.phase == AWAITING_DATA:
                self._record_end(g, env.provide_data(g.game_id, self.chunks))
            elif state.phase == AWAITING_RESPONSE:
                mid = (state.lo + state.hi) // 2
                right = self.tree.leaf(mid) == self.honest[mid]
                env.respond(g.game_id, right if g.plays_right else data.draw(st.booleans()))
            else:
                self._record_end(g, env.rule(g.game_id, self._ruling(state)))

        def _ruling(self, state: object) -> bytes:
            """What an honest judge computes for the pinned step of ``state``."""
            hi = state.hi  # type: ignore[attr-defined]
            if state.disputeInit:  # type: ignore[attr-defined]
                return self.honest[0]
            if hi == self.s:
                return self.honest[hi]  # re-running the poisoned step correctly
            return self.tree.leaf(hi)  # every other step of the trainer is a correct transition

        @precondition(lambda self: not self.finalized and all(g.ended for g in self.games))
        @rule()
        def finalize(self) -> None:
            self._finalize()

        def _finalize(self) -> None:
            if env.now() + 1 < self.window_ends:
                env.at(self.window_ends)
            assert not self._live()
            wins = [g for g in self.games if g.outcome == AUDITOR_WON]
            ev = env.event(env.finalize(self.task), "TaskFinalized")
            assert ev["trainerPaid"] == (not wins)
            if not self.trainer_lies and self.trainer_answers_data:
                assert ev["trainerPaid"], (
                    "an honest trainer holding its data, its games all ended, was not paid"
                )
            if not wins:
                self._credit(env.trainer, PAYMENT + TRAINER_BOND)
            else:
                pool = TRAINER_BOND - TRAINER_BOND // 2
                self.share = min(AUDITOR_BOND, pool // len(wins))
                assert (ev["auditorWins"], ev["rewardShare"], ev["burnt"]) == (
                    len(wins),
                    self.share,
                    TRAINER_BOND // 2,
                )
                self._credit(env.client, PAYMENT + pool - self.share * len(wins))
            self.finalized = True

        @precondition(lambda self: self.finalized and any(g.outcome == AUDITOR_WON for g in self.games))
        @rule(data=st.data())
        def winner_claims_its_reward(self, data: st.DataObject) -> None:
            g = data.draw(st.sampled_from([g for g in self.games if g.outcome == AUDITOR_WON]))
            fn = env.game.functions.claimReward(g.game_id)
            if env.game_state(g.game_id).rewardClaimed:
                assert env.reverts(fn, env.outsider) == ("RewardAlreadyClaimed", (g.game_id,))
                return
            assert env.event(env.claim_reward(g.game_id), "RewardPaid")["amount"] == self.share
            self._credit(g.auditor, self.share)

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
            assert env.balance() == sum(credits.values()) + env.escrow() + env.burnt()
            for who, amount in credits.items():
                assert amount == self.expected_credit.get(who, 0), who

        @invariant()
        def settled_shares_follow_the_rule(self) -> None:
            """Once settled: every winning game is worth the same share, so the sybils' games are worth
            exactly what the honest auditor's is, and the liar with its sybils lose at least half the
            bond (their shares are all they recover of it)."""
            if not getattr(self, "finalized", False):
                return
            wins = [g for g in self.games if g.outcome == AUDITOR_WON]
            if not wins:
                return
            assert self.share == min(AUDITOR_BOND, (TRAINER_BOND - TRAINER_BOND // 2) // len(wins))
            recovered = self.share * sum(1 for g in wins if g.kind == "sybil")
            assert TRAINER_BOND - recovered >= TRAINER_BOND // 2, "the liar bought back over half its bond"
            if any(g.kind == "honest" for g in wins):
                assert self.share > 0, "the honest auditor who caught the liar was not rewarded"

        def teardown(self) -> None:
            try:
                if hasattr(self, "task") and self.finalized:
                    for g in self.games:
                        if g.outcome == AUDITOR_WON and not env.game_state(g.game_id).rewardClaimed:
                            env.claim_reward(g.game_id)
                    for who in {env.trainer, env.client, *env.auditors}:
                        if env.credit(who):
                            env.send(env.game.functions.withdraw(), who)
                    assert env.balance() == env.burnt(), "everything but the burnt wei is withdrawable"
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
