"""``vgame profiles | train | audit | replay-step | divergence``: the training core from the shell.

Torch is imported inside the commands (through ``game.training.engine``) so ``vgame --help`` and the
chain commands stay fast. Every command prints for people by default and one JSON document with
``--json``. Bad input raises :class:`~game.errors.ConfigError` or :class:`~game.errors.TranscriptError`,
which ``game.cli.main`` prints as one line with exit code 2.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from game.cli.app import app, bar_progress, console, emit_json, interrupts, progress_bar
from game.cli.options import (
    AccumulateOpt,
    BandsOpt,
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
from game.fsio import exclusive_directory
from game.training.engine.auditprogress import DEFAULT_EVERY_S

if TYPE_CHECKING:
    from game.training.engine.audit import AuditResult
    from game.training.engine.divergence import DivergenceResult

ProgressFn = Callable[[int, int], None]


# ----------------------------------------------------------------------------------------------
# profiles
# ----------------------------------------------------------------------------------------------


@app.command("profiles")
def profiles_cmd(as_json: JsonOpt = False) -> None:
    """List the hardware profiles a trainer, auditor or judge can run on."""
    from game.training.dispatch.profiles import list_profiles
    from game.training.transcript import stepwriter

    rows = [_profile_row(p) for p in list_profiles()]
    writer = stepwriter.describe()
    if as_json:
        emit_json({"profiles": rows, "transcript_writer": writer})
        return
    table = Table(title="hardware profiles")
    table.add_column("name", style="bold")
    table.add_column("available")
    table.add_column("rounding kernels")
    table.add_column("interceptor")
    table.add_column("description")
    for row in rows:
        table.add_row(
            row["name"],
            "yes" if row["available"] else "no",
            row["rounding_kernels"],
            row["interceptor"],
            row["description"],
        )
    console.print(table)
    console.print(f"transcript writer (compression, hashes, files): {writer}")


def _profile_row(profile: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": str(profile["name"]),
        "available": bool(profile["available"]),
        "rounding_kernels": str(profile["rounding_kernels"]),
        "interceptor": str(profile["interceptor"]),
        "description": str(profile["description"]),
    }


# ----------------------------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------------------------


@app.command("train")
def train_cmd(
    out: Annotated[
        Path, typer.Option("--out", help="Transcript directory (resumed if it holds a partial run).")
    ],
    preset: PresetOpt = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML task config (a preset's or your own task's).")
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Training steps S.")] = None,
    profile: Annotated[
        str, typer.Option("--profile", help="Hardware profile (see `vgame profiles`).")
    ] = "cpu-1t",
    model: ModelOpt = None,
    batch_size: BatchSizeOpt = None,
    accumulate: AccumulateOpt = None,
    lr: LrOpt = None,
    eval_every: Annotated[
        int,
        typer.Option(
            "--eval-every",
            min=0,
            help="Evaluate on the task's held-out data every N steps (0: never); tasks without one skip it.",
        ),
    ] = 0,
    seed: Annotated[int | None, typer.Option("--seed", help="Task seed.")] = None,
    bits: Annotated[int | None, typer.Option("--bits", help="Rounding grid bits, 16..32.")] = None,
    tau: Annotated[
        float | None, typer.Option("--tau", help="Log threshold, a fraction of the grid ulp.")
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format", help="sparse (in-band values only, the default) or packed (a trit per value)."
        ),
    ] = None,
    bands: BandsOpt = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="Local worker processes (torchrun) sharing each step's micro-batches; must divide the "
            "task's accumulate. The roots and log are those of one process.",
        ),
    ] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Train as the trainer (Algorithm 2): write the transcript (leaves, log chunks, checkpoints, roots),
    showing the loss as it goes and, with --eval-every, the task's held-out metrics. With --workers W,
    W processes compute each step's micro-batches at once (synchronous data parallel)."""
    cfg = task_config(
        preset,
        config,
        steps=steps,
        seed=seed,
        bits=bits,
        tau=tau,
        log_format=log_format,
        bands=bands,
        model=parse_model_overrides(model),
        batch_size=batch_size,
        lr=lr,
        accumulate=accumulate,
    )
    check_profile(profile)
    from game.errors import StepWriteError
    from game.training.engine.train import train
    from game.training.transcript.reader import steps_on_disk

    evals: list[dict[str, Any]] = []
    if workers > 1:
        from game.training.parallel.dataparallel import check_workers

        check_workers(cfg, workers)  # before torchrun starts
    try:
        with _training_progress(f"train {cfg.preset} on {profile}", as_json) as (update, show):
            if workers > 1:
                from game.training.parallel.launch import launch

                search = (config.resolve().parent,) if config is not None else ()
                launched = launch(
                    cfg, profile, out, workers, search=search, eval_every=eval_every, progress=update
                )
                result = launched.result
                evals = launched.evals
                for row in evals:
                    show(
                        f"step {row['step']:>6}  "
                        + "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k != "step")
                    )
            else:
                observe = _observer(cfg, eval_every, evals, show)
                result = train(cfg, profile, out, progress=update, observe=observe)
    except StepWriteError as exc:  # the steps before it are kept: say so, and how to go on
        done = steps_on_disk(out)
        raise StepWriteError(
            f"{exc}. {done} of {cfg.steps + 1} steps (0..{cfg.steps}) are complete in {out}; once the "
            "cause is fixed (disk space, permissions), run the same command to go on from there",
            exc.step,
        ) from exc
    except KeyboardInterrupt:  # the steps already computed were written on the way out
        done = steps_on_disk(out)
        interrupts.say(
            f"[yellow]interrupted:[/] {done} of {cfg.steps + 1} steps (0..{cfg.steps}) are complete in {out}; "
            "run the same command to go on from there"
        )
        raise
    doc = result.to_dict()
    if as_json:
        emit_json({**doc, "workers": workers, "evals": evals})
        return
    if result.resumed_from == result.steps:
        console.print(
            f"[bold green]already trained[/] {cfg.preset}: all {result.steps} steps were on disk; none run"
        )
    else:
        on = f" on {workers} workers" if workers > 1 else ""
        console.print(
            f"[bold green]trained[/] {cfg.preset}: {result.steps} steps on profile {result.profile}{on}"
        )
        if result.resumed_from is not None:
            console.print(f"  resumed after step {result.resumed_from}")
    console.print(f"  transcript  {result.out_dir}")
    console.print(f"  spec hash   {doc['spec_hash']}")
    console.print(f"  state root  {doc['state_root']}")
    console.print(f"  log root    {doc['log_root']}")
    console.print(f"  log size    {doc['log_bytes']} bytes")


