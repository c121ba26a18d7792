"""``vgame task ...``: the client's part of a task from the shell (the API is :mod:`game.tasks`).

A task lives on a chain that outlives one command, so these commands talk to a running node by its
JSON-RPC URL (``--chain http://127.0.0.1:8545`` for a local anvil you started, or a testnet) and sign
with ``--key`` (or ``VGAME_PRIVATE_KEY``); ``show`` and ``model`` only read, and take no key.
``--chain embedded`` and ``--chain anvil`` mean what they mean everywhere, a fresh chain for this
one command, which would forget the task at once, so they are refused here with the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from game.cli.app import app, console, emit_json, err_console
from game.cli.keys import (
    given_data_key,
    read_data_key,
    warn_data_key_in_argv,
    warn_key_in_argv,
    write_secret,
)
from game.cli.options import (
    DataKeyOpt,
    FromBlockOpt,
    JsonOpt,
    RunningChainOpt,
    check_profile,
    checked_chain,
    checked_first_block,
)
from game.cli.units import parse_wei, shown
from game.errors import ConfigError, InsufficientFunds, VerificationGameError

if TYPE_CHECKING:
    from eth_typing import ChecksumAddress

    from game.chain.client import VerificationGameClient
    from game.chain.types import TxReceipt

task_app = typer.Typer(
    help="The client's part: post a task, read it, cancel, finalize, reclaim; make a data key.",
    no_args_is_help=True,
)
app.add_typer(task_app, name="task")

ChainOpt = RunningChainOpt
#: why the task commands refuse a fresh chain (:func:`game.cli.options.checked_chain`)
_OUTLIVES = "a task lives on its chain between commands"
KeyOpt = Annotated[
    str | None,
    typer.Option("--key", help="Signing key: 0x-hex private key or keystore file (or VGAME_PRIVATE_KEY)."),
]
ContractOpt = Annotated[
    str, typer.Option("--contract", envvar="VGAME_CONTRACT", help="Address of the deployed game contract.")
]


@contextmanager
def _client(
    chain: str,
    key: str | None,
    contract: str | None,
    *,
    reads_only: bool = False,
    first_block: int | None = None,
) -> Iterator[VerificationGameClient]:
    """A client of the deployed contract on a running node, signing with ``key`` (``reads_only``:
    no key needed, see :func:`game.chain.rpc.load_account`)."""
    chain = checked_chain(chain, outlives=_OUTLIVES)
    from game.chain.backends import connect
    from game.chain.client import ClientOptions, VerificationGameClient

    warn_key_in_argv(key, chain)
    with connect(chain, key=key, reads_only=reads_only) as ch:
        if contract is None:
            yield VerificationGameClient(ch, "0x" + "00" * 20, ch.account(0))
            return
        if not ch.w3.eth.get_code(_address(contract, "--contract")):
            raise ConfigError(f"no contract at {contract} on {ch.describe()}")
        options = ClientOptions(first_block=checked_first_block(first_block, ch.block_number()))
        yield VerificationGameClient(ch, contract, ch.account(0), options=options)


def _amount(flag: str, what: str) -> Any:
    """An option that takes an amount of ether (:func:`parse_wei`)."""
    return typer.Option(flag, parser=parse_wei, metavar="AMOUNT", help=f"{what}: wei, or 0.001ether, 5gwei.")


def _address(text: str, what: str) -> ChecksumAddress:
    from game.chain.address import checked_address

    return checked_address(text, what)


def _tx_doc(rec: TxReceipt) -> dict[str, Any]:
    return {
        "function": rec.function,
        "tx_hash": rec.tx_hash,
        "block": rec.block_number,
        "gas_used": rec.gas_used,
    }


def _report(rec: TxReceipt | None, what: str, as_json: bool, **extra: Any) -> None:
    doc: dict[str, Any] = {"done": rec is not None, **extra}
    if rec is not None:
        doc["tx"] = _tx_doc(rec)
    if as_json:
        emit_json(doc)
        return
    if rec is None:
        console.print(f"nothing {what}: this account has no credit in the contract")
        return
    console.print(f"[bold green]{what}[/] tx {rec.tx_hash} (gas {rec.gas_used:,})")


# ----------------------------------------------------------------------------------------------
# keygen, deploy
# ----------------------------------------------------------------------------------------------


@task_app.command("keygen")
def keygen_cmd(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the key to this file (mode 600), never to the terminal."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a fresh 256-bit data key: hand it to the trainer, auditor and judge, never on-chain."""
    from game.store.keys import key_fingerprint, new_key

    if out is None:  # no command prints a data key: scrollback and logs keep it, a pipe loses it
        raise ConfigError("pass --out FILE: the key is written there (mode 600), never printed")
    key = new_key()
    write_secret(out, key.hex())
    if as_json:  # the file and a fingerprint stand for the key: the key itself only in its file
        emit_json({"file": str(out), "data_key_sha256": key_fingerprint(key)})
        return
    console.print(
        f"[bold green]wrote[/] a fresh data key to {out} (mode 600): pass `--data-key {out}` "
        "to `task create` and to the nodes",
        soft_wrap=True,  # one line: a path is not broken in two
    )


