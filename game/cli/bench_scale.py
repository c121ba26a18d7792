"""``vgame bench scale``: steps a second on 1, 2, 4 (8) workers side by side, and the roots they
commit, as a table or JSON."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from game.cli.app import bench_app, console, emit_json, fail
from game.cli.options import (
    AccumulateOpt,
    BatchSizeOpt,
    JsonOpt,
    ModelOpt,
    PresetOpt,
    check_profile,
    parse_model_overrides,
    task_config,
)
from game.errors import ConfigError, VGameError

if TYPE_CHECKING:  # torch loads only when the command runs
    from game.bench.scale import ScaleReport


@bench_app.command("scale")
def scale(
    preset: PresetOpt = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML task config (a preset's or your own task's).")
    ] = None,
    steps: Annotated[
        int, typer.Option("--steps", min=2, help="Steps per run (the first is not timed).")
    ] = 30,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="Runs of every worker count, in turn.")
    ] = 1,
    workers: Annotated[
        str | None,
        typer.Option(
            "--workers",
            help="Worker counts, comma-separated, 1 among them (default: 1, 2, 4, and 8 with eight cores).",
        ),
    ] = None,
    model: ModelOpt = None,
    batch_size: BatchSizeOpt = None,
    accumulate: AccumulateOpt = None,
    profile: Annotated[
        str, typer.Option("--profile", help="Hardware profile of every worker (cpu-1t: one thread each).")
    ] = "cpu-1t",
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Where the runs' transcripts go (default: a temp dir).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Train one task afresh on each worker count; report steps a second, the speed-up over one
    process, and whether every run committed the same roots (exit 1 when not)."""
    from game.bench.scale import default_workers, measure_scale

    try:
        check_profile(profile)
        cfg = task_config(
            preset,
            config,
            steps=steps,
            model=parse_model_overrides(model),
            batch_size=batch_size,
            accumulate=accumulate if accumulate is not None else (8 if 8 in default_workers(8) else 4),
        )
        counts = _counts(workers) if workers else default_workers(cfg.accumulate)
        with tempfile.TemporaryDirectory(prefix="vgame-scale-") as tmp:
            where = workdir or Path(tmp)
            if json_out:
                report = measure_scale(cfg, counts, where, profile=profile, repeats=repeats)
            else:
                with console.status("measuring") as status:
                    report = measure_scale(
                        cfg,
                        counts,
                        where,
                        profile=profile,
                        repeats=repeats,
                        progress=lambda m: status.update(m),
                    )
    except VGameError as exc:
        raise fail(exc) from None
    if json_out:
        emit_json(report.to_dict())
    else:
        _print(report)
    if not report.same_roots:
        raise typer.Exit(1)


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--workers: comma-separated worker counts, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ConfigError(f"--workers: worker counts of 1 or more, got {text!r}")
    return sorted(set(counts))


def _print(report: ScaleReport) -> None:
    from rich.table import Table

    table = Table(
        title=f"{report.task} on {report.profile}: {report.steps} steps of {report.accumulate} micro-batches "
        f"(batch {report.batch_size}), {report.cpus} CPUs",
        title_justify="left",
        caption="steps a second from the end of a run's first step to its last, on the trainer's clock; "
        "launch: a whole run's wall time (processes started, first step, transcript finished)",
        caption_justify="left",
    )
    for col in ("mode", "workers", "steps/s", "speed-up", "launch s"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for row in report.rows:
        table.add_row(
            row.mode,
            str(row.workers),
            f"{row.steps_per_second:.1f}",
            f"{row.speedup:.2f}x",
            f"{row.launch_seconds:.1f}",
        )
    console.print(table)
    if report.same_roots:
        console.print(f"[green]every run committed state root[/] {report.state_roots[0]}")
    else:
        console.print("[red]the runs committed different state roots[/]: " + ", ".join(report.state_roots))
