"""The ``vgame`` command line: one entry point, subcommands, ``--json`` output for scripts."""

from __future__ import annotations

import os
import sys

from rich.markup import escape

from game.cli.app import app, err_console, error_line, interrupts
from game.errors import VGameError


def _register() -> None:
    # Each module registers its commands on ``app`` when imported.
    import importlib

    for name in (
        "training",
        "calibrate",
        "bench",
        "bench_replication",
        "bench_overhead",
        "bench_log",
        "bench_game",
        "bench_plot",
        "bench_scale",
        "demo",
        "task",
        "node",
        "ps",
    ):
        try:
            importlib.import_module(f"game.cli.{name}")
        except ModuleNotFoundError as exc:  # a module not written yet must not break the others
            if exc.name != f"game.cli.{name}":
                raise


def main() -> None:
    """Console-script entry point: turn our errors into a one-line message and exit code 2."""
    _register()
    interrupts.catch_stops()
    try:
        app()
    except VGameError as exc:
        err_console.print(f"[bold red]error:[/] {escape(error_line(exc))}")  # messages may hold [brackets]
        if os.environ.get("VGAME_DEBUG"):
            raise
        raise SystemExit(2) from None
    except OSError as exc:  # a path it cannot write or read (--out under a missing directory)
        why = (
            " (a file stands where a directory is needed)"
            if isinstance(exc, FileExistsError | NotADirectoryError)
            else ""
        )
        err_console.print(f"[bold red]error:[/] {escape(error_line(exc))}{why}")
        if os.environ.get("VGAME_DEBUG"):
            raise
        raise SystemExit(2) from None
    except KeyboardInterrupt:  # outside a command (one inside comes out of typer as exit code 130)
        _interrupted()
    except SystemExit as exc:
        if exc.code == 130:
            _interrupted()
        raise


def _interrupted() -> None:
    """Say so (unless the command did), and exit 130 for Ctrl-C, 128 + N for stop signal N."""
    if not interrupts.said:
        err_console.print(f"[yellow]interrupted:[/] {escape(_command())}{_by_signal()}")
    code = 130 if interrupts.signal is None else 128 + interrupts.signal
    raise SystemExit(code) from None


def _by_signal() -> str:
    if interrupts.signal is None:
        return ""
    import signal

    return f" ({signal.Signals(interrupts.signal).name})"


def _command() -> str:
    """The command that was running (``vgame bench overhead``), from its leading words: a log of
    several runs then says which one a Ctrl-C stopped."""
    words = ["vgame"]
    for arg in sys.argv[1:3]:
        if arg.startswith("-"):
            break
        words.append(arg)
    return " ".join(words)