@task_app.command("deploy")
def deploy_cmd(chain: ChainOpt = "", key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Deploy the game contract (once per chain; every task of every client can use it)."""
    from game.chain.deploy import deploy_contract

    with _client(chain, key, None) as c:
        dep = deploy_contract(c.chain, c.account)
    if as_json:
        emit_json(
            {
                "contract": dep.address,
                "block": dep.block_number,
                "tx_hash": dep.tx_hash,
                "gas_used": dep.gas_used,
            }
        )
        return
    console.print(
        f"[bold green]deployed[/] the game at {dep.address} in block {dep.block_number} (gas "
        f"{dep.gas_used:,}): nodes and `task show` start their event scans there (the contract's "
        "deployedInBlock())",
        soft_wrap=True,
    )


# ----------------------------------------------------------------------------------------------
# create
# ----------------------------------------------------------------------------------------------


@task_app.command("create")
def create_cmd(
    config: Annotated[Path, typer.Option("--config", help="TOML task config (its spec hash goes on-chain).")],
    trainer: Annotated[str, typer.Option("--trainer", help="The trainer's address.")],
    judge: Annotated[str, typer.Option("--judge", help="The judge's address.")],
    chain: ChainOpt = "",
    key: KeyOpt = None,
    contract: ContractOpt = "",
    payment: Annotated[int, _amount("--payment", "Payment escrowed")] = 10**15,
    trainer_bond: Annotated[int, _amount("--trainer-bond", "Trainer's bond")] = 5 * 10**14,
    auditor_bond: Annotated[int, _amount("--auditor-bond", "Each auditor's bond")] = 10**14,
    clock: Annotated[int, typer.Option("--clock", help="Seconds per party per game (chess clock).")] = 3600,
    window: Annotated[
        int, typer.Option("--window", help="Challenge window after the commit, seconds.")
    ] = 86400,
    judge_window: Annotated[
        int, typer.Option("--judge-window", help="Seconds the judge has to rule.")
    ] = 3600,
    commit_window: Annotated[
        int,
        typer.Option(
            "--commit-window", help="Seconds the trainer has from accepting the task to committing it."
        ),
    ] = 7 * 86400,
    data_key: Annotated[
        str | None,
        typer.Option("--data-key", help="Use this data key (its file, or 64 hex) instead of a fresh one."),
    ] = None,
    data_key_out: Annotated[
        Path | None,
        typer.Option(
            "--data-key-out",
            help="Write the data key (a fresh one, or --data-key's) to this file (mode 600).",
        ),
    ] = None,
    evidence_dir: Annotated[
        Path | None,
        typer.Option(
            "--evidence-dir",
            help="Also leave the config here, with its inputs, under the spec hash: the auditors' and "
            "judge's directory, where a node finds it to replay a withheld transcript's log from the "
            "chain.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Post a task: the config's spec hash, the trainer and judge, bonds, clocks, window and payment."""
    from game.store.keys import key_fingerprint, key_hash, new_key
    from game.tasks import TaskTerms, post_task
    from game.training.task.config import load_config

    checked_chain(chain, outlives=_OUTLIVES)  # before a key file is made for a task that cannot be posted
    if data_key is None and data_key_out is None:  # a key only printed is a key lost to a pipe
        raise ConfigError(
            "the task's data key must be kept: pass --data-key-out FILE to make a fresh one there, "
            "or --data-key FILE with one from `vgame task keygen --out FILE`"
        )
    cfg = load_config(config)
    if evidence_dir is not None:  # before the post: a directory that cannot be had stops nothing posted
        try:
            evidence_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"--evidence-dir {evidence_dir}: not a directory that can be written ({exc})"
            ) from None
    terms = TaskTerms(
        payment=payment,
        trainer_bond=trainer_bond,
        auditor_bond=auditor_bond,
        clock_allowance=clock,
        challenge_window=window,
        judge_window=judge_window,
        commit_window=commit_window,
    )
    trainer_addr, judge_addr = _address(trainer, "--trainer"), _address(judge, "--judge")
    dkey = read_data_key(data_key) if data_key else new_key()
    warn_data_key_in_argv(data_key, chain)
    # The key reaches its file before the task reaches the chain: a task whose key was lost (the
    # file could not be written after the transaction) could only be cancelled.
    made = data_key_out is not None and write_secret(data_key_out, dkey.hex())
    try:
        with _client(chain, key, _required_contract(contract)) as c:
            rec = post_task(
                c,
                cfg.spec_hash(),
                key_hash=key_hash(dkey),
                num_leaves=cfg.num_leaves,
                trainer=trainer_addr,
                judge=judge_addr,
                terms=terms,
            )
    except (ConfigError, InsufficientFunds, VerificationGameError):
        # refused before or by the contract: no task holds the key, and the same command may run
        # again. Any other failure (a node lost mid-transaction) keeps the file: a task may hold it.
        if made and data_key_out is not None:
            data_key_out.unlink(missing_ok=True)
        raise
    key_file = data_key_out or (
        Path(data_key) if data_key and Path(data_key).expanduser().is_file() else None
    )
    left = None
    if evidence_dir is not None:  # after the post: a config under a spec hash no task holds helps nobody
        from game.evidencedir import write_task_config

        try:
            left = write_task_config(evidence_dir, cfg, cfg.spec_hash())
        except OSError as exc:  # the task is posted: say so below all the same
            err_console.print(f"[yellow]warning[/]: the config could not be left in {evidence_dir}: {exc}")
    doc = {  # the key's file and fingerprint, never the key: scrollback and logs keep what is printed
        "task_id": rec.result,
        "spec_hash": cfg.spec_hash().hex(),
        "config_left": str(left) if left else None,
        "data_key_file": str(key_file) if key_file else None,
        "data_key_sha256": key_fingerprint(dkey),
        "terms": terms.to_dict(),
        "tx": _tx_doc(rec),
    }
    if as_json:
        emit_json(doc)
        return
    console.print(f"[bold green]task {rec.result}[/] posted (tx {rec.tx_hash}, gas {rec.gas_used:,})")
    console.print(f"  spec hash  {doc['spec_hash']}")
    where = f"in {key_file}" if key_file is not None else "the one given with --data-key"
    console.print(f"  data key   {where}  (give it to the trainer, auditors and judge)", soft_wrap=True)
    if left is not None:
        console.print(f"  config     left at {left} for the auditors and judge", soft_wrap=True)
    else:
        console.print(
            "  config     give it to the auditors too (or leave it with --evidence-dir): without it "
            "they cannot replay a withheld transcript's log from the chain",
            soft_wrap=True,
        )


