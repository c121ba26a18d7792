"""What every agent shares: the action record, its sinks, on-disk progress and the driving loop.

Why one module: the trainer and auditor agents (``trainer_node``, ``auditor_node``) and the judge
(:mod:`game.judge`) all follow the same rules. An agent's ``step()`` does what is due *now*, read
from chain state and its own files, and returns at once (it never sleeps and never waits for the
chain); a long-lived process (``vgame node``) or the demo calls it in a loop. Everything an agent
must not forget across a crash is either on chain or in a small JSON file in its ``workdir``,
written atomically, so an agent object recreated from scratch goes on exactly where the old one
stopped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from game import clock
from game.chain.types import Phase, TaskStatus
from game.errors import VGameError
from game.fsio import atomic_write

if TYPE_CHECKING:
    from game.chain.base import Chain
    from game.chain.client import VerificationGameClient
    from game.chain.types import Task, TxReceipt
    from game.store.blobs import BlobStore
    from game.store.sealing import ByteProgress

log = logging.getLogger(__name__)
#: One INFO record per action an agent takes. ``vgame node`` prints each action itself (a line, or
#: a JSON line) and turns this logger down, so that a terminal does not show every action twice.
ACTION_LOG = logging.getLogger(f"{__name__}.actions")

ACTORS = ("client", "trainer", "auditor", "judge")
WHATS = (
    "accept",
    "train",
    "publish",
    "commit",
    "replay",
    "challenge",
    "demand",
    "provide",
    "reveal",
    "respond",
    "evidence",
    "rule",
    "timeout",
    "finalize",
    "claim",
    "withdraw",
    "cancelled",
    "restore",
    "damaged",
    "idle",
    "done",  # a node's last JSON line: its work on the task is over (``detail``: how the task ended)
)


class AgentError(VGameError, RuntimeError):
    """An agent cannot go on (its config is not the task's, its transcript disagrees with the chain)."""


class NotThereYet(VGameError):
    """What the agent needs next is not there yet (a transcript the chain names, missing from a
    store that is synced between machines): nothing is lost, and the next round tries again."""


def check_key(role: str, task_id: int, task: Task, me: str) -> None:
    """Refuse a key that ``role`` cannot act with on the task: the trainer's and the judge's are
    named by the task, and an auditor's must be neither (the contract refuses their challenge).

    Why here, for every caller: a judge with another account's key sees no game of its own and
    waits in silence until its window runs out and the game ends void."""
    named = {"trainer": task.trainer, "judge": task.judge}.get(role)
    mine = me.lower()
    if named is not None and named.lower() != mine:
        raise AgentError(
            f"task {task_id}'s {role} is {named}, and the key given is {me}'s: "
            f"a {role} node signs with the {role}'s key"
        )
    if role == "auditor" and mine in (task.trainer.lower(), task.judge.lower()):
        raise AgentError(
            f"the key given is task {task_id}'s {'trainer' if mine == task.trainer.lower() else 'judge'}, "
            "which the contract does not let challenge its own task: an auditor needs a key of its own"
        )


@dataclass(frozen=True)
class AgentAction:
    """One thing an agent did (a transaction, or off-chain work worth showing)."""

    actor: str  # "client" | "trainer" | "auditor" | "judge"
    what: str  # one of WHATS
    task_id: int
    game_id: int | None = None
    leaf_index: int | None = None
    gas_used: int | None = None
    tx_hash: str | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "actor": self.actor,
            "what": self.what,
            "task_id": self.task_id,
            "game_id": self.game_id,
            "leaf_index": self.leaf_index,
            "gas_used": self.gas_used,
            "tx_hash": self.tx_hash,
            "detail": self.detail,
        }


#: agents call it for every action (the demo's live table)
ActionSink = Callable[[AgentAction], None]
#: ``(label, done, total)`` for training and replay progress bars
ProgressSink = Callable[[str, int, int], None]
#: A transcript published or fetched shows a progress bar from this many bytes on.
BYTES_BAR_FROM = 64 << 20


class Agent(Protocol):
    """What the driving loop needs from an agent."""

    def step(self) -> list[AgentAction]: ...

    @property
    def done(self) -> bool: ...


# ------------------------------------------------------------------------------------------------
# Small crash-safe files
# ------------------------------------------------------------------------------------------------


def format_wei(wei: int) -> str:
    """An amount for people: ether with the wei in brackets, so nothing is rounded away."""
    return f"{wei / 10**18:g} ETH ({wei} wei)"


