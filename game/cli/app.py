"""The shared Typer application and helpers every subcommand module uses.

Subcommand modules (``training``, ``bench``, ...) import :data:`app` and register commands on it;
they import torch and web3 inside the command functions so ``vgame --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from game.errors import ConfigError, VGameError

if TYPE_CHECKING:
    from game.training.config import TaskConfig

app = typer.Typer(
    name="vgame",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(
    help="Benchmarks, reported as ratios measured side by side in one run.", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")

console = Console()
err_console = Console(stderr=True)


class _Interrupts:
    """Who says what on a Ctrl-C: a command that kept something says what and how to go on
    (:meth:`say`); for any other, ``main`` says "interrupted" (typer turns the KeyboardInterrupt
    into exit code 130 before ``main`` could see it).

    SIGTERM (a service manager's or container's stop, ``kill``) and SIGHUP (the terminal closed)
    take the same way out (:meth:`catch_stops`): Python's default for them ends the process on
    the spot, so no ``finally`` ran and an anvil that ``--chain anvil`` started lived on alone.
    """

    said = False
    signal: int | None = None  # the stop signal that came, if one did

    def say(self, message: str) -> None:
        self.said = True
        err_console.print(message, soft_wrap=True)  # one line: a path is not broken in two

    def catch_stops(self) -> None:
        """Turn SIGTERM and SIGHUP into a KeyboardInterrupt in the main thread, once; a signal
        this process was started ignoring (``nohup``) stays ignored."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is not None and signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, self._stop)

    def _stop(self, signum: int, frame: object) -> None:
        self.signal = signum
        for other in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if other is not None and signal.getsignal(other) == self._stop:
                signal.signal(other, signal.SIG_IGN)  # a second one must not cut the clean-up short
        raise KeyboardInterrupt(signal.Signals(signum).name)


interrupts = _Interrupts()


def _print_version(wanted: bool) -> None:
    if wanted:
        from game import __version__

        console.print(f"vgame {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Verifiable ML training: bit-exact replay across hardware, settled by an on-chain verification game."""


# Options that several commands take, declared once so their names and help agree.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")]
DataKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--data-key", help="The task's data key: its file, or 64 hex (else VGAME_DATA_KEY, the same)."
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help='Model sizes for --preset, e.g. "n_layer=12,n_head=12,n_embd=768,block_size=64" or '
        '"arch=resnet50".',
    ),
]
BatchSizeOpt = Annotated[
    int | None, typer.Option("--batch-size", min=1, help="Examples per step, for --preset.")
]
BandsOpt = Annotated[
    Path | None,
    typer.Option("--bands", help="A bands file from `vgame calibrate` instead of the preset's own."),
]


def progress_bar(out: Console = err_console) -> Progress:
    """The one look of a long job's bar (label, bar, steps done of all, time left), on stderr so
    that ``--json`` output stays clean; transient, so a finished job leaves its result lines only."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=out, transient=True)


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (the ``--json`` contract for scripts)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def fail(err: VGameError | str, code: int = 2) -> typer.Exit:
    """Print an error for people on stderr and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(str(err))}")  # messages may hold [brackets]
    return typer.Exit(code)


