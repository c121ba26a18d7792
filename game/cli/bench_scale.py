"""``vgame bench scale``: steps a second on 1, 2, 4 (8) workers side by side, and the roots they
commit, as a table or JSON; with ``--ps``, the parameter-server modes too: what each loses per
failure, and held-out accuracy against wall time through one and two kills (``--plot``)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from game.cli.app import bench_app, console, emit_json, fail
from game.cli.options import (
    AccumulateOpt,
    BatchSizeOpt,
    JsonOpt,
    LrOpt,
    ModelOpt,
    PresetOpt,
    check_profile,
    parse_model_overrides,
    task_config,
)
from game.errors import ConfigError, VGameError

if TYPE_CHECKING:  # torch loads only when the command runs
    from game.bench.recovery import RecoveryReport
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
    lr: LrOpt = None,
    profile: Annotated[
        str, typer.Option("--profile", help="Hardware profile of every worker (cpu-1t: one thread each).")
    ] = "cpu-1t",
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="Where the runs' transcripts go (default: a temp dir).")
    ] = None,
    ps: Annotated[
        str | None,
        typer.Option(
            "--ps",
            help="Parameter-server modes to run through kills too, comma-separated, or all: "
            "sync, async, sync-chain, async-chain, stateless.",
        ),
    ] = None,
    kills: Annotated[
        int, typer.Option("--kills", min=1, help="With --ps: runs with 0, 1, .. this many server kills.")
    ] = 2,
    kill_seed: Annotated[
        int, typer.Option("--kill-seed", help="With --ps: the seed of the kill points.")
    ] = 0,
    max_staleness: Annotated[
        int, typer.Option("--max-staleness", min=1, help="With --ps: the asynchronous modes' task's.")
    ] = 4,
    ps_workers: Annotated[int, typer.Option("--ps-workers", min=1, help="With --ps: workers a run.")] = 2,
    eval_every: Annotated[
        int,
        typer.Option("--eval-every", min=1, help="With --ps: the curve's held-out point every N updates."),
    ] = 5,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="With --ps: draw the recovery figure here (PNG, SVG, PDF).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Train one task afresh on each worker count; report steps a second, the speed-up over one
    process, and whether every run committed the same roots (exit 1 when not). With --ps, also
    each parameter-server mode without a kill and with 1..--kills server kills: the time and the
    updates a failure costs, whether every run verified (exit 1 when not), and the figure."""
    from game.bench.scale import default_workers, measure_scale

    try:
        check_profile(profile)
        cfg = task_config(
            preset,
            config,
            steps=steps,
            model=parse_model_overrides(model),
            batch_size=batch_size,
            lr=lr,
            accumulate=accumulate if accumulate is not None else (8 if 8 in default_workers(8) else 4),
        )
        counts = _counts(workers) if workers else default_workers(cfg.accumulate)
        with tempfile.TemporaryDirectory(prefix="vgame-scale-") as tmp:
            where = workdir or Path(tmp)
            modes = _modes(ps)
            recovery: RecoveryReport | None = None
            with contextlib.nullcontext(None) if json_out else console.status("measuring") as status:
                say = None if status is None else (lambda m: status.update(m))
                report = measure_scale(cfg, counts, where, profile=profile, repeats=repeats, progress=say)
                if modes:
                    from game.bench.recovery import draw_recovery, measure_recovery

                    recovery = measure_recovery(
                        cfg,
                        modes,
                        where / "ps",
                        workers=ps_workers,
                        max_staleness=max_staleness,
                        kills=range(kills + 1),
                        seed=kill_seed,
                        eval_every=eval_every,
                        profile=profile,
                        progress=say,
                    )
                    if plot is not None:
                        draw_recovery(recovery, plot)
    except VGameError as exc:
        raise fail(exc) from None
    if json_out:
        emit_json({**report.to_dict(), **({"recovery": recovery.to_dict()} if recovery else {})})
    else:
        _print(report)
        if recovery is not None:
            _print_recovery(recovery, report, plot)
    if not report.same_roots or (recovery is not None and not recovery.all_verified):
        raise typer.Exit(1)


#: The parameter-server modes (``game.training.ps.driver.MODES``, which imports Ray: not here).
PS_MODES = ("sync", "async", "sync-chain", "async-chain", "stateless")


def _modes(text: str | None) -> list[str]:
    if not text:
        return []
    names = list(PS_MODES)
    chosen = names if text.strip() == "all" else [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in chosen if m not in names]
    if bad:
        raise ConfigError(f"--ps: {', '.join(bad)} not among {', '.join(names)} (or all)")
    return chosen


def _print_recovery(rec: RecoveryReport, scale: ScaleReport, plot: Path | None) -> None:
    from rich.table import Table

    one = next((r.steps_per_second for r in scale.rows if r.workers == 1), None)
    counts = sorted({r.kills for r in rec.runs})
    table = Table(
        title=f"parameter servers: {rec.task}, {rec.steps} updates of {rec.accumulate} micro-batches, "
        f"{rec.workers} workers, async max_staleness {rec.max_staleness}, kills seeded {rec.seed}",
        title_justify="left",
        caption="wall: a run from every process up and warm to its transcript finished; lost/failure: "
        "(wall with k kills - wall with none) / k; updates lost: cut from the lineage by a failover",
        caption_justify="left",
    )
    for col in ["mode", "updates/s", "vs one process", *[f"wall, {k} kills" for k in counts]]:
        table.add_column(col, justify="left" if col == "mode" else "right")
    table.add_column("s lost/failure", justify="right")
    table.add_column("updates lost/failure", justify="right")
    table.add_column("verified", justify="right")
    for row in rec.rows:
        ok = all(r.audited for r in rec.runs if r.mode == row.mode)
        table.add_row(
            row.mode,
            f"{row.steps_per_second:.1f}",
            f"{row.steps_per_second / one:.2f}x" if one else "-",
            *[f"{row.walls[k]:.1f}" for k in counts],
            f"{row.lost_s_per_failure:.2f}",
            f"{row.updates_lost_per_failure:.1f}",
            "[green]yes[/]" if ok else "[red]NO[/]",
        )
    console.print(table)
    if plot is not None:
        console.print(f"figure: {plot}")


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
