"""``vgame bench game``: whole disputes timed on the embedded chain and on anvil, as a table or JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from game.cli.app import bench_app, console, emit_json, err_console, fail
from game.cli.options import URL_SCHEMES, JsonOpt, checked_chain
from game.errors import VGameError

if TYPE_CHECKING:  # web3 loads only when the command runs, so `vgame --help` stays fast
    from game.bench.dispute import ChainGameReport

CHAINS = {"embedded": ("embedded",), "anvil": ("anvil",), "both": ("embedded", "anvil")}
#: why the benchmarks refuse a running node's URL (:func:`game.cli.options.checked_chain`)
MOVES_TIME = "the bench moves the chain's clock and takes it back to snapshots"
DEFAULT_LEAVES = (10, 20)
MAX_LOG2_LEAVES = 24


def _log2_size(part: str, option: str) -> int:
    """One size: ``k`` or ``2^k`` (``2**k``), the log2 of a leaf count in 1..MAX_LOG2_LEAVES."""
    text = part.strip()
    base, caret, exponent = text.replace("**", "^").partition("^")
    try:
        k = int(exponent) if caret and int(base) == 2 else int(text)
    except ValueError:
        raise typer.BadParameter(
            f"{option} takes log2 leaf counts, e.g. {option} 10 or 2^10 (1,024 leaves); not {text!r}"
        ) from None
    if not 1 <= k <= MAX_LOG2_LEAVES:
        hint = (
            f"; {k:,} leaves is {option} {k.bit_length() - 1} (or 2^{k.bit_length() - 1})"
            if k > MAX_LOG2_LEAVES and k & (k - 1) == 0
            else ""
        )
        raise typer.BadParameter(
            f"{option} takes the log2 of the leaf count, 1..{MAX_LOG2_LEAVES}, not {k}{hint}"
        )
    return k


def parse_leaves(values: list[str] | None, option: str = "--leaves") -> list[int]:
    """Sizes given any number of times, each ``k`` or ``2^k`` or a comma-separated list of them.

    A plain number is the log2 of the leaf count (``20`` is 1,048,576 leaves), as the tables print
    it; a leaf count typed in full is refused with the exponent to pass instead."""
    if not values:
        return list(DEFAULT_LEAVES)
    sizes = [_log2_size(part, option) for v in values for part in v.split(",") if part.strip()]
    if not sizes:
        raise typer.BadParameter(f"{option} needs at least one size, e.g. {option} 10,20")
    return list(dict.fromkeys(sizes))


@bench_app.command("game")
def game(
    leaves: Annotated[
        list[str] | None,
        typer.Option(
            "--leaves", help="log2 of the leaf count, or 2^k; repeat or comma-separate (default 10,20)."
        ),
    ] = None,
    chain: Annotated[
        str,
        typer.Option(
            "--chain",
            help="The chain: embedded (a fresh in-process chain), anvil (a fresh local anvil that this "
            "command starts and stops) or both, one after the other. A running node's URL is refused: "
            "the bench moves the chain's clock.",
        ),
    ] = "both",
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Disputes played per chain and size.")] = 3,
    json_out: JsonOpt = False,
) -> None:
    """Play whole disputes (challenge, bisection, ruling); report transactions, gas and wall time."""
    from game.bench.dispute import TreeCache, bench_document, measure_game
    from game.chain.backends import connect

    if chain not in CHAINS:
        if chain.startswith(URL_SCHEMES):
            checked_chain(chain, moves_time=MOVES_TIME)  # refused, saying why
        raise typer.BadParameter(f"--chain must be one of {', '.join(CHAINS)}, not {chain!r}")
    log2_sizes = parse_leaves(leaves)
    trees: TreeCache = {}  # a 2^20 tree is built once for both chains
    reports: list[ChainGameReport] = []
    try:
        for name in CHAINS[chain]:
            with connect(name) as ch:
                if json_out:
                    reports.append(measure_game(ch, log2_sizes, repeats, trees=trees))
                else:
                    with console.status(f"playing disputes on {name}") as status:
                        reports.append(
                            measure_game(
                                ch, log2_sizes, repeats, trees=trees, progress=lambda m: status.update(m)
                            )
                        )
    except VGameError as exc:
        raise fail(exc) from None
    except ValueError as exc:
        raise fail(str(exc)) from None
    doc = bench_document(reports)
    if json_out:
        emit_json(doc)
        return
    _print(reports)
    if not doc["all_targets_reached"]:
        err_console.print("[yellow]some targets are not reached[/]")


def _print(reports: list[ChainGameReport]) -> None:
    from rich.table import Table

    from game.bench.dispute import DISPUTE_TARGET_LOG2_LEAVES
    from game.bench.gas import DISPUTE_GAS_TARGET, MOVE_GAS_TARGET

    def mark(ok: bool) -> str:
        return "[green]reached[/]" if ok else "[red]not reached[/]"

    repeats = reports[0].repeats if reports else 0
    table = Table(
        title=f"Whole disputes (challenge + bisection + ruling); wall time over {repeats} repeats",
        title_justify="left",
    )
    cols = ("chain", "N", "txs", "reveal gas max / median", "respond gas max / median", "dispute gas",
            "wall s median", "wall s min - max")  # fmt: skip
    for c in cols:
        table.add_column(c, justify="left" if c == "chain" else "right")
    for r in reports:
        for s in r.sizes:
            w = s.wall_seconds
            table.add_row(
                r.chain, f"2^{s.log2_leaves}", str(s.transactions),
                f"{s.reveal.max:,} / {s.reveal.median:,.0f}", f"{s.respond.max:,} / {s.respond.median:,.0f}",
                f"{s.dispute_gas:,}", f"{w.median:.3f}", f"{w.min:.3f} - {w.max:.3f}",
            )  # fmt: skip
    console.print(table)

    targets = Table(title="Targets", title_justify="left")
    for c in ("chain", "N", f"gas per move <= {MOVE_GAS_TARGET:,}", f"dispute gas <= {DISPUTE_GAS_TARGET:,}"):
        targets.add_column(c, justify="left" if c == "chain" else "right")
    for r in reports:
        for s in r.sizes:
            t = s.targets()
            targets.add_row(
                r.chain,
                f"2^{s.log2_leaves}",
                f"{t['move_gas']['value']:,} {mark(t['move_gas']['reached'])}",
                f"{t['dispute_gas']['value']:,} {mark(t['dispute_gas']['reached'])}",
            )
    console.print(targets)
    if reports:
        built = ", ".join(f"2^{s.log2_leaves} {s.tree_seconds:.1f} s" for s in reports[0].sizes)
        console.print(
            "transactions = challenge + 2 x ceil(log2(N-1)) moves + ruling; the dispute gas target is "
            f"stated for N = 2^{DISPUTE_TARGET_LOG2_LEAVES}; tree build (not in the wall time): {built}"
        )
