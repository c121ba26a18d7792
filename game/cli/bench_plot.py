"""``vgame bench plot``: the benchmark figure, drawn from saved ``bench overhead`` / ``bench log`` JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from game.cli.app import bench_app, console, emit_json, fail
from game.cli.options import JsonOpt
from game.errors import VGameError


@bench_app.command("plot")
def plot(
    out: Annotated[
        Path, typer.Option("--out", help="Figure to write (.png, .svg, .pdf), e.g. docs/img/benchmarks.png.")
    ],
    overhead: Annotated[
        list[Path] | None,
        typer.Option("--overhead", help="`vgame bench overhead --json` output; repeat for each preset."),
    ] = None,
    log: Annotated[
        list[Path] | None,
        typer.Option("--log", help="`vgame bench log --json` output; repeat for each preset."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Draw overhead ratios and log bits per value, with the paper's figures and the targets."""
    from game.bench.plot import plot_benchmarks, read_log, read_overhead

    overhead_files, log_files = overhead or [], log or []
    if not overhead_files and not log_files:
        raise fail("give at least one --overhead or --log JSON file")
    try:
        points = [read_overhead(p) for p in overhead_files]
        rows = [row for p in log_files for row in read_log(p)]
        written = plot_benchmarks(points, rows, out)
    except VGameError as exc:
        raise fail(exc) from None
    if json_out:
        emit_json(
            {
                "png": str(written),
                "overhead": [str(p) for p in overhead_files],
                "log": [str(p) for p in log_files],
                "presets": sorted({p.preset for p in points} | {r.preset for r in rows}),
                "log_formats": list(dict.fromkeys(f for r in rows for f in r.bits_per_value)),
            }
        )
        return
    console.print(f"wrote {written} ({len(points)} overhead files, {len(rows)} log rows)")
