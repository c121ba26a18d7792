"""The shared Typer application and helpers every subcommand module uses.

Subcommand modules (``training``, ``bench``, ...) import :data:`app` and register commands on it;
they import torch and web3 inside the command functions so ``vgame --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from game.errors import VGameError

app = typer.Typer(
    name="vgame",
    help="Verifiable ML training: bit-exact replay across hardware, settled by an on-chain verification game.",
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
