"""The recovery part of `vgame bench scale`: what each parameter-server mode loses per failure, and
held-out accuracy against wall time through one and then two kills (the seed's figures 4 and 5).

Each mode (:data:`~game.training.ps.driver.MODES`) trains the task afresh with no kill, one and two
(the server SIGKILLed at seeded points, :func:`~game.training.ps.faults.plan_kills`), on one set of
Ray actors kept for every run (so no run pays for starting them). A run's clock starts when every
process is up and warm. The time lost per failure is ``(wall with k kills - wall with none) / k``,
the mean over k = 1 and 2; the updates lost are those its failovers cut from the lineage (a
synchronous mode computes them again, to the same leaves; an asynchronous one lists them in the
next chunk). Every ``eval_every`` updates a run keeps its state, lost ones too (they were the
model at that moment), and the curve is the task's metric on its held-out data for each. The
synchronous modes' transcripts are held to the one-process roots, the asynchronous ones' audited
on one process, so the figure is of runs that verify.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from game.errors import ConfigError
from game.training.task.config import TaskConfig

#: Where the curve's points come from: the task's metric named so, else its loss.
METRIC = "accuracy"


@dataclass(frozen=True)
class RecoveryRun:
    """One run of one mode."""

    mode: str
    kills: int
    wall_s: float
    updates_lost: int
    kill_times: list[float]
    recovered_times: list[float]  # when each failover was done (none for the stateless server)
    curve: list[tuple[float, int, float]]  # (t, update, metric)
    state_root: str
    audited: bool  # its one-process audit (or, synchronous, its roots against one process) matched


@dataclass(frozen=True)
class RecoveryRow:
    """One mode: its walls without and with kills, and what a failure costs."""

    mode: str
    workers: int
    steps_per_second: float  # updates a second without a kill
    walls: dict[int, float]  # kills -> wall seconds
    lost_s_per_failure: float
    updates_lost_per_failure: float


@dataclass(frozen=True)
class RecoveryReport:
    task: str
    steps: int
    accumulate: int
    max_staleness: int
    workers: int
    seed: int
    metric: str
    rows: list[RecoveryRow]
    runs: list[RecoveryRun] = field(default_factory=list)

    @property
    def all_verified(self) -> bool:
        return all(r.audited for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RecoveryReport:
        rows = [
            RecoveryRow(**{**r, "walls": {int(k): v for k, v in r["walls"].items()}}) for r in doc["rows"]
        ]
        runs = [RecoveryRun(**{**r, "curve": [tuple(p) for p in r["curve"]]}) for r in doc["runs"]]
        return cls(**{**doc, "rows": rows, "runs": runs})


def measure_recovery(
    cfg: TaskConfig,
    modes: Sequence[str],
    workdir: Path,
    *,
    workers: int = 2,
    max_staleness: int = 4,
    kills: Sequence[int] = (0, 1, 2),
    seed: int = 0,
    eval_every: int = 5,
    profile: str = "cpu-1t",
    progress: Callable[[str], None] | None = None,
    cluster: Any = None,
) -> RecoveryReport:
    """Run every mode of ``modes`` with each count of ``kills`` (see the module docstring), on
    ``cluster``'s actors (a :class:`~game.training.ps.cluster.PsCluster`; None: a new one)."""
    from game.training.engine.audit import audit
    from game.training.engine.train import train
    from game.training.ps.cluster import PsCluster, ray_session
    from game.training.ps.driver import MODES, PsOptions, train_ps
    from game.training.ps.faults import plan_kills

    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ConfigError(f"--ps: {', '.join(unknown)} not among the modes {', '.join(MODES)}")
    if 0 not in kills:
        raise ConfigError("kills: the runs with kills are compared with one without")
    sync_cfg = cfg.replace(max_staleness=0)
    async_cfg = cfg.replace(max_staleness=max_staleness)
    reference = train(sync_cfg, profile, workdir / "one-process").state_root.hex()
    runs: list[RecoveryRun] = []
    with ray_session(), contextlib.ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(contextlib.closing(PsCluster()))
        for mode in modes:
            asynchronous = MODES[mode][0]
            task = async_cfg if asynchronous else sync_cfg
            for k in kills:
                if progress is not None:
                    progress(f"{mode}: {k} kill{'s' if k != 1 else ''}")
                out = workdir / f"{mode}-k{k}"
                shutil.rmtree(out, ignore_errors=True)
                plan = tuple(plan_kills(seed + k, k, cfg.steps)) if k else ()
                opts = PsOptions(mode=mode, workers=workers, kills=plan, keep_every=eval_every)
                result = train_ps(task, profile, out, opts, cluster=cluster)
                root = result.transcript.manifest.state_root or ""
                verified = root == reference if not asynchronous else audit(out, profile).match
                runs.append(
                    RecoveryRun(
                        mode=mode,
                        kills=k,
                        wall_s=result.wall_s,
                        updates_lost=len(result.lost) if asynchronous else _recomputed(result),
                        kill_times=[e.t for e in result.events if e.kind == "kill"],
                        recovered_times=[e.t for e in result.events if e.kind == "failover"],
                        curve=_curve(task, result.kept),
                        state_root=root,
                        audited=verified,
                    )
                )
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(out.parent / f"{out.name}.ps", ignore_errors=True)
    rows = [_row(mode, workers, cfg.steps, [r for r in runs if r.mode == mode]) for mode in modes]
    metric = METRIC if runs and runs[0].curve and _has_metric(cfg) else "loss"
    return RecoveryReport(
        cfg.task, cfg.steps, cfg.accumulate, max_staleness, workers, seed, metric, rows, runs
    )


