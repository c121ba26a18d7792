"""``vgame calibrate``: measure the divergence bands of a preset's ops under pairs of profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from game.cli.app import app, console, emit_json, err_console
from game.cli.options import (
    BatchSizeOpt,
    JsonOpt,
    ModelOpt,
    check_out_file,
    check_profile,
    parse_model_overrides,
    task_config,
)
from game.errors import ConfigError
from game.fsio import atomic_write


@app.command("calibrate")
def calibrate_cmd(
    preset: Annotated[str | None, typer.Option("--preset", help="Task preset, e.g. gpt-shakespeare.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML task config.")] = None,
    profiles: Annotated[
        str,
        typer.Option("--profiles", help="Comma-separated profiles to compare; the first is the reference."),
    ] = "cpu-1t,cpu-2t,splitk-16,splitk-64,noisy",
    steps: Annotated[int, typer.Option("--steps", help="Training steps whose ops are measured.")] = 10,
    margin: Annotated[
        int, typer.Option("--margin", help="Safety factor on the measured divergence (>= 16).")
    ] = 16,
    random_inputs: Annotated[
        bool,
        typer.Option("--random-inputs/--no-random-inputs", help="Also measure each op on random inputs."),
    ] = True,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the bands file here (use it with `--bands` or in a config)."),
    ] = None,
    model: ModelOpt = None,
    batch_size: BatchSizeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure how far each rounded op's float64 results lie apart across profiles; write the bands.

    Give --model and --batch-size as the task will train, so the bands are measured at its size."""
    from game.bench.calibrate import calibrate

    names = [p.strip() for p in profiles.split(",") if p.strip()]
    if len(names) < 2:
        raise ConfigError("--profiles: give at least two profiles, comma-separated")
    for name in names:
        check_profile(name)  # all of them now, not after the first has run
    if out is not None:
        check_out_file(out, example="bands.toml")  # now, not after the measuring
    cfg = task_config(preset, config, model=parse_model_overrides(model), batch_size=batch_size)
    if as_json:
        result = calibrate(cfg, names, steps=steps, margin=margin, random_inputs=random_inputs)
    else:
        with console.status("calibrating") as status:
            result = calibrate(
                cfg, names, steps=steps, margin=margin, random_inputs=random_inputs, progress=status.update
            )
    if out is not None:
        atomic_write(out, result.to_toml(None if config is None else f"--config {config}").encode("utf-8"))
    if as_json:
        doc = result.to_dict()
        doc["out"] = str(out) if out is not None else None
        emit_json(doc)
        return
    table = Table(title=f"divergence bands of {cfg.preset} ({', '.join(names)}; margin {margin}x)")
    for col in ("op", "values", "differing", "flips at b=32", "max |d| / 2^e(x)", "band [rel, abs]"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for op in result.ops:
        rel = op["max_rel_log2"]
        table.add_row(
            op["op"],
            f"{op['values']:,}",
            f"{op['differing']:,}",
            f"{op['flips_at_32']:,}",
            "0" if rel is None else f"2^{rel:.1f}",
            f"2^{op['band'][0]}, 2^{op['band'][1]}",
        )
    console.print(table)
    d = result.table.default
    console.print(f"default band (ops not measured): [2^{d.rel}, 2^{d.abs}]")
    if out is not None:
        console.print(
            f'[bold green]wrote[/] {out}: use it with `vgame train --bands {out}` or `bands = "{out.name}"`'
        )
    else:
        err_console.print("(no --out: nothing written)")
