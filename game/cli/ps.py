"""``vgame ps train``: train a task with one of the seed's parameter-server modes on Ray, killing the
server or a worker where told, into a transcript that ``vgame audit`` replays on one process."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from game.cli.app import app, bar_progress, console, emit_json
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
from game.errors import ConfigError

ps_app = typer.Typer(
    help="Parameter servers on Ray (the seed's modes): train through server and worker kills.",
    no_args_is_help=True,
)
app.add_typer(ps_app, name="ps")

#: The modes (``game.training.ps.driver.MODES``, which imports Ray: named here for the help).
MODES_HELP = (
    "sync | async (a server restarting from its checkpoint), sync-chain | async-chain (a backup takes "
    "over with the last replicated state), stateless (each update a Ray task; workers go on meanwhile)"
)


@ps_app.command("train")
def ps_train(
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Transcript directory: a new one, or one whose run died (the run goes on from it)."
        ),
    ],
    mode: Annotated[str, typer.Option("--mode", help=MODES_HELP)] = "sync",
    workers: Annotated[int, typer.Option("--workers", min=1, help="Worker actors.")] = 2,
    preset: PresetOpt = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML task config (a preset's or your own task's).")
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Updates (training steps) S.")] = None,
    model: ModelOpt = None,
    batch_size: BatchSizeOpt = None,
    accumulate: AccumulateOpt = None,
    lr: LrOpt = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Task seed.")] = None,
    max_staleness: Annotated[
        int | None,
        typer.Option(
            "--max-staleness",
            min=0,
            help="How many states back an asynchronous update may compute on (in the spec; the "
            "asynchronous modes need it above 0).",
        ),
    ] = None,
    kill_at: Annotated[
        list[str] | None,
        typer.Option(
            "--kill-at",
            help="SIGKILL a process after update N (MS ms later with +MS): server@N, workerK@N (worker K), "
            "or N, the server (repeatable).",
        ),
    ] = None,
    kills: Annotated[
        int, typer.Option("--kills", min=0, help="Kills at seeded random points (with --kill-seed).")
    ] = 0,
    kill_seed: Annotated[int, typer.Option("--kill-seed", help="The seed of --kills.")] = 0,
    kill_target: Annotated[
        str, typer.Option("--kill-target", help="What --kills kills: server or worker.")
    ] = "server",
    every: Annotated[
        int,
        typer.Option(
            "--every", min=0, help="The server keeps a checkpoint / replicates every N updates (0: k)."
        ),
    ] = 0,
    servers: Annotated[
        int,
        typer.Option("--servers", min=2, help="Servers in a replication chain (--chain names a blockchain)."),
    ] = 3,
    profile: Annotated[
        str, typer.Option("--profile", help="Hardware profile of every process (see `vgame profiles`).")
    ] = "cpu-1t",
    as_json: JsonOpt = False,
) -> None:
    """Train with a parameter server on a local Ray instance; every update is recorded under
    vgame's rounding, an asynchronous one with its schedule in its chunk, so `vgame audit` replays
    the transcript bit for bit on one process."""
    from game.training.ps.faults import parse_kill, plan_kills

    cfg = task_config(
        preset,
        config,
        steps=steps,
        seed=seed,
        model=parse_model_overrides(model),
        batch_size=batch_size,
        accumulate=accumulate,
        lr=lr,
    )
    if max_staleness is not None:
        cfg = cfg.replace(max_staleness=max_staleness)
    check_profile(profile)
    if kill_target not in ("server", "worker"):
        raise ConfigError(f"--kill-target: server or worker, not {kill_target!r}")
    plan = [parse_kill(text, workers) for text in kill_at or []]
    if kills:
        plan += plan_kills(kill_seed, kills, cfg.steps, target=kill_target, workers=workers)  # type: ignore[arg-type]
    plan.sort(key=lambda k: k.after)

    from game.training.ps.options import PsOptions, check_run

    opts = PsOptions(mode=mode, workers=workers, kills=tuple(plan), every=every, chain=servers)
    check_run(cfg, opts, out)  # before Ray's start-up: a wrong mode or --out is one line at once

    from game.training.ps.cluster import ray_session
    from game.training.ps.driver import train_ps

    with (
        ray_session(),
        bar_progress(f"{mode} parameter server, {workers} workers: {cfg.preset}", as_json) as bar,
    ):
        search = (config.resolve().parent,) if config is not None else ()
        result = train_ps(cfg, profile, out, opts, progress=bar, search=search)
    doc: dict[str, Any] = {**result.to_dict(), "spec_hash": result.transcript.spec_hash.hex()}
    if as_json:
        emit_json(doc)
        return
    console.print(f"[bold green]trained[/] {cfg.preset}: {cfg.steps} updates, {mode}, {workers} workers")
    if result.resumed_from is not None:
        console.print(f"  went on from update {result.resumed_from}, where the run that died had got to")
    for e in result.events:
        if e.kind != "update":
            console.print(f"  {e.t:8.3f} s  {e.kind:<11} {e.detail}")
    console.print(f"  transcript  {out}")
    console.print(f"  spec hash   {doc['spec_hash']}")
    console.print(f"  state root  {doc['state_root']}")
    console.print(f"  log root    {doc['log_root']}")
    console.print(f"  wall        {result.wall_s:.2f} s; {len(result.lost)} update(s) lost to failovers")
    console.print(f"  audit it:   vgame audit --transcript {out} --profile cpu-2t")


__all__ = ["ps_app"]
