"""The loop a ``vgame node`` runs, and what it shows: its rounds (:func:`run`), each action as a
line or a JSON line (:func:`printer`), progress bars while work runs (:class:`ProgressBars`), and
the warning about a chain whose clock stands still.

Why apart from :mod:`game.cli.node`: that module reads the options and builds the agent; this one
only drives whatever agent it is given, the same way for every role.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID

from game import clock
from game.cli.app import console, err_console, error_line, progress_bar
from game.errors import ChainError, ContractGone

if TYPE_CHECKING:
    from game.agents import AgentAction
    from game.chain.rpc import RpcChain
    from game.chain.types import Task

#: an idle node warns once when the chain's latest block is older than this (seconds)
STALE_BLOCK_S = 60
#: wall seconds between an idle node's looks at the latest block's age: one request a round would
#: be most of an idle node's traffic to a public RPC endpoint that counts requests
CLOCK_CHECK_S = STALE_BLOCK_S / 2


def stale_clock_warning(latest_block_time: int, wall_time: float) -> str | None:
    """Why a node may wait forever: a chain's clock is its latest block's timestamp, and a local
    chain that mines only on transactions (anvil's default) stops it, so no deadline comes due."""
    age = clock.age(latest_block_time, wall_time)
    if age <= STALE_BLOCK_S:
        return None
    return (
        f"the chain's latest block is {age} s old and the contract's clock moves only with new blocks, "
        "so deadlines (the challenge window, the clocks) wait for the next transaction; "
        "start a local anvil with `--block-time 1`"
    )


def action_line(a: AgentAction) -> str:
    """An action as a line for people (rich markup)."""
    parts = [f"[bold]{a.actor}[/]", a.what, f"task {a.task_id}"]
    if a.game_id is not None:
        parts.append(f"game {a.game_id}")
    if a.leaf_index is not None:
        parts.append(f"leaf {a.leaf_index}")
    if a.gas_used is not None:
        parts.append(f"gas {a.gas_used}")
    if a.detail:
        parts.append(f"- {escape(a.detail)}")  # a detail may hold [brackets]
    return "  ".join(parts)


class ProgressBars:
    """The agent's long work (training, a replay) as a progress bar on stderr, shown only while
    that work runs: a node idles for hours between, with no live display to refresh."""

    def __init__(self, label: str, out: Console = err_console) -> None:
        self.label, self.out = label, out
        self.bars: Progress | None = None
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.bars is None:
            self.bars = progress_bar(self.out)
            self.bars.start()
        task = self.tasks.get(what)
        if task is None:
            task = self.tasks[what] = self.bars.add_task(f"{what} ({self.label})", total=total)
        self.bars.update(task, completed=done, total=total)
        if done >= total:
            self.bars.remove_task(self.tasks.pop(what))
            if not self.tasks:
                self.close()

    def close(self) -> None:
        if self.bars is not None:
            self.bars.stop()
            self.bars = None
            self.tasks.clear()


def ended_action(actor: str, task_id: int, task: Task) -> AgentAction:
    """A node's last action (``--json``): its work on the task is over, and how the task ended."""
    from game.agents import AgentAction

    how = task.status.name.lower()
    if task.trainer_lost:
        how += f", the trainer lost ({task.auditor_wins} game(s) won by auditors)"
    return AgentAction(actor, "done", task_id, detail=f"task {task_id} {how}")


def printer(as_json: bool, rehearsal: str | None = None) -> Callable[[AgentAction], None]:
    """Prints an action: a line for people, or a JSON line (``--json``); a rehearsing trainer's
    JSON lines each carry ``"rehearsal": "poison@8"``, its lines for people a marker."""

    def show(a: AgentAction) -> None:
        if as_json:
            doc = a.to_dict() if rehearsal is None else {**a.to_dict(), "rehearsal": rehearsal}
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()
        else:
            console.print(("[bold yellow]REHEARSAL[/] " if rehearsal else "") + action_line(a))

    return show


def run(agent: Any, rpc: RpcChain, *, poll: float, as_json: bool, label: str) -> None:
    """Step ``agent`` until it is done (its actions print as they happen). A chain that fails (the
    node unreachable, a refused transaction) is warned of and tried again next round: everything
    the agent needs is on chain and in its workdir. A failure that repeats round after round (an
    outage) is warned of once, until a round goes through. A contract gone from its address (the
    chain was reset) is no outage: the node stops with that one line."""
    import requests

    from game.agents import AgentError, NotThereYet

    said: set[str] = set()  # warnings given since the last round that went through

    def warn(text: str) -> None:
        if text not in said:
            said.add(text)
            err_console.print(f"[yellow]warning:[/] {escape(text)}")

    clock_warned = False
    next_clock_check = 0.0  # the first idle round looks at once
    while True:
        actions = []
        failed = False
        try:
            actions = agent.step()
        except (AgentError, ContractGone):
            raise  # this node cannot go on (wrong config, lost workdir, a reset chain): say so and stop
        except (ChainError, NotThereYet, requests.RequestException, ConnectionError, TimeoutError) as exc:
            warn(error_line(exc))
            failed = True
        except OSError as exc:  # a full disk, a store or workdir it may not write: stop, and say why
            raise AgentError(
                f"{label} stopped: {exc}; what it did is on chain and in its files, so once the cause "
                "is fixed (disk space, permissions), run the same command to go on"
            ) from exc
        try:
            if agent.done:
                if not as_json:
                    err_console.print(f"{label} is done")
                return
            if not actions and not clock_warned and time.monotonic() >= next_clock_check:
                next_clock_check = time.monotonic() + CLOCK_CHECK_S
                if warning := stale_clock_warning(rpc.now(), time.time()):
                    warn(warning)
                    clock_warned = True
        except ContractGone:
            raise
        except ChainError as exc:
            warn(error_line(exc))
            failed = True
        if not failed:
            said.clear()
        if not actions:
            time.sleep(poll)
