"""The parameter server's bookkeeping, apart from any process: which micro-batch to compute next,
which gradients make the next update, and what a failover undoes.

:class:`WorkPool` is a pure state machine (no Ray, no torch): the driver (:mod:`.driver`) feeds it
what its actors report and sends what it decides, and a test feeds it simulated events. Its rules:

* The data are the task's ``steps * accumulate`` micro-batches, handed out in data order, a
  micro-batch given back (its worker died, its gradients came too stale, its update was lost) first.
* Synchronous: update ``u`` applies the micro-batches of step ``u``, each computed on state
  ``u - 1``; only those are handed out while ``u`` is due (what one process computes).
* Asynchronous (``max_staleness = B > 0``): at most ``(B + 1) * accumulate`` micro-batches are out
  (in flight or in hand; fewer while :attr:`WorkPool.ahead` is set), each computed on the newest
  state there is when it is handed out; update
  ``u`` takes ``accumulate`` gradients in hand, the oldest versions first (then by arrival), and
  folds them in micro-batch order. A gradient whose version fell out of the window ``u - 1 - B ..
  u - 1`` is dropped and its micro-batch handed out again.
* A gradient is good only while its version is in the lineage: the leaf it was computed on is still
  the lineage's leaf at that index (a synchronous failover recomputes the same leaves, so its
  gradients stay good; an asynchronous one computes other states).
* A failover to state ``v`` (:meth:`WorkPool.rewind`) cuts the lineage after ``v``: the updates
  after it are lost (the next update's entry lists them, and those they listed as lost), their
  micro-batches handed out again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from game.errors import TrainingError
from game.training.log.schedule import Applied, LostUpdate, MicroBatchId, ScheduleEntry


@dataclass
class Gradient:
    """A micro-batch's gradients in hand (``result``: what the caller keeps of them)."""

    micro: MicroBatchId
    version: int
    leaf: bytes  # the version's leaf when the micro-batch was handed out
    result: Any
    arrived: int


