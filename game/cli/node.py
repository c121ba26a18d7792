"""``vgame node trainer|auditor|judge``: one agent as a long-lived process on a shared chain.

The process loops ``agent.step()`` with a sleep of ``--poll`` seconds between calls until the agent
is done. Everything it must remember is on chain or in ``--workdir``, so a node killed at any
moment (even with SIGKILL) and started again with the same arguments carries on where it stopped.
Nodes share one chain with the other processes, so ``--chain`` is the JSON-RPC URL of a running
node; ``embedded`` and ``anvil``, a fresh chain that ends with the command, are refused with the fix.
An option that only some roles use is refused by the others (:data:`ROLE_OPTIONS`), and a trainer
may rehearse a deviation on purpose (``--rehearse``, :mod:`game.cli.rehearse`).
"""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from auditor_node.chainlog import MAX_PIECES
from game.cli.app import app, err_console, interrupts
from game.cli.keys import given_data_key, warn_data_key_in_argv, warn_key_in_argv
from game.cli.nodeloop import ProgressBars, ended_action, printer, run
from game.cli.options import (
    DataKeyOpt,
    FromBlockOpt,
    RunningChainOpt,
    check_profile,
    checked_chain,
    checked_first_block,
)
from game.cli.rehearse import REHEARSALS, Rehearsal, parse_rehearsal
from game.cli.units import parse_wei
from game.errors import ConfigError
from game.fsio import exclusive_directory
from game.protocol.terms import TermsPolicy
from game.training.engine.auditprogress import DEFAULT_EVERY_S

if TYPE_CHECKING:
    from auditor_node.agent import AuditorStrategy
    from game.chain.client import VerificationGameClient
    from game.chain.rpc import RpcChain
    from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)


class Role(StrEnum):
    trainer = "trainer"
    auditor = "auditor"
    judge = "judge"


#: The options that only some roles use, and which: any other role refuses them, naming what it
#: takes instead (an option that does nothing must not look as if it did something).
ROLE_OPTIONS: dict[str, tuple[Role, ...]] = {
    "--config": (Role.trainer, Role.auditor),
    "--rehearse": (Role.trainer,),
    "--strategy": (Role.auditor,),
    "--seed": (Role.auditor,),
    "--save-every": (Role.auditor,),
    "--min-payment": (Role.trainer,),
    "--max-bond": (Role.trainer,),
    "--min-clock": (Role.trainer,),
    "--max-challenge-window": (Role.trainer,),
    "--commit-margin": (Role.trainer,),
    "--max-chunk-bytes": (Role.trainer,),
    "--max-log-pieces": (Role.auditor,),
    "--allow-client-judge": (Role.trainer,),
    "--evidence-dir": (Role.auditor, Role.judge),
}


