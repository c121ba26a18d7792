"""``vgame node trainer|auditor|judge``: one agent as a long-lived process on a shared chain.

The process loops ``agent.step()`` with a sleep of ``--poll`` seconds between calls until the agent
is done. Everything it must remember is on chain or in ``--workdir``, so a node killed at any
moment (even with SIGKILL) and started again with the same arguments carries on where it stopped.
An embedded chain lives inside one process, so nodes talk to a JSON-RPC node: ``--chain URL``, or
``--chain anvil`` for a local anvil already listening on port 8545.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, TaskID

from game import clock
from game.cli.app import app, console, err_console, interrupts, progress_bar
from game.cli.keys import given_data_key, warn_data_key_in_argv, warn_key_in_argv
from game.cli.options import DataKeyOpt, FromBlockOpt, check_profile, checked_first_block
from game.errors import ChainError, ConfigError, ContractGone
from game.fsio import exclusive_directory
from game.training.engine.auditprogress import DEFAULT_EVERY_S

if TYPE_CHECKING:
    from game.agents import AgentAction
    from game.chain.client import VerificationGameClient
    from game.chain.rpc import RpcChain
    from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)

#: where ``--chain anvil`` looks for a running anvil (its default port)
LOCAL_ANVIL_URL = "http://127.0.0.1:8545"
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


class Role(StrEnum):
    trainer = "trainer"
    auditor = "auditor"
    judge = "judge"


def chain_url(spec: str) -> str:
    """The JSON-RPC URL a node connects to for ``--chain``."""
    if spec == "embedded":
        raise ConfigError(
            "an embedded chain lives inside one process and cannot be shared by nodes: "
            "use `vgame demo` for it, or run nodes on --chain anvil / an http(s) URL"
        )
    if spec == "anvil":
        return LOCAL_ANVIL_URL
    if spec.startswith(("http://", "https://", "ws://", "wss://")):
        return spec
    raise ConfigError(f"--chain {spec!r}: use anvil or an http(s)/ws(s) JSON-RPC URL")


def _line(a: AgentAction) -> str:
    parts = [f"[bold]{a.actor}[/]", a.what, f"task {a.task_id}"]
    if a.game_id is not None:
        parts.append(f"game {a.game_id}")
    if a.leaf_index is not None:
        parts.append(f"leaf {a.leaf_index}")
    if a.gas_used is not None:
        parts.append(f"gas {a.gas_used}")
    if a.detail:
        parts.append(f"- {a.detail}")
    return "  ".join(parts)


@app.command("node")
def node_cmd(
    role: Annotated[Role, typer.Argument(help="Which agent to run.")],
    contract: Annotated[
        str,
        typer.Option("--contract", envvar="VGAME_CONTRACT", help="Address of the deployed game contract."),
    ],
    task: Annotated[int, typer.Option("--task", help="Task id to work on.")],
    store: Annotated[Path, typer.Option("--store", help="Blob store directory (shared with the others).")],
    workdir: Annotated[Path, typer.Option("--workdir", help="This node's own files (progress, transcript).")],
    chain: Annotated[
        str, typer.Option("--chain", envvar="VGAME_CHAIN", help="anvil (local, port 8545) or a JSON-RPC URL.")
    ] = "anvil",
    key: Annotated[
        str | None, typer.Option("--key", help="Hex private key or keystore file (else VGAME_PRIVATE_KEY).")
    ] = None,
    data_key: DataKeyOpt = None,
    profile: Annotated[
        str, typer.Option("--profile", help="Hardware profile (see `vgame profiles`).")
    ] = "cpu-1t",
    config: Annotated[Path | None, typer.Option("--config", help="Task config TOML (trainer).")] = None,
    strategy: Annotated[
        str, typer.Option("--strategy", help="Auditor: honest, lying, silent-after-challenge.")
    ] = ("honest"),
    seed: Annotated[int, typer.Option("--seed", help="Auditor: seed of the lying strategy.")] = 0,
    evidence_dir: Annotated[
        Path | None, typer.Option("--evidence-dir", help="Directory where the judge's evidence is left.")
    ] = None,
    poll: Annotated[float, typer.Option("--poll", min=0.1, help="Seconds between rounds when idle.")] = 2.0,
    save_every: Annotated[
        float,
        typer.Option(
            "--save-every",
            min=0.0,
            help="Auditor: seconds between saves of its replay's progress (kept over a crash).",
        ),
    ] = DEFAULT_EVERY_S,
    first_block: FromBlockOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per action (JSON lines).")] = False,
) -> None:
    """Run one agent until its work on the task is done (restart it with the same arguments after a crash)."""
    from game.agents import ACTION_LOG
    from game.chain.rpc import RpcChain
    from game.store.blobs import BlobStore

    logging.basicConfig(
        level=logging.INFO if not as_json else logging.WARNING, format="%(levelname)s %(message)s"
    )
    ACTION_LOG.setLevel(logging.WARNING)  # the node prints each action itself, once (_printer)
    dkey = given_data_key(data_key)
    check_profile(profile)  # not hours later, when work comes
    task_cfg: TaskConfig | None = None
    if role == Role.trainer:  # its config read, and checked, before a node is asked anything
        from game.training.task.config import load_config

        if config is None:
            raise ConfigError("a trainer node needs the task config: pass --config FILE.toml")
        task_cfg = load_config(config)
    warn_key_in_argv(key, chain_url(chain))
    warn_data_key_in_argv(data_key, chain_url(chain))
    rpc = RpcChain(chain_url(chain), key=key)
    client = _game_client(rpc, contract, task, role, first_block)
    blobs = BlobStore(store)
    show = _printer(as_json)  # each action as it happens: one taken before a failure is not lost
    bars = None if as_json else ProgressBars(f"task {task}")
    agent: Any
    if task_cfg is not None:
        from trainer_node.agent import TrainerAgent

        agent = TrainerAgent(
            client,
            task,
            task_cfg,
            profile=profile,
            workdir=workdir,
            store=blobs,
            data_key=dkey,
            on_action=show,
            progress=bars,
        )
    elif role == Role.auditor:
        from auditor_node.agent import AuditorAgent
        from game.strategies.auditors import auditor_strategy

        agent = AuditorAgent(
            client,
            task,
            profile=profile,
            workdir=workdir,
            store=blobs,
            data_key=dkey,
            strategy=auditor_strategy(strategy, seed),
            evidence_dir=evidence_dir,
            on_action=show,
            progress=bars,
            save_every_s=save_every,
        )
    else:
        from game.judge import Judge

        agent = Judge(
            client,
            profile=profile,
            workdir=workdir,
            store=blobs,
            data_key=dkey,
            evidence_dir=evidence_dir,
            task_id=task,
            on_action=show,
        )
    same = "--workdir" if role == Role.judge else "--workdir and --task"
    busy = (
        f"{agent.home} is in use by another running node (the same {same}); "
        "stop that one, or give each node a --workdir of its own"
    )
    try:
        with exclusive_directory(agent.home, busy):
            if not as_json:
                err_console.print(f"{role.value} node for task {task} as {client.me} on {rpc.describe()}")
            _run(agent, rpc, poll=poll, as_json=as_json, label=f"{role.value} node: task {task}")
    except KeyboardInterrupt:  # what the node has done is on chain and in --workdir
        if bars is not None:
            bars.close()
        interrupts.say(
            f"[yellow]stopped:[/] {role.value} node for task {task}; run the same command to go on"
        )
        raise
    finally:
        if bars is not None:
            bars.close()  # a bar of work an error ended: no live display outlives the node


def _game_client(
    rpc: RpcChain, contract: str, task: int, role: Role, first_block: int | None = None
) -> VerificationGameClient:
    """The client of the game contract at ``contract``, once it is known to hold task ``task`` and
    the key to be one that ``role`` can act with there (a mistyped address, task id or key is one
    clear line now, not a decoding error later, nor a node that waits in silence: a judge node
    with another account's key never sees a game of its own to rule on)."""

    from game.agents import check_key
    from game.chain.address import checked_address
    from game.chain.client import ClientOptions, VerificationGameClient
    from game.chain.errors import TaskNotFound

    options = ClientOptions(first_block=checked_first_block(first_block, rpc.block_number()))
    client = VerificationGameClient(
        rpc, checked_address(contract, "--contract"), rpc.account(0), options=options
    )
    if not rpc.w3.eth.get_code(client.address):
        raise ConfigError(f"no contract at {client.address} on {rpc.describe()}")
    try:
        t = client.task(task)
    except TaskNotFound:
        raise ConfigError(
            f"no task {task} in the game contract at {client.address}; `vgame task create` posts one"
        ) from None
    check_key(role.value, task, t, client.me)  # the agents' own check, before the first round
    return client


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


def _printer(as_json: bool) -> Callable[[AgentAction], None]:
    """Prints an action: a line for people, or a JSON line (``--json``)."""

    def show(a: AgentAction) -> None:
        if as_json:
            sys.stdout.write(json.dumps(a.to_dict()) + "\n")
            sys.stdout.flush()
        else:
            console.print(_line(a))

    return show


def _run(agent: Any, rpc: RpcChain, *, poll: float, as_json: bool, label: str) -> None:
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
            err_console.print(f"[yellow]warning:[/] {text}")

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
            warn(str(exc))
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
            warn(str(exc))
            failed = True
        if not failed:
            said.clear()
        if not actions:
            time.sleep(poll)