@dataclass
class WorkPool:
    """See the module docstring."""

    steps: int
    accumulate: int
    max_staleness: int
    leaves: list[bytes] = field(default_factory=list)  # the lineage: leaf v = state v (0 = init)
    applied: dict[int, ScheduleEntry] = field(default_factory=dict)  # update -> its entry
    out: dict[MicroBatchId, tuple[int, bytes]] = field(default_factory=dict)  # in flight: version, leaf
    hand: list[Gradient] = field(default_factory=list)
    lost: list[LostUpdate] = field(default_factory=list)  # for the next update's entry
    applying: ScheduleEntry | None = None  # taken, not yet confirmed
    #: micro-batches handed out beyond the next update's (None: as many as the window allows). A
    #: server slower than its workers would otherwise let every gradient grow as stale as the task
    #: allows; the stateless server's workers lift it while the server is down, to go on working.
    ahead: int | None = None
    _again: list[MicroBatchId] = field(default_factory=list)  # handed back, sorted
    _stream: deque[MicroBatchId] = field(default_factory=deque)
    _arrivals: int = 0
    _taken: list[Gradient] = field(default_factory=list)  # the gradients of ``applying``

    def __post_init__(self) -> None:
        self._stream = deque(
            MicroBatchId(s, j) for s in range(1, self.steps + 1) for j in range(self.accumulate)
        )

    @property
    def sync(self) -> bool:
        return self.max_staleness == 0

    @property
    def update(self) -> int:
        """The next update's index (the lineage's newest state is ``update - 1``)."""
        return len(self.leaves)

    @property
    def done(self) -> bool:
        return self.update > self.steps and self.applying is None

    @property
    def limit(self) -> int:
        """How many micro-batches may be out at once (asynchronous): the next update's and
        :attr:`ahead` more, within the window's ``(max_staleness + 1) * accumulate``."""
        window = (self.max_staleness + 1) * self.accumulate
        return window if self.ahead is None else min(window, self.accumulate + self.ahead)

    @property
    def latest(self) -> int:
        """The newest state, which new work computes on."""
        return len(self.leaves) - 1

    # ---- handing out -------------------------------------------------------------------------------

    def next_micro(self) -> MicroBatchId | None:
        """The micro-batch to hand out now, None when none may be (the caller then waits)."""
        if not self.leaves or self.update > self.steps:
            return None
        if self.sync:
            if self.applying is not None:
                return None
            wanted = [m for m in self._again if m.step == self.update]
            if wanted:
                return wanted[0]
            if self._stream and self._stream[0].step == self.update:
                return self._stream[0]
            return None
        if len(self.out) + len(self.hand) >= self.limit:
            return None
        if self._again:
            return self._again[0]
        return self._stream[0] if self._stream else None

    def hand_out(self, micro: MicroBatchId) -> int:
        """Record ``micro`` as handed out on the newest state; returns that version."""
        if micro in self._again:
            self._again.remove(micro)
        elif self._stream and self._stream[0] == micro:
            self._stream.popleft()
        else:
            raise TrainingError(f"micro-batch {micro} is not waiting to be handed out")
        self.out[micro] = (self.latest, self.leaves[self.latest])
        return self.latest

    def give_back(self, micro: MicroBatchId) -> None:
        """``micro`` comes back undone (its worker died, or its gradients are no good)."""
        self.out.pop(micro, None)
        if micro not in self._again:
            self._again.append(micro)
            self._again.sort()

    def returned(self, micro: MicroBatchId, result: Any) -> bool:
        """Gradients of ``micro`` arrived; False (and ``micro`` handed back) when their version left
        the lineage meanwhile."""
        if micro not in self.out:
            return False  # handed back already (a failover): its micro-batch is out again
        version, leaf = self.out.pop(micro)
        if version >= len(self.leaves) or self.leaves[version] != leaf:
            self.give_back(micro)
            return False
        self.hand.append(Gradient(micro, version, leaf, result, self._arrivals))
        self._arrivals += 1
        return True

    # ---- updates -----------------------------------------------------------------------------------

    def take(self) -> tuple[ScheduleEntry, list[Any]] | None:
        """The next update's entry and the results it folds, in order, when it can be made now."""
        u = self.update
        if self.applying is not None or u > self.steps or not self.leaves:
            return None
        oldest = max(0, u - 1 - self.max_staleness)
        for g in [g for g in self.hand if g.version < oldest]:
            self.hand.remove(g)
            self.give_back(g.micro)
        if self.sync:
            chosen = [g for g in self.hand if g.micro.step == u and g.version == u - 1]
            if len(chosen) < self.accumulate:
                return None
        else:
            if len(self.hand) < self.accumulate:
                return None
            chosen = sorted(self.hand, key=lambda g: (g.version, g.arrived))[: self.accumulate]
        chosen.sort(key=lambda g: g.micro)
        for g in chosen:
            self.hand.remove(g)
        entry = ScheduleEntry(u, tuple(Applied(g.micro, g.version) for g in chosen), tuple(self.lost))
        self.applying = entry
        self._taken = chosen
        return entry, [g.result for g in chosen]

    def confirm(self, leaf: bytes) -> None:
        """The update taken last was applied: its post-state's leaf joins the lineage."""
        if self.applying is None:
            raise TrainingError("no update was taken")
        self.applied[self.applying.update] = self.applying
        self.leaves.append(leaf)
        self.applying, self.lost = None, []

    def abandon(self) -> None:
        """The update taken last was not applied (its server died): its gradients go back in hand."""
        if self.applying is None:
            return
        self.hand += self._taken
        self.applying = None

    def start(self, leaf0: bytes) -> None:
        """The lineage starts at state 0 (``leaf0``)."""
        if self.leaves:
            raise TrainingError("the lineage has started already")
        self.leaves.append(leaf0)

    def restore(self, leaves: list[bytes], entries: list[ScheduleEntry], lost: list[LostUpdate]) -> None:
        """Go on from a lineage a transcript kept (its driver died): ``leaves`` of states ``0..k``,
        the ``entries`` of updates ``1..k``; the micro-batches they applied are not handed out
        again, and the next update lists ``lost``."""
        if self.leaves:
            raise TrainingError("the lineage has started already")
        if len(entries) != len(leaves) - 1 or [e.update for e in entries] != list(range(1, len(leaves))):
            raise TrainingError("a lineage of k + 1 states needs the entries of updates 1..k")
        self.leaves = list(leaves)
        self.applied = {e.update: e for e in entries}
        done = {a.micro for e in entries for a in e.applied}
        self._stream = deque(m for m in self._stream if m not in done)
        self.lost = list(lost)

    def rewind(self, version: int, leaf: bytes) -> list[LostUpdate]:
        """A failover to state ``version`` (``leaf``, which must be the lineage's): the updates
        after it are lost, their micro-batches and every gradient on a lost state handed back."""
        self.abandon()
        if not 0 <= version < len(self.leaves) or self.leaves[version] != leaf:
            raise TrainingError(f"the server came back with a state {version} that is not in the lineage")
        lost = [LostUpdate(u, self.leaves[u]) for u in range(version + 1, len(self.leaves))]
        for u in range(version + 1, len(self.leaves)):
            entry = self.applied.pop(u)
            self.lost += entry.lost  # what a lost update listed as lost must not vanish with it
            for a in entry.applied:
                self.give_back(a.micro)
        del self.leaves[version + 1 :]
        for g in [g for g in self.hand if g.version > version]:
            self.hand.remove(g)
            self.give_back(g.micro)
        self.lost += lost
        return lost


__all__ = ["Gradient", "WorkPool"]
