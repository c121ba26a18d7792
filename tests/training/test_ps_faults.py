"""The parameter-server modes on Ray, killed with SIGKILL at seeded random points (issue 45, item 4).

Every mode runs with real processes (a local Ray instance: worker actors, server actors or the
stateless server's task), once with one kill of the serving server and once with two. Each run must
finish, its transcript verify, the one-process audit on another profile be bit-exact, and its roots
be what one process records by the same schedule: for a synchronous mode, what ``vgame train``
commits; for an asynchronous one, :func:`train_scheduled` over the schedule the run's chunks carry.
A worker killed mid-micro-batch costs a micro-batch, never a wrong state. The kill points come from
:func:`plan_kills` with the seed in the test's id; each kill's moment, pid and update are in the run's
events (printed, so a failure shows where they landed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from game.errors import CarriedStateError, StateReloadError  # noqa: E402
from game.judgeupdate import judged_step  # noqa: E402
from game.training.engine.audit import audit  # noqa: E402
from game.training.engine.replay import replay_transcript_step  # noqa: E402
from game.training.engine.scheduled import train_scheduled  # noqa: E402
from game.training.engine.states import decode_state  # noqa: E402
from game.training.engine.train import train  # noqa: E402
from game.training.ps.cluster import PsCluster, ray_session  # noqa: E402
from game.training.ps.driver import MODES, PsOptions, PsResult, train_ps  # noqa: E402
from game.training.ps.faults import Kill, plan_kills  # noqa: E402
from game.training.task.config import TaskConfig, load_config  # noqa: E402
from game.training.task.plugins import PluginError  # noqa: E402
from game.training.transcript.reader import Transcript  # noqa: E402
from tests.training.test_carried import COUNTED, KEPT  # noqa: E402
from tests.training.test_carried_optimizer import LOOKAHEAD_ATTRIBUTES, SHARED_BY_A_WRAPPER, _with  # noqa: E402
from tests.training.test_plateau import PLATEAU  # noqa: E402
from tests.training.test_schedule import PARAMETRIZED  # noqa: E402
from tests.training.test_task_api import make_plugin  # noqa: E402

STEPS = 10


def _cfg(asynchronous: bool) -> TaskConfig:
    return TaskConfig.for_preset(
        "mlp-digits",
        model={"hidden": 16},
        batch_size=8,
        steps=STEPS,
        accumulate=2,
        checkpoint_interval=4,
        max_staleness=2 if asynchronous else 0,
    )


def _run_own(cluster: PsCluster, root: Path, cfg: TaskConfig, mode: str = "sync") -> PsResult:
    """``cfg``'s run (a task of the test's own under ``root``) on the cluster's two workers, into
    ``root/t``."""
    return train_ps(
        cfg, "cpu-1t", root / "t", PsOptions(mode=mode, workers=2), cluster=cluster, search=[root]
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[PsCluster]:
    """One Ray instance and one set of actors for the module: each run assigns them its task."""
    with ray_session(num_cpus=2):
        kept = PsCluster()
        yield kept
        kept.close()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Transcript:
    out = tmp_path_factory.mktemp("one") / "t"
    train(_cfg(False), "cpu-1t", out)
    return Transcript(out)


def _run(cluster: PsCluster, mode: str, kills: tuple[Kill, ...], out: Path) -> PsResult:
    cfg = _cfg(MODES[mode][0])
    opts = PsOptions(mode=mode, workers=2, kills=kills, every=3)
    result = train_ps(cfg, "cpu-1t", out, opts, cluster=cluster)
    for e in result.events:
        if e.kind != "update":
            print(f"{mode}: t={e.t:.3f}s {e.kind} at update {e.update}: {e.detail}")
    return result


def _check(result: PsResult, plan: tuple[Kill, ...], one_process: Transcript, tmp_path: Path) -> None:
    t = result.transcript
    t.verify()
    mode = result.mode
    assert sum(e.kind == "kill" for e in result.events) == len(plan)  # every planned kill landed
    server_kills = sum(k.target == "server" for k in plan)
    if MODES[mode][1] != "stateless":  # a stateful server's death is a failover; a task's, a re-run
        assert sum(e.kind == "failover" for e in result.events) == server_kills
    verdict = audit(t.directory, "cpu-2t")
    assert verdict.match and verdict.first_divergent_step is None and verdict.schedule_errors == ()
    if not MODES[mode][0]:
        assert (t.manifest.state_root, t.manifest.log_root) == (
            one_process.manifest.state_root,
            one_process.manifest.log_root,
        )
        return
    schedule = t.schedule()
    listed = sorted((x.update, x.leaf) for e in schedule for x in e.lost)
    assert listed == sorted((x.update, x.leaf) for x in result.lost)  # lost updates: in the chunks
    ref = train_scheduled(t.config, "cpu-1t", tmp_path / "reference", schedule)
    assert (ref.manifest.state_root, ref.manifest.log_root) == (t.manifest.state_root, t.manifest.log_root)


@pytest.mark.parametrize("kills", [1, 2])
@pytest.mark.parametrize("mode", list(MODES))
def test_serverKilled_trainingFinishes_andAuditsBitExact(
    cluster: PsCluster, one_process: Transcript, mode: str, kills: int, tmp_path: Path
) -> None:
    seed = 1000 * kills + list(MODES).index(mode)
    plan = tuple(plan_kills(seed, kills, STEPS, target="server"))
    print(f"{mode}: seed {seed}, kills planned: {[k.describe() for k in plan]}")
    _check(_run(cluster, mode, plan, tmp_path / "t"), plan, one_process, tmp_path)


@pytest.mark.parametrize("mode", ["sync", "stateless"])
def test_workerKilled_costsAMicroBatch_notTheState(
    cluster: PsCluster, one_process: Transcript, mode: str, tmp_path: Path
) -> None:
    plan = tuple(plan_kills(77, 2, STEPS, target="worker", workers=2, max_delay_s=0.01))
    print(f"{mode}: kills planned: {[k.describe() for k in plan]}")
    _check(_run(cluster, mode, plan, tmp_path / "t"), plan, one_process, tmp_path)


def test_asyncMode_onASyncTask_isRefusedNamingTheKey(cluster: PsCluster, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="max_staleness"):
        train_ps(_cfg(False), "cpu-1t", tmp_path / "t", PsOptions(mode="async"), cluster=cluster)


@pytest.mark.parametrize("mode", ["sync", "stateless"])
def test_aUsersOwnTask_foundByItsConfigsDirectory_trainsOnTheActors_asOneProcessDoes(
    cluster: PsCluster, mode: str, tmp_path: Path
) -> None:
    """A user's task beside its config file, outside the working directory: the actors' processes
    (started by Ray, with their own search path) find it by the directory ``train_ps`` is given
    (the CLI gives the config file's). Without it, its PluginError comes back at once; it came back
    as "no answer from a restarted actor in 180 s", Ray restarting the worker whose constructor
    raised without end."""
    make_plugin(tmp_path / "own")
    cfg = load_config(tmp_path / "own" / "task.toml").replace(
        steps=4, accumulate=2, checkpoint_interval=2, max_staleness=2 if MODES[mode][0] else 0
    )
    result = _run_own(cluster, tmp_path / "own", cfg, mode)
    assert audit(tmp_path / "own" / "t", "noisy").match
    if not MODES[mode][0]:  # synchronous: one process's roots
        one = train(cfg, "cpu-1t", tmp_path / "one")
        manifest = result.transcript.manifest
        assert (manifest.state_root, manifest.log_root) == (one.state_root.hex(), one.log_root.hex())
    make_plugin(tmp_path / "lost")
    cfg = load_config(tmp_path / "lost" / "task.toml").replace(
        steps=2, accumulate=2, max_staleness=cfg.max_staleness
    )
    with pytest.raises(PluginError, match="no module named"):
        train_ps(cfg, "cpu-1t", tmp_path / "t2", PsOptions(mode=mode, workers=2), cluster=cluster)


def test_aModelCarryingStateFromOneMicroBatchToTheNext_isRefusedOnTheWorkers(
    cluster: PsCluster, tmp_path: Path
) -> None:
    """A worker's scratch model lives on from one micro-batch to the next, where the one-process
    audit's and the judge's do not: a call counter there trained, and the honest trainer's audit
    failed. The worker now watches it as a step engine does, and a counter that reaches the work
    stops the run with CarriedStateError (raised as itself, not as Ray's wrapping); values kept for a plot
    train, and audit."""
    make_plugin(tmp_path / "counted", COUNTED)
    cfg = load_config(tmp_path / "counted" / "task.toml").replace(steps=3, accumulate=2)
    with pytest.raises(CarriedStateError, match=r"model\.calls: 0 at step 1, 1 now.*afresh"):
        train_ps(
            cfg,
            "cpu-1t",
            tmp_path / "t",
            PsOptions(workers=2),
            cluster=cluster,
            search=[tmp_path / "counted"],
        )
    make_plugin(tmp_path / "kept", KEPT)
    cfg = load_config(tmp_path / "kept" / "task.toml").replace(steps=3, accumulate=2)
    train_ps(cfg, "cpu-1t", tmp_path / "k", PsOptions(workers=2), cluster=cluster, search=[tmp_path / "kept"])
    assert audit(tmp_path / "k", "noisy").match


def test_aStateThatDoesNotLoadBack_isRefusedAfterTheFirstUpdate(cluster: PsCluster, tmp_path: Path) -> None:
    """The driver holds the state after its first update to its committed bytes, as a one-process
    trainer does after step 1: a wrapper optimizer whose load_state_dict loses its shared state
    stops the run, naming what is lost."""
    body = _with("Lookahead(torch.optim.AdamW(m.parameters(), lr=0.02))", SHARED_BY_A_WRAPPER)
    make_plugin(tmp_path / "wrapped", body)
    cfg = load_config(tmp_path / "wrapped" / "task.toml").replace(steps=3, accumulate=2)
    with pytest.raises(StateReloadError, match=r"step 1: the state does not come back .*lost: optim/"):
        train_ps(
            cfg,
            "cpu-1t",
            tmp_path / "t",
            PsOptions(workers=2),
            cluster=cluster,
            search=[tmp_path / "wrapped"],
        )


def test_recoveryBench_measuresEachModesLoss_andDrawsTheFigure(cluster: PsCluster, tmp_path: Path) -> None:
    from game.bench.recovery import RecoveryReport, draw_recovery, measure_recovery

    cfg = _cfg(False)
    report = measure_recovery(
        cfg, ["sync", "stateless"], tmp_path / "w", kills=(0, 1), eval_every=2, seed=3, cluster=cluster
    )
    assert report.all_verified and [r.mode for r in report.rows] == ["sync", "stateless"]
    for run in report.runs:
        assert len(run.kill_times) == run.kills
        assert run.curve and all(0.0 <= p[2] <= 1.0 for p in run.curve)  # accuracy of kept states
    sync_row = report.rows[0]
    assert sync_row.walls[1] > sync_row.walls[0]  # a failure costs the synchronous server time
    again = RecoveryReport.from_dict(report.to_dict())
    assert again == report
    draw_recovery(again, tmp_path / "recovery.png")
    assert (tmp_path / "recovery.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_psTrain_killsWhereTold_andAuditMatches(cluster: PsCluster, tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from game.cli import _register
    from game.cli.app import app
    from game.cli.bench_scale import PS_MODES, _modes

    assert _modes("all") == list(MODES) == list(PS_MODES)  # the CLI names the driver's modes
    _register()
    runner = CliRunner()
    out = tmp_path / "t"
    task = ["--preset", "mlp-digits", "--model", "hidden=16", "--batch-size", "8", "--steps", "6"]
    r = runner.invoke(app, ["ps", "train", "--mode", "sync-chain", *task, "--accumulate", "2",
                            "--kill-at", "server@2", "--every", "2", "--out", str(out), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["kills"]) == 1 and len(doc["failovers"]) == 1 and doc["steps"] == 6
    a = runner.invoke(app, ["audit", "--transcript", str(out), "--profile", "cpu-2t", "--json"])
    assert a.exit_code == 0 and json.loads(a.stdout)["match"], a.output
    bad = runner.invoke(app, ["ps", "train", "--mode", "async", *task, "--out", str(tmp_path / "u")])
    assert bad.exit_code != 0 and "max_staleness" in str(bad.exception)


def test_poisonedWorkers_asyncRun_divergesExactlyAtTheFirstUpdateApplyingThePoison(
    cluster: PsCluster, tmp_path: Path
) -> None:
    """A dishonest trainer's workers poison data step 4; its server killed once on the way. The
    transcript is what one process records by the same schedule and poison, and the honest audit's
    first divergent update (where a game's bisection lands) is the first that applied a poisoned
    micro-batch."""
    from game.training.engine.runtime import runtime_for

    cfg = _cfg(True)
    plan = tuple(plan_kills(5, 1, STEPS))
    opts = PsOptions(mode="async", workers=2, kills=plan, every=3, poison_steps=(4,))
    result = train_ps(cfg, "cpu-1t", tmp_path / "t", opts, cluster=cluster)
    t = result.transcript
    schedule = t.schedule()
    first = min(e.update for e in schedule if any(a.micro.step == 4 for a in e.applied))
    runtime = runtime_for(cfg)
    poison = {4: runtime.poison(runtime.batch(4), 4)}
    ref = train_scheduled(cfg, "cpu-1t", tmp_path / "ref", schedule, poison=poison)
    assert ref.manifest.state_root == t.manifest.state_root
    verdict = audit(t.directory, "cpu-2t")
    assert not verdict.match and verdict.first_divergent_step == first


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_anOptimizerCarryingStateOnTheServer_isRefusedAtTheSecondUpdate(
    cluster: PsCluster, tmp_path: Path, mode: str
) -> None:
    """A server's optimizer lives on from one update to the next, where a judge's is built afresh
    from the committed state: a Lookahead keeping its count and slow weights as attributes trained,
    and the judge would have ruled the honest trainer wrong. The server now watches it as a step
    engine does, and the run stops at update 2 naming the attribute."""
    body = _with("Lookahead(m.parameters(), lr=0.02)", LOOKAHEAD_ATTRIBUTES)
    make_plugin(tmp_path / "carried", body)
    staleness = 1 if mode == "async" else 0
    cfg = load_config(tmp_path / "carried" / "task.toml").replace(
        steps=3, accumulate=2, max_staleness=staleness
    )
    with pytest.raises(
        CarriedStateError, match=r"step 2: the task's optimizer .*optimizer\.count: 0 at step 1"
    ):
        _run_own(cluster, tmp_path / "carried", cfg, mode)


def test_aModelWhoseConstructionRoundsOps_trainedByAnAsynchronousServer_isJudgedAlike(
    cluster: PsCluster, tmp_path: Path
) -> None:
    """The workers' scratch models are built outside their interceptors, and a judge's re-run of
    an update built its own inside one, logging the construction's ops (a parametrization
    evaluated as it is registered): every update was ruled against the honest trainer. The
    judge's scratch model is built before its interceptor too now."""
    make_plugin(tmp_path / "parametrized", PARAMETRIZED)
    cfg = load_config(tmp_path / "parametrized" / "task.toml").replace(
        steps=4, accumulate=2, max_staleness=1, checkpoint_interval=1
    )
    result = _run_own(cluster, tmp_path / "parametrized", cfg, "async")
    assert audit(result.transcript.directory, "noisy").match
    for step in (2, 3, 4):
        assert replay_transcript_step(result.transcript.directory, step, "noisy").matches_transcript


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_aSchedulerSteppedWithTheLoss_onTheServer_isOneProcesssRun(
    cluster: PsCluster, tmp_path: Path, mode: str
) -> None:
    """The server gives a ReduceLROnPlateau (tests/training/test_plateau.py) the mean of the losses
    the workers computed for the micro-batches it applies, added in fold order: the run commits
    what one process commits by the same schedule, and the judge's re-run of its last update from
    the committed states agrees."""
    make_plugin(tmp_path / "own", PLATEAU)
    cfg = load_config(tmp_path / "own" / "task.toml").replace(
        steps=6, accumulate=2, checkpoint_interval=1, max_staleness=1 if mode == "async" else 0
    )
    t = _run_own(cluster, tmp_path / "own", cfg, mode).transcript
    if mode == "sync":
        train(cfg, "cpu-1t", tmp_path / "one")
        one = Transcript(tmp_path / "one")
    else:
        one = train_scheduled(t.config, "cpu-1t", tmp_path / "one", t.schedule())
    assert (t.manifest.state_root, t.manifest.log_root) == (one.manifest.state_root, one.manifest.log_root)
    lrs = {decode_state(t.load_checkpoint(s), t.config).optimizer.param_groups[0]["lr"] for s in range(7)}
    assert len(lrs) >= 2  # a cut
    assert judged_step(t.directory, 6, "noisy").matches_transcript