def refuse_foreign_options(role: Role, given: dict[str, bool]) -> None:
    """One :class:`ConfigError` line for the first option in ``given`` (option -> given or not)
    that ``role`` does nothing with: whose it is, and what this role takes."""
    for option, was_given in given.items():
        owners = ROLE_OPTIONS[option]
        if was_given and role not in owners:
            own = [o for o, roles in ROLE_OPTIONS.items() if role in roles]
            takes = ", ".join(own[:-1]) + (" and " if len(own) > 1 else "") + own[-1]
            a_node = f"{'an' if role == Role.auditor else 'a'} {role.value} node"
            raise ConfigError(
                f"{option} does nothing for {a_node}: it is the {' and the '.join(r.value for r in owners)} "
                f"node's. Besides the options every node takes, {a_node} takes {takes}"
            )


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
    chain: RunningChainOpt = "",
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="The role's signing key: 0x-hex private key or keystore file (or VGAME_PRIVATE_KEY).",
        ),
    ] = None,
    data_key: DataKeyOpt = None,
    profile: Annotated[
        str,
        typer.Option(
            "--profile", help="Hardware profile to train, replay or rule on (see `vgame profiles`)."
        ),
    ] = "cpu-1t",
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Trainer (required): the task's config TOML, which hashes to its spec hash. Auditor: "
            "the same, to replay the log a trainer posts on-chain when it withholds its transcript.",
        ),
    ] = None,
    rehearse: Annotated[
        str | None,
        typer.Option(
            "--rehearse",
            metavar="NAME@S",
            help=f"Trainer: cheat on purpose at step S, to try your own auditor on a testnet: {', '.join(REHEARSALS)} "
            "(as in `vgame demo --help`). The node says so on stderr, in --json and in its state file.",
        ),
    ] = None,
    min_payment: Annotated[
        int | None,
        typer.Option(
            "--min-payment",
            parser=parse_wei,
            metavar="AMOUNT",
            show_default="any",
            help="Trainer: refuse a task that pays less (wei, or 0.001ether, 5gwei).",
        ),
    ] = None,
    max_bond: Annotated[
        int | None,
        typer.Option(
            "--max-bond",
            parser=parse_wei,
            metavar="AMOUNT",
            show_default="any",
            help="Trainer: refuse a task whose trainer's bond is larger (wei, or 0.001ether, 5gwei).",
        ),
    ] = None,
    min_clock: Annotated[
        int | None,
        typer.Option(
            "--min-clock",
            min=1,
            metavar="SECONDS",
            show_default=str(TermsPolicy.min_clock_allowance),
            help="Trainer: refuse a task whose clock gives each party fewer seconds a game.",
        ),
    ] = None,
    max_challenge_window: Annotated[
        int | None,
        typer.Option(
            "--max-challenge-window",
            min=1,
            metavar="SECONDS",
            show_default="any",
            help="Trainer: refuse a task whose challenge window (the wait for pay after the commit) is longer.",
        ),
    ] = None,
    commit_margin: Annotated[
        float | None,
        typer.Option(
            "--commit-margin",
            min=0.0,
            metavar="TIMES",
            show_default=f"{TermsPolicy.commit_margin:g}",
            help="Trainer: refuse a task whose commit window holds fewer times the training's time, "
            "estimated from a step timed here before it accepts (0: no estimate).",
        ),
    ] = None,
    max_chunk_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-chunk-bytes",
            min=1,
            metavar="BYTES",
            show_default="no cap",
            help="Trainer: refuse a task whose log chunks, measured on its first steps here, are larger "
            "(an availability demand is answered one 120 KiB piece at a time, so this only bounds how "
            "many pieces there are to demand).",
        ),
    ] = None,
    max_log_pieces: Annotated[
        int | None,
        typer.Option(
            "--max-log-pieces",
            min=1,
            metavar="PIECES",
            show_default=str(MAX_PIECES),
            help="Auditor: the most pieces (120 KiB each; a demand transaction and a bond of yours, and "
            "an answer of the trainer's, each) it demands to read a withheld transcript's log off the "
            "chain; a longer log is not read, and the auditor says how many it has.",
        ),
    ] = None,
    allow_client_judge: Annotated[
        bool,
        typer.Option(
            "--allow-client-judge",
            help="Trainer: work for a client that judges its own task (its ruling is trusted).",
        ),
    ] = False,
    strategy: Annotated[
        str | None,
        typer.Option(
            "--strategy", show_default="honest", help="Auditor: honest, lying or silent-after-challenge."
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", show_default="0", help="Auditor: seed of --strategy lying's answers."),
    ] = None,
    evidence_dir: Annotated[
        Path | None,
        typer.Option(
            "--evidence-dir",
            help="Auditor and judge: a directory both see, where the auditor leaves the pre-state of the "
            "disputed step for the judge (else the judge rebuilds it from the transcript).",
        ),
    ] = None,
    poll: Annotated[float, typer.Option("--poll", min=0.1, help="Seconds between rounds when idle.")] = 2.0,
    save_every: Annotated[
        float | None,
        typer.Option(
            "--save-every",
            min=0.0,
            show_default=str(DEFAULT_EVERY_S),
            help="Auditor: seconds between saves of its replay's progress (kept over a crash).",
        ),
    ] = None,
    first_block: FromBlockOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per action (JSON lines).")] = False,
) -> None:
    """Run one agent until its work on the task is done (restart it with the same arguments after a
    crash). An option marked Trainer, Auditor or Judge is that role's: another role refuses it."""
    from game.agents import ACTION_LOG
    from game.chain.rpc import RpcChain
    from game.store.blobs import BlobStore

    logging.basicConfig(
        level=logging.INFO if not as_json else logging.WARNING, format="%(levelname)s %(message)s"
    )
    ACTION_LOG.setLevel(logging.WARNING)  # the node prints each action itself, once (printer)
    refuse_foreign_options(
        role,
        {
            "--config": config is not None,
            "--rehearse": rehearse is not None,
            "--strategy": strategy is not None,
            "--seed": seed is not None,
            "--save-every": save_every is not None,
            "--evidence-dir": evidence_dir is not None,
            "--min-payment": min_payment is not None,
            "--max-bond": max_bond is not None,
            "--min-clock": min_clock is not None,
            "--max-challenge-window": max_challenge_window is not None,
            "--commit-margin": commit_margin is not None,
            "--max-chunk-bytes": max_chunk_bytes is not None,
            "--max-log-pieces": max_log_pieces is not None,
            "--allow-client-judge": allow_client_judge,
        },
    )
    url = checked_chain(chain, outlives="a node shares its chain with the other roles' processes")
    dkey = given_data_key(data_key)
    check_profile(profile)  # not hours later, when work comes
    task_cfg: TaskConfig | None = None
    rehearsal: Rehearsal | None = None
    if role == Role.trainer:  # its config read, and checked, before a node is asked anything
        from game.training.task.config import load_config

        if config is None:
            raise ConfigError("a trainer node needs the task config: pass --config FILE.toml")
        task_cfg = load_config(config)
        rehearsal = None if rehearse is None else parse_rehearsal(rehearse, task_cfg)
    auditor_cfg: TaskConfig | None = None
    if role == Role.auditor and config is not None:
        from game.training.task.config import load_config

        auditor_cfg = load_config(config)
    auditor = _auditor_strategy(strategy, seed) if role == Role.auditor else None
    warn_key_in_argv(key, url)
    warn_data_key_in_argv(data_key, url)
    rpc = RpcChain(url, key=key)
    client = _game_client(rpc, contract, task, role, first_block)
    blobs = BlobStore(store)
    if rehearsal is not None:  # on stderr, --json or not: a rehearsal is never mistaken for the real thing
        err_console.print(f"[bold yellow]{escape(rehearsal.banner(task))}[/]", soft_wrap=True)
    # each action as it happens: one taken before a failure is not lost
    show = printer(as_json, None if rehearsal is None else rehearsal.spec)
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
            deviation=None if rehearsal is None else rehearsal.deviation(task_cfg),
            rehearsal=None if rehearsal is None else rehearsal.spec,
            on_action=show,
            progress=bars,
            policy=TermsPolicy(
                min_clock_allowance=TermsPolicy.min_clock_allowance if min_clock is None else min_clock,
                judge_may_be_client=allow_client_judge,
                min_payment=min_payment or 0,
                max_bond=max_bond,
                max_challenge_window=max_challenge_window,
                commit_margin=TermsPolicy.commit_margin if commit_margin is None else commit_margin,
                max_chunk_bytes=TermsPolicy.max_chunk_bytes if max_chunk_bytes is None else max_chunk_bytes,
            ),
        )
    elif auditor is not None:
        from auditor_node.agent import AuditorAgent

        agent = AuditorAgent(
            client,
            task,
            profile=profile,
            workdir=workdir,
            store=blobs,
            data_key=dkey,
            strategy=auditor,
            evidence_dir=evidence_dir,
            on_action=show,
            progress=bars,
            save_every_s=DEFAULT_EVERY_S if save_every is None else save_every,
            config=auditor_cfg,
            max_log_pieces=MAX_PIECES if max_log_pieces is None else max_log_pieces,
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
            run(agent, rpc, poll=poll, as_json=as_json, label=f"{role.value} node: task {task}")
            if as_json:  # a script reading the lines knows the end from a crash
                show(ended_action(role.value, task, client.task(task)))
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


def _auditor_strategy(name: str | None, seed: int | None) -> AuditorStrategy:
    """``--strategy`` and ``--seed`` made into the auditor's strategy; a seed that a strategy
    without chance would ignore is refused."""
    from game.strategies.auditors import AUDITORS, auditor_strategy

    made = auditor_strategy(name or "honest", 0 if seed is None else seed)
    if seed is not None and not hasattr(made, "seed"):
        seeded = [n for n in AUDITORS if hasattr(AUDITORS.get(n)(0), "seed")]
        raise ConfigError(
            f"--seed does nothing for --strategy {name or 'honest'}, which draws nothing at random: "
            f"it is for --strategy {' or '.join(seeded)}"
        )
    return made


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
