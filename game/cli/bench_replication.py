"""``vgame bench replication``: the cross-profile replication matrix of a preset, as a table or JSON."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from game.cli.app import bench_app, console, emit_json, fail
from game.cli.options import JsonOpt, check_profile
from game.errors import VGameError


@bench_app.command("replication")
def replication(
    preset: Annotated[str, typer.Option("--preset", help="Task preset, e.g. gpt-shakespeare.")],
    steps: Annotated[int, typer.Option("--steps", help="Training steps per run.")] = 50,
    profiles: Annotated[
        str, typer.Option("--profiles", help="Comma-separated profiles (default: all available).")
    ] = "",
    without_log: Annotated[
        bool, typer.Option("--without-log/--log-only", help="Also audit each pair without the log.")
    ] = True,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Keep the transcripts here (default: a temp dir).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Train on every profile and audit every ordered pair of distinct profiles; exit 1 on any mismatch."""
    from game.bench.replication import replication_matrix
    from game.training.dispatch.profiles import available_profiles
    from game.training.task.config import TaskConfig

    try:
        names = [p.strip() for p in profiles.split(",") if p.strip()] or [
            p.name for p in available_profiles()
        ]
        for n in names:
            check_profile(n)  # all of them now, not after the first has trained
        if len(names) < 2:
            raise fail("give at least two profiles")
        cfg = TaskConfig.for_preset(preset, steps=steps)
        with tempfile.TemporaryDirectory(prefix="vgame-replication-") as tmp:
            where = workdir or Path(tmp)
            if json_out:
                report = replication_matrix(cfg, names, where, without_log=without_log)
            else:
                with console.status("replication matrix") as status:
                    report = replication_matrix(
                        cfg, names, where, without_log=without_log, progress=lambda m: status.update(m)
                    )
    except VGameError as exc:
        raise fail(exc) from None
    if json_out:
        emit_json(report.to_dict())
    else:
        from rich.table import Table

        table = Table(title=f"{preset}, {steps} steps: auditor replays the trainer's transcript")
        for col in ("trainer", "auditor", "log", "match", "first divergent step", "corrections", "seconds"):
            table.add_column(col, justify="right" if col in ("corrections", "seconds") else "left")
        for p in report.pairs:
            table.add_row(
                p.trainer, p.auditor, "with" if p.use_log else "without",
                "[green]yes[/]" if p.match else "[red]no[/]",
                "" if p.first_divergent_step is None else str(p.first_divergent_step),
                f"{p.corrections:,}", f"{p.seconds:.1f}",
            )  # fmt: skip
        console.print(table)
        d = report.to_dict()
        console.print(
            f"with the log: {d['matches_with_log']}/{d['pairs_with_log']} pairs bit-exact; "
            f"without: {d['matches_without_log']}/{d['pairs_without_log']}"
        )
    if not report.all_match_with_log:
        raise typer.Exit(1)