def parse_model_overrides(text: str | None) -> dict[str, int | str]:
    """``--model "n_layer=12,arch=resnet50"`` -> ``{"n_layer": 12, "arch": "resnet50"}``.

    A value that reads as an integer is one; any other is kept as a string. The config checks the
    names and the types.
    """
    out: dict[str, int | str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise typer.BadParameter(
                f"model sizes are NAME=VALUE pairs, comma-separated; got {part.strip()!r}"
            )
        try:
            out[key.strip()] = int(value)
        except ValueError:
            out[key.strip()] = value.strip()
    return out


def check_profile(name: str) -> None:
    """Refuse at once a profile this machine cannot run: an unknown name (the error lists the valid
    ones) or a CUDA profile without a GPU, before any work (or, for a node, hours of waiting)."""
    from game.training.profiles import get_profile

    if not get_profile(name).available():
        raise ConfigError(f"profile {name!r} is not available on this machine (see `vgame profiles`)")


def check_out_file(path: Path, option: str = "--out", *, example: str = "out") -> None:
    """Refuse, before any work, a file path that cannot be written: a directory, a file standing
    where one of its parent directories would be made, or a directory this user may not write in."""
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory: name the file to write (e.g. {path / example})")
    for parent in path.parents:
        if not parent.exists():
            continue
        if not parent.is_dir():
            raise ConfigError(f"{option} {path}: {parent} is a file, so no directory can be made there")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{option} {path}: {parent} is not writable")
        return


FromBlockOpt = Annotated[
    int | None,
    typer.Option(
        "--from-block",
        envvar="VGAME_FROM_BLOCK",
        min=0,
        show_default="the block the contract was deployed in, its deployedInBlock()",
        help="The first block event scans read.",
    ),
]


def checked_first_block(first_block: int | None, latest: int) -> int | None:
    """``--from-block`` checked against the chain: a block not mined yet is a typo, and every scan
    from it would find nothing (a judge would never see its games). None stays None: the
    contract's own deployment block."""
    if first_block is not None and first_block > latest:
        raise ConfigError(
            f"--from-block {first_block} is after the chain's latest block ({latest}): give the block "
            "the game contract was deployed in"
        )
    return first_block


def warn_key_in_argv(key: str | None, chain: str) -> None:
    """Warn when ``--key`` holds a raw private key for a chain off this machine: a command line is
    readable by every user of the machine (``ps``, ``/proc``) for as long as the process runs, days
    for a node. A keystore file, or ``VGAME_PRIVATE_KEY``, keeps it out. A loopback chain (anvil's
    development accounts, whose keys are public) is not warned about."""
    _warn_secret_in_argv(
        key,
        chain,
        "the private key given with --key",
        "set VGAME_PRIVATE_KEY, or pass a keystore file as --key",
    )


def warn_data_key_in_argv(data_key: str | None, chain: str) -> None:
    """The same for ``--data-key``: whoever reads the data key can read the task's data and model
    from the store, so a node that serves a real network takes it from a file or the environment."""
    _warn_secret_in_argv(
        data_key,
        chain,
        "the data key given with --data-key",
        "pass the key's file as --data-key (`task keygen --out`), or set VGAME_DATA_KEY",
    )


def _warn_secret_in_argv(secret: str | None, chain: str, what: str, remedy: str) -> None:
    if not secret or Path(secret).expanduser().is_file():
        return
    host = urllib.parse.urlparse(chain).hostname if "://" in chain else None
    if host is None or host == "localhost":
        return
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return
    err_console.print(
        f"[yellow]warning:[/] {what} can be read by every user of this machine (`ps`) while the "
        f"command runs; {remedy}",
        soft_wrap=True,
    )


def read_data_key(value: str, option: str = "--data-key") -> bytes:
    """A data key given as 64 hex characters, or as the file that holds them (what ``task keygen
    --out`` and ``task create --data-key-out`` write): a file's name on a command line gives
    nothing away, the key itself can be read by every user of the machine while a node runs."""
    from eth_utils import is_hex

    from game.store.keys import parse_key

    path = Path(value).expanduser()
    if path.is_file():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077 and os.name == "posix":
            err_console.print(
                f"[yellow]warning:[/] {value} (mode {mode:03o}) can be read by other users of this "
                f"machine, and with it the task's data and model: chmod 600 {value}",
                soft_wrap=True,
            )
        try:
            text = path.read_text("ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{option} {value}: the key file cannot be read ({exc})") from exc
        try:
            return parse_key(text)
        except VGameError as exc:
            raise ConfigError(f"{option} {value}: the file does not hold a data key: {exc}") from exc
    if not is_hex(value.strip()):
        raise ConfigError(
            f"{option} {_not_a_key(value)}: no such file, and not a data key (64 hex characters or a "
            "file holding them)"
        )
    return parse_key(value)


_HEX_RUN = re.compile(r"[0-9a-fA-F]{32}")


def _not_a_key(value: str) -> str:
    """``value`` to name in an error, unless it holds a long run of hex: then it is most likely a
    key with a typo (a stray quote or letter), and half a key is not printed either."""
    return "(a mistyped key? not shown)" if _HEX_RUN.search(value) else value


def given_data_key(data_key: str | None) -> bytes:
    """The task's data key from ``--data-key``, else from ``VGAME_DATA_KEY`` (either a file or 64
    hex, :func:`read_data_key`); a clear error when neither is given."""
    given = data_key or os.environ.get("VGAME_DATA_KEY")
    if not given:
        raise ConfigError(
            "the task's data key is needed: pass --data-key FILE (or HEX), or set VGAME_DATA_KEY"
        )
    return read_data_key(given, "--data-key" if data_key else "VGAME_DATA_KEY")


def task_config(
    preset: str | None,
    config: Path | None = None,
    *,
    steps: int | None = None,
    seed: int | None = None,
    bits: int | None = None,
    tau: float | None = None,
    log_format: str | None = None,
    bands: Path | None = None,
    model: dict[str, int | str] | None = None,
    batch_size: int | None = None,
) -> TaskConfig:
    """The task from ``--preset`` and/or ``--config``, with command-line overrides applied last.

    ``model`` (size overrides) and ``batch_size`` apply to a preset only: a config file sets its
    own ``[model]`` table and ``batch_size``."""
    from game.training.bands import BandsOrigin, load_bands_file
    from game.training.config import PRESET_NAMES, TaskConfig, load_config

    overrides: dict[str, Any] = {}
    for key, value in (
        ("steps", steps),
        ("seed", seed),
        ("bits", bits),
        ("tau", tau),
        ("log_format", log_format),
    ):
        if value is not None:
            overrides[key] = float(value) if key == "tau" else value
    origin: BandsOrigin | None = None
    if bands is not None:
        overrides["bands"], origin = load_bands_file(bands)
    if config is not None and (model or batch_size is not None):
        raise ConfigError(
            "--model and --batch-size go with --preset; in a config file set [model] and batch_size"
        )
    if model:
        overrides["model"] = model
    if batch_size is not None:
        overrides["batch_size"] = batch_size
    if config is not None:
        cfg = load_config(config)
        if preset is not None and preset != cfg.preset:
            raise ConfigError(
                f"--preset {preset} disagrees with preset {cfg.preset!r} in {config}; pass only one of them"
            )
        cfg = cfg.replace(**overrides) if overrides else cfg
    elif preset is None:
        raise ConfigError(
            f"no task given: pass --preset NAME ({', '.join(PRESET_NAMES)}) or --config FILE.toml"
        )
    else:
        cfg = TaskConfig.for_preset(preset, **overrides)
    cfg.check_bands_origin(origin, f"--bands {bands}")
    return cfg
