"""``vgame bench overhead``: per-step time of plain fp32/fp64 training, the trainer and the auditor."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from game.cli.app import bench_app, console, emit_json, fail
from game.cli.options import (
    BandsOpt,
    BatchSizeOpt,
    JsonOpt,
    ModelOpt,
    PresetOpt,
    parse_model_overrides,
    task_config,
)
from game.errors import VGameError

if TYPE_CHECKING:  # torch loads only when the command runs
    from game.bench.overhead import OverheadReport


@bench_app.command("overhead")
def overhead(
    preset: PresetOpt = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML task config (a preset's or your own task's).")
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps per repeat.")] = 5,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Fresh runs of all the variants.")] = 3,
    warmup: Annotated[
        int, typer.Option("--warmup", min=0, help="Untimed steps at the start of each repeat.")
    ] = 1,
    block: Annotated[
        int,
        typer.Option("--block", min=1, help="Consecutive steps of one variant before the next one's turn."),
    ] = 10,
    model: ModelOpt = None,
    batch_size: BatchSizeOpt = None,
    bands: BandsOpt = None,
    log_format: Annotated[
        str | None, typer.Option("--log-format", help="Trainer's log format: sparse (default) or packed.")
    ] = None,
    profile: Annotated[
        str,
        typer.Option("--profile", help="Hardware profile every variant runs on: cpu-1t, cpu-2t or cuda."),
    ] = "cpu-1t",
    split: Annotated[
        bool,
        typer.Option(
            "--split",
            help="Also time the trainer's thread with no writer behind it (record) and the auditor's "
            "replay with its logs in memory and no hasher (replay).",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Time plain fp32, plain fp64, the trainer and the auditor side by side; report medians and ratios."""
    from game.bench.overhead import measure_overhead

    try:
        cfg = task_config(
            preset,
            config,
            model=parse_model_overrides(model),
            batch_size=batch_size,
            bands=bands,
            log_format=log_format,
        )
        if json_out:
            report = measure_overhead(
                cfg, steps=steps, repeats=repeats, warmup=warmup, block=block, profile=profile, split=split
            )
        else:
            with console.status("measuring overhead") as status:
                report = measure_overhead(
                    cfg,
                    steps=steps,
                    repeats=repeats,
                    warmup=warmup,
                    block=block,
                    profile=profile,
                    split=split,
                    progress=lambda m: status.update(m),
                )
    except VGameError as exc:
        raise fail(exc) from None
    if json_out:
        emit_json(report.to_dict())
    else:
        _print(report)


def _print(report: OverheadReport) -> None:
    from rich.table import Table

    n = len(report.samples["trainer"])
    caption = (
        "trainer: rounding, log, state hash and transcript on disk; auditor: chunk read, checked and "
        "decoded, replay, state hash. step thread CPU: the CPU time of the thread that runs the steps; "
        "waits: wall time less that; other threads CPU: the rest of the process (the trainer's writer, "
        "the auditor's hasher)."
    )
    if "record" in report.medians:
        caption += (
            " trainer's thread alone: the trainer's rounding, log, state bytes and chunk payload, the "
            "step dropped where the writer would take it; auditor's replay alone: the replay from logs "
            "read before the clock starts, and the state bytes it would hash."
        )
    times = Table(
        title=f"{report.preset} on {report.profile}: median milliseconds per step ({n} timed blocks of up "
        f"to {report.block} steps, {report.steps} steps x {report.repeats} repeats, interleaved)",
        title_justify="left",
        caption=caption,
        caption_justify="left",
    )
    times.add_column("variant")
    for col in ("wall", "step thread CPU", "waits", "other threads CPU"):
        times.add_column(col, justify="right")
    labels = {
        "fp32": "plain float32",
        "fp64": "plain float64",
        "trainer": "trainer (record, hash, disk)",
        "auditor": "auditor (read, replay, hash)",
        "record": "trainer's thread alone (no writer)",
        "replay": "auditor's replay alone (log in memory, no hasher)",
    }
    cpu = report.cpu
    for v in report.medians:
        label = labels[v]
        figures = (report.medians[v], cpu["step_thread"][v], cpu["waits"][v], cpu["other_threads"][v])
        times.add_row(label, *(f"{1e3 * x:.2f}" for x in figures))
    console.print(times)

    ratios = Table(title="Ratios of the medians", title_justify="left")
    for col in ("ratio", "measured", "paper", "target", "status"):
        ratios.add_column(col, justify="left" if col == "ratio" else "right")
    targets = report.targets
    for name, r in report.ratios.items():
        t = targets.get(name)
        if t is None:
            ratios.add_row(name, f"{r:.2f}x", "", "", "")
            continue
        lo, hi = t["paper"]
        status = "[green]reached[/]" if t["reached"] else "[red]not reached[/]"
        ratios.add_row(name, f"{r:.2f}x", f"{lo:.2f}-{hi:.2f}x", f"<= {t['target']:.2f}x", status)
    console.print(ratios)