@contextmanager
def _training_progress(label: str, quiet: bool) -> Iterator[tuple[ProgressFn | None, Callable[[str], None]]]:
    """The training bar, and a way to show a line above it (an evaluation) or nothing (``--json``)."""
    if quiet:
        yield None, lambda line: None
        return
    with progress_bar() as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        def show(line: str) -> None:
            if line.startswith("loss "):
                bar.update(task, description=f"{label}  {line}")
            else:
                bar.console.print(line)

        yield update, show


def _observer(
    cfg: Any, eval_every: int, evals: list[dict[str, Any]], show: Callable[[str], None]
) -> Callable[[int, float | None, Any], None]:
    """What `vgame train` does after each step: the loss on the bar (and the learning rate, where
    the task has a scheduler), a line where a scheduler stepped with the loss (ReduceLROnPlateau)
    has cut the learning rate, and the task's held-out metrics every ``eval_every`` steps (kept in
    ``evals`` for --json)."""
    from game.training.engine.runtime import runtime_for
    from game.training.state.schedstate import takes_metric

    runtime = runtime_for(cfg)
    if eval_every and not runtime.has_eval:
        show(f"[yellow]--eval-every:[/] task {cfg.preset} has no eval_dataset; nothing to evaluate")
        eval_every = 0

    seen: list[float] = []  # the learning rates after the step before

    def observe(step: int, loss: float | None, state: Any) -> None:
        lrs = [float(g["lr"]) for g in state.optimizer.param_groups] if state.scheduler is not None else []
        if loss is not None:
            show(f"loss {loss:.4f}" + (f"  lr {lrs[0]:.3g}" if lrs else ""))
        if seen and lrs != seen and takes_metric(state.scheduler):
            show(f"step {step:>6}  {type(state.scheduler).__name__} cut the learning rate to {lrs[0]:.3g}")
        seen[:] = lrs
        if eval_every and (step % eval_every == 0 or step == cfg.steps):
            metrics = runtime.evaluate(state.model)
            evals.append({"step": step, **metrics})
            show(f"step {step:>6}  " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))

    return observe


