"""``vgame bench gas``: gas of every contract function and of whole disputes, as a table or JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from game.cli.app import bench_app, console, emit_json, err_console, fail
from game.cli.bench_game import MOVES_TIME, parse_leaves
from game.cli.options import JsonOpt, checked_chain
from game.errors import VGameError

if TYPE_CHECKING:  # web3 loads only when the command runs, so `vgame --help` stays fast
    from game.bench.gas import GasReport


@bench_app.command("gas")
def gas(
    chain: str = typer.Option(
        "embedded",
        "--chain",
        help="The chain: embedded (a fresh in-process chain) or anvil (a fresh local anvil that this "
        "command starts and stops). A running node's URL is refused: the bench moves the chain's clock.",
    ),
    sizes: str = typer.Option(
        "10,20", "--sizes", help="log2 of the leaf counts to play (k or 2^k), comma-separated."
    ),
    json_out: JsonOpt = False,
) -> None:
    """Deploy the game, call every function once and play whole disputes; report the gas."""
    from game.bench.gas import measure
    from game.chain.backends import connect

    chain = checked_chain(chain, moves_time=MOVES_TIME)
    log2_sizes = parse_leaves([sizes], "--sizes")
    try:
        with connect(chain) as ch:
            if json_out:
                report = measure(ch, log2_sizes)
            else:
                with console.status("measuring gas") as status:
                    report = measure(ch, log2_sizes, progress=lambda m: status.update(m))
    except VGameError as exc:
        raise fail(exc) from None
    except ValueError as exc:
        raise fail(str(exc)) from None
    if json_out:
        emit_json(report.to_json())
        return
    _print_tables(report)


def _print_tables(report: GasReport) -> None:
    from rich.table import Table

    from game.bench.gas import targets_met

    sizes = report.sizes
    heads = [f"N = 2^{s.log2_leaves}" for s in sizes]

    console.print(f"chain: {report.chain}")
    funcs = Table(title="Gas per function", title_justify="left")
    funcs.add_column("function")
    for h in heads:
        funcs.add_column(h, justify="right")
    names = list(dict.fromkeys(name for s in sizes for name in s.functions))
    for name in names:
        funcs.add_row(name, *[f"{s.functions.get(name, 0):,}" for s in sizes])
    console.print(funcs)

    summary = Table(title="Bisection and whole dispute", title_justify="left")
    summary.add_column("measure")
    for h in heads:
        summary.add_column(h, justify="right")
    summary.add_column("target", justify="right")

    def mark(ok: bool) -> str:
        return "[green]ok[/]" if ok else "[red]over[/]"

    met = [targets_met(s, report) for s in sizes]
    rows: list[tuple[str, list[str], str]] = [
        ("reveal gas: max", [f"{s.reveal.max:,}" for s in sizes], f"<= {report.move_target:,}"),
        ("reveal gas: median", [f"{s.reveal.median:,.0f}" for s in sizes], ""),
        ("respond gas: max", [f"{s.respond.max:,}" for s in sizes], f"<= {report.move_target:,}"),
        ("respond gas: median", [f"{s.respond.median:,.0f}" for s in sizes], ""),
        ("move gas within target", [mark(m["move_gas"]) for m in met], ""),
        (
            "bisection transactions",
            [f"{s.bisection_txs} ({mark(m['bisection_txs'])})" for s, m in zip(sizes, met, strict=True)],
            "<= 2 x ceil(log2(N-1))",
        ),
        ("dispute transactions (+challenge, ruling)", [str(s.dispute_txs) for s in sizes], ""),
        (
            "whole dispute gas",
            [f"{s.dispute_gas:,} ({mark(m['dispute_gas'])})" for s, m in zip(sizes, met, strict=True)],
            f"<= {report.dispute_target:,}",
        ),
        ("pinned step", [f"{s.pinned_step:,}" for s in sizes], ""),
        ("worst gas used / gas bought", [f"{s.max_used_over_limit:.2f}" for s in sizes], "< 1"),
        ("tree build / play seconds", [f"{s.tree_seconds:.1f} / {s.play_seconds:.1f}" for s in sizes], ""),
    ]
    for label, cells, target in rows:
        summary.add_row(label, *cells, target)
    console.print(summary)
    if not all(all(m.values()) for m in met):
        err_console.print("[yellow]some gas targets are not met[/]")
