"""The shared Typer application and the output every subcommand module uses.

Subcommand modules (``training``, ``bench``, ...) import :data:`app` and register commands on it;
they import torch and web3 inside the command functions so ``vgame --help`` stays fast. Here: the
app and its ``bench`` group, the consoles, the Ctrl-C/SIGTERM handling, a progress bar, the
``--json`` document and the ``error:`` line. The options several commands share and their checks
are in :mod:`game.cli.options`; the data key and the warnings about secrets in :mod:`game.cli.keys`.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from game.errors import VGameError

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

# no emoji codes: a name the user chose is printed as it is (a task ``tasks:llama`` followed by a
# colon would print as a llama)
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)


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

    def _stop(self, signum: int, _frame: object) -> None:
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


@contextmanager
def bar_progress(label: str, quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr for people, fed ``(done, total)``; nothing when ``quiet`` (``--json``)."""
    if quiet:
        yield None
        return
    with progress_bar() as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (the ``--json`` contract for scripts)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def error_line(exc: BaseException | str) -> str:
    """An error as one line for a person, never led by a Python repr: our errors as they say
    (:meth:`~game.errors.VGameError.for_people`: a contract error's meaning before its raw form),
    a file error as ``path: what is wrong`` (not ``[Errno 20] Not a directory: 'path'``)."""
    if isinstance(exc, str):
        return exc
    if isinstance(exc, VGameError):
        return exc.for_people()
    if isinstance(exc, OSError) and exc.strerror:
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{where}: {exc.strerror}" if where else exc.strerror
    return str(exc) or type(exc).__name__


def fail(err: VGameError | str, code: int = 2) -> typer.Exit:
    """Print an error for people on stderr and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(error_line(err))}")  # messages may hold [brackets]
    return typer.Exit(code)