def _required_contract(contract: str) -> str:
    if not contract:
        raise ConfigError(
            "--contract is required (or set VGAME_CONTRACT); deploy one with `vgame task deploy`"
        )
    return _address(contract, "--contract")


# ----------------------------------------------------------------------------------------------
# show, cancel, finalize, reclaim
# ----------------------------------------------------------------------------------------------


@task_app.command("show")
def show_cmd(
    task_id: Annotated[int, typer.Argument(help="Task id (1, 2, ...).")],
    chain: ChainOpt = "",
    contract: ContractOpt = "",
    first_block: FromBlockOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The task's state and every game played against it (reads only: takes no key)."""
    from game.tasks import describe_task

    with _client(chain, None, _required_contract(contract), reads_only=True, first_block=first_block) as c:
        doc = describe_task(c, task_id)
    if as_json:
        emit_json(doc)
        return
    table = Table(title=f"task {task_id}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")  # a hash is copied whole, never cut with an ellipsis
    for k, v in doc.items():
        if k != "games":
            table.add_row(k, shown(k, v, now=doc["now"]))
    console.print(table)
    if doc["games"]:
        games = Table(title="games")
        for col in ("game_id", "phase", "lo", "hi", "pinned_step", "outcome", "reason", "winner"):
            games.add_column(col)
        for g in doc["games"]:
            games.add_row(
                *(
                    str(g[col])
                    for col in ("game_id", "phase", "lo", "hi", "pinned_step", "outcome", "reason", "winner")
                )
            )
        console.print(games)


@task_app.command("model")
def model_cmd(
    task_id: Annotated[int, typer.Argument(help="Task id.")],
    store: Annotated[Path, typer.Option("--store", help="Blob store the trainer published to.")],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="File to write the model's state_dict to (.pt, or .safetensors); with --pretrained, "
            "a new directory.",
        ),
    ],
    data_key: DataKeyOpt = None,
    chain: ChainOpt = "",
    contract: ContractOpt = "",
    accept_unsettled: Annotated[
        bool,
        typer.Option(
            "--accept-unsettled",
            help="Exit 0 although the model is not beyond dispute yet (window open, a game in play, "
            "not finalized) or an auditor showed it wrong; without it such a model is written but "
            "the exit code is 1.",
        ),
    ] = False,
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            help="Hardware profile to replay the transcript on where its final checkpoint is missing "
            "or altered (the model is then rebuilt from the log, every leaf checked).",
        ),
    ] = "cpu-1t",
    pretrained: Annotated[
        bool,
        typer.Option(
            "--pretrained",
            help="Write --out as a directory by the model's own save_pretrained: a Hugging Face "
            "model's config and weights (from_pretrained loads them), a PEFT model's adapter alone "
            "(PeftModel.from_pretrained puts it onto the base model).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Take the trained model: the committed final state, checked against the chain, written as a
    PyTorch state_dict, or by its library's save_pretrained (reads only: takes no key). Exits 1
    unless the task is settled (or --accept-unsettled), so a script that ships the file only on
    success never ships a model that can still be shown wrong."""
    from game.delivery import fetch_model
    from game.store.blobs import BlobStore

    check_profile(profile)
    dkey = given_data_key(data_key)
    warn_data_key_in_argv(data_key, chain)
    with _client(chain, None, _required_contract(contract), reads_only=True) as c:
        # decrypting and decoding the final state takes seconds at paper size (18 s at GPT-2 small)
        with err_console.status(f"taking the model of task {task_id} from {store}"):
            got = fetch_model(c, task_id, BlobStore(store), dkey, out, profile=profile, pretrained=pretrained)
        now = c.chain.now()
    if as_json:
        emit_json(got.to_dict(now))
    else:
        console.print(
            f"[bold green]model of task {task_id}[/] written to {got.path}: {got.preset}, {got.steps} "
            f"steps, {got.values:,} values ({'save_pretrained, float32' if pretrained else 'float32 state_dict'})"
        )
        console.print(f"  final state  {got.final_leaf.hex()} (the committed last leaf)")
        style = "green" if got.settled else "yellow"
        console.print(f"  [{style}]{got.standing(now)}[/]")
    if not got.settled and not accept_unsettled:
        err_console.print(
            f"task {task_id} is not settled: the model is not beyond dispute ({got.standing(now)}); "
            "exit code 1 (--accept-unsettled takes it as it is)"
        )
        raise typer.Exit(1)


@task_app.command("cancel")
def cancel_cmd(
    task_id: Annotated[int, typer.Argument(help="Task id.")],
    chain: ChainOpt = "",
    key: KeyOpt = None,
    contract: ContractOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Cancel a task nobody has committed to yet; the payment is credited back (then `reclaim`)."""
    with _client(chain, key, _required_contract(contract)) as c:
        rec = c.cancel(task_id)
    _report(rec, "cancelled", as_json, task_id=task_id)


@task_app.command("finalize")
def finalize_cmd(
    task_id: Annotated[int, typer.Argument(help="Task id.")],
    chain: ChainOpt = "",
    key: KeyOpt = None,
    contract: ContractOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Settle a task after its challenge window, once every game has ended (anyone may)."""
    with _client(chain, key, _required_contract(contract)) as c:
        rec = c.finalize(task_id)
    _report(rec, "finalized", as_json, task_id=task_id)


@task_app.command("reclaim")
def reclaim_cmd(
    chain: ChainOpt = "",
    key: KeyOpt = None,
    contract: ContractOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Withdraw this account's credit: the payment after a successful challenge or a cancel."""
    from game.tasks import reclaim

    with _client(chain, key, _required_contract(contract)) as c:
        credit = c.credit()
        rec = reclaim(c)
    _report(rec, "reclaimed", as_json, amount=credit if rec is not None else 0)