# ----------------------------------------------------------------------------------------------
# audit
# ----------------------------------------------------------------------------------------------


@app.command("audit")
def audit_cmd(
    transcript: Annotated[Path, typer.Option("--transcript", help="The trainer's transcript directory.")],
    profile: Annotated[str, typer.Option("--profile", help="The auditor's hardware profile.")],
    no_log: Annotated[
        bool, typer.Option("--no-log", help="Ignore the trainer's rounding log (shows why it is needed).")
    ] = False,
    keep_progress: Annotated[
        Path | None,
        typer.Option(
            "--keep-progress",
            help="Save the replay's progress in this directory; run again, the same command goes on from "
            "the last save (for audits of hours).",
        ),
    ] = None,
    save_every: Annotated[
        float | None,
        typer.Option(
            "--save-every",
            min=0.0,
            show_default=str(DEFAULT_EVERY_S),
            help="Seconds between saves, with --keep-progress (refused without it).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-train as the auditor (Algorithm 3) and compare state roots; exit code 1 on a mismatch."""
    if save_every is not None and keep_progress is None:
        raise ConfigError("--save-every does nothing without --keep-progress DIR, where the saves go")
    check_profile(profile)
    with ExitStack() as held:
        if keep_progress is not None:
            if keep_progress.resolve().is_relative_to(transcript.resolve()):
                raise ConfigError(
                    f"--keep-progress {keep_progress} lies inside the transcript {transcript}, which is the "
                    "trainer's to write and publish: give the audit a directory of its own"
                )
            keep_progress.mkdir(parents=True, exist_ok=True)
            busy = f"{keep_progress} is in use by another `vgame audit`; let it finish, or give this one another directory"
            held.enter_context(exclusive_directory(keep_progress, busy))
        every = DEFAULT_EVERY_S if save_every is None else save_every
        result = _audit_with_progress(transcript, profile, not no_log, keep_progress, every, as_json)
    doc = result.to_dict()
    if as_json:
        emit_json(doc)
        if not result.match:
            raise typer.Exit(1)
        return
    if result.resumed_from is not None:
        console.print(f"went on from step {result.resumed_from}, saved in {keep_progress}")
    if result.match:
        console.print(f"[bold green]match[/]: {result.steps} steps replayed on {profile}")
        console.print(f"  state root   {doc['auditor_state_root']}")
        console.print(
            f"  corrections  {result.corrections} (values rounded to the side the trainer logged, not the side this machine computed)"
        )
    else:
        console.print(f"[bold red]MISMATCH[/]: first divergent step {result.first_divergent_step}")
        console.print(f"  trainer root  {doc['trainer_state_root']}")
        console.print(f"  auditor root  {doc['auditor_state_root']}")
    for msg in result.log_errors:
        console.print(f"  [bold red]rejected log[/] {msg}")
    if not result.match:
        raise typer.Exit(1)


def _audit_with_progress(
    transcript: Path, profile: str, use_log: bool, keep: Path | None, every: float, as_json: bool
) -> AuditResult:
    """The audit under a progress bar; on Ctrl-C, say how far it got and what is kept."""
    from game.training.engine.audit import audit

    replayed = [0, 0]  # steps done, of how many: for the message if it is interrupted
    with bar_progress(f"audit on {profile}", as_json) as update:

        def track(done: int, total: int) -> None:
            replayed[:] = [done, total]
            if update is not None:
                update(done, total)

        try:
            result = audit(
                transcript, profile, use_log=use_log, progress=track, keep_progress=keep, save_every_s=every
            )
        except KeyboardInterrupt:
            done, total = replayed
            how_far = f"{done} of {total} steps replayed" if total else "no step replayed yet"
            then = (
                "an audit without --keep-progress keeps nothing, so run it again to start over"
                if keep is None
                else f"run the same command to go on from the last save in {keep}"
            )
            interrupts.say(f"[yellow]interrupted:[/] {how_far}; {then}")
            raise
    return result


# ----------------------------------------------------------------------------------------------
# replay-step
# ----------------------------------------------------------------------------------------------


@app.command("replay-step")
def replay_step_cmd(
    transcript: Annotated[Path, typer.Option("--transcript", help="The trainer's transcript directory.")],
    step: Annotated[int, typer.Option("--step", help="The step j to re-run from the state at j-1.")],
    profile: Annotated[str, typer.Option("--profile", help="Hardware profile to re-run it on.")],
    as_json: JsonOpt = False,
) -> None:
    """Re-run one step with its log chunk as the judge does, and compare with the trainer's leaf.

    A chunk the judge rules against (it breaks the bands, does not decode or does not fit) gives
    the hash the judge posts for it, and the reason."""
    check_profile(profile)
    from game.judgeupdate import judged_step

    result = judged_step(transcript, step, profile)
    doc = result.to_dict()
    if as_json:
        emit_json(doc)
        return
    verdict = "[bold green]matches[/]" if result.matches_transcript else "[bold red]differs from[/]"
    console.print(f"step {result.step}: state hash {doc['state_hash']}", soft_wrap=True)
    if result.rejected:
        console.print(f"  the judge rules against the trainer's chunk: {result.rejected}", soft_wrap=True)
    console.print(f"  {verdict} the transcript's leaf {result.step}")


# ----------------------------------------------------------------------------------------------
# divergence
# ----------------------------------------------------------------------------------------------


@app.command("divergence")
def divergence_cmd(
    preset: Annotated[str, typer.Option("--preset", help="Task preset.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for divergence.png and divergence.json.")],
    steps: Annotated[int, typer.Option("--steps", help="Steps to train each pair for.")] = 20,
    trainer_profile: Annotated[
        str, typer.Option("--trainer-profile", help="The trainer's hardware profile (records the log).")
    ] = "cpu-1t",
    auditor_profile: Annotated[
        str, typer.Option("--auditor-profile", help="The auditor's hardware profile (replays the run).")
    ] = "noisy",
    seed: Annotated[int | None, typer.Option("--seed", help="Task seed.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Weight distance between two profiles per step: fp32, fp64+rounding without and with the log."""
    cfg = task_config(preset, steps=steps, seed=seed)
    check_profile(trainer_profile)
    check_profile(auditor_profile)
    out.mkdir(parents=True, exist_ok=True)  # before the training, which may take minutes
    from game.training.engine.divergence import divergence

    with bar_progress(f"divergence {trainer_profile} vs {auditor_profile}", as_json) as update:
        result = divergence(cfg, steps, trainer_profile, auditor_profile, progress=update)
    doc = result.to_dict()
    (out / "divergence.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot_divergence(result, out / "divergence.png")
    doc = {**doc, "png": str(out / "divergence.png"), "json": str(out / "divergence.json")}
    if as_json:
        emit_json(doc)
        return
    table = Table(title=f"L2 weight distance after {steps} steps ({trainer_profile} vs {auditor_profile})")
    table.add_column("series")
    table.add_column("final distance", justify="right")
    for name, values in result.series.items():
        table.add_row(name, f"{values[-1]:.3e}")
    console.print(table)
    console.print(f"wrote {doc['png']} and {doc['json']}")


def plot_divergence(result: DivergenceResult, path: Path) -> None:
    """Log-scale plot of the three series (paper Figure 5); exact zeros sit on a marked floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    positive = [v for values in result.series.values() for v in values if v > 0]
    floor = 10 ** math.floor(math.log10(min(positive))) / 10 if positive else 1e-12
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"fp32": "-o", "fp64+rounding, no log": "-s", "fp64+rounding, with log": "-^"}
    steps = list(range(len(next(iter(result.series.values())))))
    for name, values in result.series.items():
        zero = all(v == 0 for v in values)
        label = f"{name} (identical: 0 at every step)" if zero else name
        ax.plot(steps, [max(v, floor) for v in values], styles.get(name, "-"), label=label, markersize=3)
    ax.axhline(floor, color="grey", linewidth=0.6, linestyle=":")
    ax.text(
        steps[-1], floor, "exact 0 drawn on this line ", ha="right", va="bottom", fontsize=7, color="grey"
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("L2 distance of weights")
    ax.set_title(f"{result.preset}: {result.trainer_profile} vs {result.auditor_profile}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