def _recomputed(result: Any) -> int:
    """Updates a synchronous run computed again after its failovers (the lineage's lost ones)."""
    return sum(1 for e in result.events if e.kind == "update") - result.transcript.steps


def _has_metric(cfg: TaskConfig) -> bool:
    from game.training.engine.runtime import runtime_for

    return runtime_for(cfg).task.metrics is not None


def _curve(cfg: TaskConfig, kept: list[tuple[float, int, bytes]]) -> list[tuple[float, int, float]]:
    """The task's held-out metric (accuracy, else loss) of each kept state."""
    from game.training.engine.runtime import runtime_for
    from game.training.engine.states import decode_state

    runtime = runtime_for(cfg)
    if not runtime.has_eval:
        return []
    out: list[tuple[float, int, float]] = []
    for t, update, data in kept:
        metrics = runtime.evaluate(decode_state(data, cfg).model)
        out.append((round(t, 4), update, float(metrics.get(METRIC, metrics.get("loss", 0.0)))))
    return out


def _row(mode: str, workers: int, steps: int, runs: list[RecoveryRun]) -> RecoveryRow:
    walls = {r.kills: r.wall_s for r in runs}
    base = walls[0]
    killed = [r for r in runs if r.kills]
    lost_s = statistics.mean((r.wall_s - base) / r.kills for r in killed) if killed else 0.0
    lost_u = statistics.mean(r.updates_lost / r.kills for r in killed) if killed else 0.0
    return RecoveryRow(mode, workers, steps / base, walls, round(lost_s, 3), round(lost_u, 2))


def save_report(report: RecoveryReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_dict(), indent=1) + "\n", "utf-8")


def draw_recovery(report: RecoveryReport, out: Path) -> None:
    """A panel per kill count (one, two): the metric of each mode's kept states against wall time,
    each kill a dotted line in its mode's colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r.kills for r in report.runs if r.kills})
    fig, axes = plt.subplots(1, len(counts), figsize=(6.5 * len(counts), 4.6), dpi=120, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, k in zip(axes[0], counts, strict=True):
        for i, row in enumerate(report.rows):
            run = next((r for r in report.runs if r.mode == row.mode and r.kills == k), None)
            if run is None or not run.curve:
                continue
            color = colors[i % len(colors)]
            ts, _, values = zip(*run.curve, strict=True)
            label = f"{row.mode} ({row.lost_s_per_failure:.1f} s lost/failure)"
            # steps: a state is the model until the next one (a failover's is the state it went back to)
            ax.plot(ts, values, color=color, label=label, drawstyle="steps-post", linewidth=1.3)
            for t in run.kill_times:
                ax.axvline(t, color=color, linestyle=":", linewidth=1)
        times = {1: "once", 2: "twice"}.get(k, f"{k} times")
        ax.set_title(f"{report.task}: the server killed {times}", loc="left")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel(f"held-out {report.metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right" if report.metric == METRIC else "upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


__all__ = [
    "RecoveryReport",
    "RecoveryRow",
    "RecoveryRun",
    "draw_recovery",
    "measure_recovery",
    "save_report",
]