class StateFile:
    """A small JSON document in an agent's workdir, rewritten atomically on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        if path.is_file():
            try:
                loaded = json.loads(path.read_text("utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise AgentError(
                    f"agent state {path} is unreadable ({exc}); delete it to start over"
                ) from exc
            if not isinstance(loaded, dict):
                raise AgentError(f"agent state {path} is not a JSON object; delete it to start over")
            self.data = loaded

        self._bound = False  # checked against the chain in this process (``bind``)

    def bind(self, client: VerificationGameClient, home: Path) -> None:
        """Tie these files to one game contract on one chain, or refuse the files of another.

        Why: ids and addresses repeat. A local chain started again from genesis deploys the game at
        the same address and posts task 1 again, and the state of the old chain's task 1 (a verdict,
        the games known, the block to scan from, a transcript trained with another deviation) would
        mislead the agent: an auditor that trusted an old "match" would not challenge. A chain's
        genesis block names it (a local chain's differs at each start). Asked once per process."""
        if self._bound:
            return
        here = {
            "genesis": bytes(client.chain.w3.eth.get_block(0)["hash"]).hex(),
            "contract": client.address.lower(),
        }
        bound = self.get("bound_to")
        if bound is None:
            self.update(bound_to=here)
        elif bound != here:
            raise AgentError(
                f"{home} holds the files of a game contract on another chain (contract {bound.get('contract')}, "
                f"genesis {str(bound.get('genesis'))[:16]}...), not of {here['contract']} on this one: "
                f"give this agent a fresh --workdir, or delete {home} to start over"
            )
        self._bound = True

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def update(self, **changes: Any) -> None:
        self.data.update(changes)
        atomic_write(self.path, (json.dumps(self.data, indent=1, sort_keys=True) + "\n").encode())


class TaskAgent:
    """What the trainer and the auditor share: one task, one chain account, files in a workdir.

    Subclasses set ``ACTOR`` (the role shown in actions) and ``STATE_NAME`` (their state file).
    """

    ACTOR = "agent"
    STATE_NAME = "agent.json"

    def __init__(
        self,
        client: VerificationGameClient,
        task_id: int,
        *,
        profile: str,
        workdir: Path,
        store: BlobStore,
        data_key: bytes,
        on_action: ActionSink | None = None,
        progress: ProgressSink | None = None,
    ) -> None:
        self.client = client
        self.task_id = task_id
        self.profile = profile
        self.workdir = Path(workdir)
        self.store = store
        self.data_key = data_key
        self.on_action = on_action
        self.progress = progress
        self.taskdir = self.workdir / f"task-{task_id}"  # one workdir may serve several tasks
        self.taskdir.mkdir(parents=True, exist_ok=True)
        self.state = StateFile(self.taskdir / self.STATE_NAME)

    @property
    def home(self) -> Path:
        """The directory this agent writes (state, transcript): one running node's alone."""
        return self.taskdir

    def _emit(self, out: list[AgentAction], action: AgentAction) -> None:
        """Record an action: in the step's result, the log, and the caller's sink (the live table)."""
        out.append(action)
        ACTION_LOG.info("%s task %d: %s %s", self.ACTOR, self.task_id, action.what, action.detail)
        if self.on_action is not None:
            self.on_action(action)

    def _opened(
        self, out: list[AgentAction], what: str, rec: TxReceipt, *, leaf_index: int | None, detail: str
    ) -> int | None:
        """Keep the game a challenge or a demand of this agent opened (its id from the receipt,
        before any event scan finds it) and emit the action; returns the id."""
        gid = rec.result
        if gid is not None:
            self.state.update(games=[*self.state.get("games", []), gid])
        self._emit(
            out,
            action_from_receipt(
                self.ACTOR, what, self.task_id, rec, game_id=gid, leaf_index=leaf_index, detail=detail
            ),
        )
        return gid

    def _mib_progress(self, what: str) -> ByteProgress | None:
        """The progress sink for a transcript's bytes (published, fetched), counted in MiB: at
        paper size a transcript is gigabytes, tens of seconds of work on a node that shows no
        other sign of life meanwhile. One below :data:`BYTES_BAR_FROM` takes well under a second
        and shows no bar."""
        sink = self.progress
        if sink is None:
            return None
        label = f"{what}, MiB"

        def report(done: int, total: int) -> None:
            if total < BYTES_BAR_FROM:
                return
            total_mib = -(-total // (1 << 20))
            sink(label, total_mib if done >= total else done >> 20, total_mib)

        return report


# ------------------------------------------------------------------------------------------------
# Shared helpers of the agents
# ------------------------------------------------------------------------------------------------


def action_from_receipt(
    actor: str,
    what: str,
    task_id: int,
    receipt: TxReceipt,
    *,
    game_id: int | None = None,
    leaf_index: int | None = None,
    detail: str = "",
) -> AgentAction:
    return AgentAction(
        actor=actor,
        what=what,
        task_id=task_id,
        game_id=game_id,
        leaf_index=leaf_index,
        gas_used=receipt.gas_used,
        tx_hash=receipt.tx_hash,
        detail=detail,
    )


#: Blocks scanned again on every round. A reorganisation replaces the newest blocks, and a
#: transaction of a replaced block is mined again in a block of the same or a lower number: behind
#: a scan position already past it, its event would never be seen (a trainer that misses a
#: challenge loses the game on its clock). 64 blocks are two epochs on Ethereum, the depth after
#: which a block is final; on a chain without reorganisations it costs a query over 64 blocks.
RESCAN_BLOCKS = 64


def next_scan_from(from_block: int, last: int) -> int:
    """Where the next scan starts after scanning ``from_block..last``: the newest
    :data:`RESCAN_BLOCKS` blocks again (callers skip the events they know)."""
    return max(from_block, last + 1 - RESCAN_BLOCKS)


def games_of_task(
    client: VerificationGameClient, task_id: int, from_block: int, *, auditor: str | None = None
) -> tuple[list[int], int]:
    """Game ids of ``task_id`` opened in blocks ``from_block..`` (by ``auditor`` if given).

    Returns the ids and the next block to scan from (the scan is bounded by the block number read
    first, so a game opened meanwhile is seen by the next call, never skipped; the newest blocks
    are scanned again, :data:`RESCAN_BLOCKS`, so the same id may come again).
    """
    last = client.chain.block_number()
    if last < from_block:
        return [], from_block
    filters: dict[str, Any] = {"task_id": task_id}
    if auditor is not None:
        filters["auditor"] = auditor
    events = client.get_events("Challenged", from_block, last, **filters)
    return [int(e.game_id) for e in events], next_scan_from(from_block, last)  # type: ignore[attr-defined]


def next_due_time(client: VerificationGameClient, task_ids: Iterable[int]) -> int | None:
    """The earliest chain time at which something becomes due for ``task_ids`` (None: nothing will).

    Live games: their deadline (a timeout is possible right after it). A committed task whose
    window is still open: ``windowEnds`` (finalize). Drivers of simulated time (the demo, tests)
    jump the clock there when every agent is idle.
    """
    due: list[int] = []
    for task_id in task_ids:
        t = client.task(task_id)
        if t.status != TaskStatus.COMMITTED:
            continue
        if clock.is_ahead(client.chain.now(), t.window_ends):
            due.append(t.window_ends)
        if t.live_games:
            ids, _ = games_of_task(client, task_id, 0)
            for gid in ids:
                g = client.game(gid)
                if g.phase != Phase.ENDED:
                    due.append(clock.timeout_from(client.deadline(gid)))
    return min(due) if due else None


def drive(
    agents: Sequence[Agent],
    client: VerificationGameClient,
    task_ids: Iterable[int],
    *,
    max_rounds: int = 500,
    on_round: Callable[[int], None] | None = None,
) -> list[AgentAction]:
    """Step every agent until all are done, jumping the chain's clock whenever all are idle.

    For simulated time only (embedded chain, anvil): real networks cannot move time, and there
    the ``vgame node`` processes simply wait. Returns every action taken, in order.
    """
    chain: Chain = client.chain
    ids = list(task_ids)
    actions: list[AgentAction] = []
    for round_no in range(max_rounds):
        if all(a.done for a in agents):
            return actions
        did: list[AgentAction] = []
        for agent in agents:
            if not agent.done:
                did.extend(a for a in agent.step() if a.what != "idle")
        actions.extend(did)
        if on_round is not None:
            on_round(round_no)
        if did:
            continue
        due = next_due_time(client, ids)
        if due is None:
            raise AgentError("every agent is idle, none is done, and nothing on chain will become due")
        chain.time_travel(clock.travel_seconds(chain.now(), due))
    raise AgentError(f"agents not done after {max_rounds} rounds")


__all__ = [
    "ACTORS",
    "RESCAN_BLOCKS",
    "WHATS",
    "ActionSink",
    "Agent",
    "AgentAction",
    "AgentError",
    "NotThereYet",
    "ProgressSink",
    "StateFile",
    "TaskAgent",
    "action_from_receipt",
    "atomic_write",
    "check_key",
    "drive",
    "format_wei",
    "games_of_task",
    "next_due_time",
    "next_scan_from",
]
