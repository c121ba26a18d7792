"""`vgame train --workers W` (game/training/parallel): W torchrun processes write the transcript of
one process, byte for byte, which a one-process auditor on another profile verifies; a rank killed
mid-run leaves a transcript the same command finishes with the same roots; a bad W is one error."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from game.api import fit
from game.errors import CarriedStateError, ConfigError, TrainingError, TranscriptError
from game.training.engine.audit import audit
from game.training.engine.train import TrainResult, train
from game.training.parallel.dataparallel import assignment, check_workers
from game.training.parallel.launch import MESSAGES_NAME, _Relay, launch, pid_name
from game.training.task.config import TaskConfig, load_config
from game.training.transcript.reader import steps_on_disk
from tests.training.helpers import file_tree
from tests.training.test_carried import COUNTED, KEPT
from tests.training.test_cli_training import vgame
from tests.training.test_step import SMALL, small_cfg
from tests.training.test_task_api import TASK_PY, make_plugin

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_task"
M = 4


def _cfg(preset: str, **overrides: object) -> TaskConfig:
    return small_cfg(
        preset, accumulate=M, dropout=0.1, clip_grad_norm=0.5, steps=3, checkpoint_interval=2, **overrides
    )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each preset's transcript as one process writes it."""
    root = tmp_path_factory.mktemp("one")
    for preset in SMALL:
        train(_cfg(preset), "cpu-1t", root / preset)
    return {preset: root / preset for preset in SMALL}


@pytest.mark.parametrize("workers", [2, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("preset", list(SMALL))
def test_workers_writeTheOneProcessTranscript_andANoisyAuditMatches(
    preset: str, workers: int, one_process: dict[str, Path], tmp_path: Path
) -> None:
    """Every file of the transcript (manifest, leaves, chunk hashes, chunks, checkpoints) is the
    one-process trainer's; the one-process audit on the noisy profile matches, with corrections."""
    out = tmp_path / "t"
    launched = launch(_cfg(preset), "cpu-1t", out, workers)
    assert launched.result.steps_run == 3 and launched.workers == workers
    assert file_tree(out) == file_tree(one_process[preset])
    report = audit(out, "noisy")
    assert report.match and report.trainer_state_root == launched.result.state_root
    assert report.corrections > 0


@pytest.mark.slow
def test_ownTask_stockDropoutAndSdpa_onFourWorkers(tmp_path: Path) -> None:
    """examples/own_task (stock nn.Dropout and F.scaled_dot_product_attention, AdamW, a warm-up
    schedule, clipping) with four micro-batches a step, through the Python API: the four-worker
    transcript is one process's; run again once complete, it runs nothing."""
    work = tmp_path / "own_task"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = load_config(work / "task.toml").replace(accumulate=M, steps=4, checkpoint_interval=2)
    one = train(cfg, "cpu-1t", work / "one")
    four = fit(work / "task.toml", work / "four", workers=4, accumulate=M, steps=4, checkpoint_interval=2)
    assert four.state_root == one.state_root and four.log_root == one.log_root
    assert file_tree(work / "four") == file_tree(work / "one")
    again = fit(work / "task.toml", work / "four", workers=4, accumulate=M, steps=4, checkpoint_interval=2)
    assert again.steps_run == 0 and again.state_root == one.state_root  # complete: every rank stops at once


@pytest.mark.parametrize("victim", [pytest.param(0, marks=pytest.mark.slow), 1])
def test_aRankKilledMidRun_theSameCommandFinishesWithTheSameRoots(victim: int, tmp_path: Path) -> None:
    """SIGKILL to rank ``victim`` at a random step: the launch fails naming that rank, the steps
    before stay on disk, and the same launch again goes on from them to the one-process roots."""
    cfg = _cfg("gpt-shakespeare").replace(steps=40, checkpoint_interval=6)
    one = train(cfg, "cpu-1t", tmp_path / "one")
    at = random.Random(victim).randint(3, 15)
    out, job = tmp_path / "t", tmp_path / "job"
    caught: list[BaseException] = []

    def run() -> None:
        try:
            launch(cfg, "cpu-1t", out, 2, job_dir=job)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while steps_on_disk(out) <= at and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.005)
    assert thread.is_alive(), "the run ended before the kill"
    os.kill(int((job / pid_name(victim)).read_text()), signal.SIGKILL)
    thread.join(120)
    assert len(caught) == 1 and isinstance(caught[0], TrainingError)
    assert f"rank {victim} of 2 died" in str(caught[0]) and "run the same command" in str(caught[0])
    kept = steps_on_disk(out) - 1
    assert at <= kept < cfg.steps
    again: TrainResult = launch(cfg, "cpu-1t", out, 2, job_dir=job).result
    assert again.resumed_from == kept and again.steps_run == cfg.steps - kept
    assert (again.state_root, again.log_root) == (one.state_root, one.log_root)


def test_aRanksOwnError_reachesTheLauncherAsItself(tmp_path: Path) -> None:
    """Rank 0 finds another task's transcript in the directory: the launcher raises its
    TranscriptError, naming the rank; nothing was written."""
    out = tmp_path / "t"
    train(_cfg("mlp-digits", seed=1).replace(steps=1), "cpu-1t", out)
    before = file_tree(out)
    with pytest.raises(TranscriptError, match=r"another task.*\(rank 0 of 2\)$"):
        launch(_cfg("mlp-digits"), "cpu-1t", out, 2)
    assert file_tree(out) == before


def test_aModelCarryingStateFromStepToStep_onTwoWorkers_stopsAtStep2_asInOneProcess(tmp_path: Path) -> None:
    """The carried-state watch (engine/carried.py) on the data-parallel path: rank 0 looks at its
    model at each step's start as one process does. A call counter in an attribute (which a judge's
    model built afresh starts at 0) stops the launch at step 2 naming it; the last activations kept
    for a plot change the model too, but the step run afresh agrees, and the two workers write the
    one-process transcript."""
    make_plugin(tmp_path / "counted", COUNTED)
    cfg = load_config(tmp_path / "counted" / "task.toml").replace(accumulate=2, steps=3)
    with pytest.raises(CarriedStateError, match=r"step 2: .*model\.calls: 0 at step 1, 1 now.*afresh"):
        launch(cfg, "cpu-1t", tmp_path / "counted" / "t", 2)
    make_plugin(tmp_path / "kept", KEPT)
    cfg = load_config(tmp_path / "kept" / "task.toml").replace(accumulate=2, steps=3)
    one = train(cfg, "cpu-1t", tmp_path / "kept" / "one")
    two = launch(cfg, "cpu-1t", tmp_path / "kept" / "two", 2).result
    assert (two.state_root, two.log_root) == (one.state_root, one.log_root)


#: A task whose module, imported on rank 1, ends that process with code 3 at the interpreter's exit
#: (as a crash of a library's threads going down would), and whose held-out metric keeps rank 0
#: busy after the last step, so that rank 1 has left by then.
CRASH_AT_EXIT = TASK_PY.replace(
    "HERE = Path(__file__).parent",
    """HERE = Path(__file__).parent

import atexit, os, time
if os.environ.get("RANK") == "1":
    atexit.register(os._exit, 3)


def slow_metrics(m, b):
    time.sleep(1.5)
    return {"loss": float(F.cross_entropy(m(b["x"]), b["y"]))}""",
).replace(
    "        init_weights=",
    '        eval_dataset=HERE / "data.npz",\n        metrics=slow_metrics,\n        init_weights=',
)


def test_aRankEndingBadlyAfterItsWorkIsDone_doesNotFailTheRun(tmp_path: Path) -> None:
    """A rank that has finished its part leaves without the interpreter's teardown: a crash there
    ended it with another code after its work was done, torchrun stopped rank 0 while it was
    finishing, and a complete run failed as "KeyboardInterrupt: SIGTERM (rank 0 of 2; 3 of 3 steps
    are complete ...)"."""
    make_plugin(tmp_path / "own", CRASH_AT_EXIT)
    cfg = load_config(tmp_path / "own" / "task.toml").replace(accumulate=2, steps=3)
    two = launch(cfg, "cpu-1t", tmp_path / "own" / "two", 2, eval_every=3, search=[tmp_path / "own"])
    one = train(cfg, "cpu-1t", tmp_path / "own" / "one")
    assert (two.result.state_root, two.result.log_root) == (one.state_root, one.log_root)
    assert [e["step"] for e in two.evals] == [3]


def test_aWorkerCountThatDoesNotDivideTheMicroBatches_isOneError() -> None:
    with pytest.raises(ConfigError, match=r"--workers 3: .* accumulate = 4 .* \(valid: 1, 2, 4;"):
        check_workers(_cfg("mlp-digits"), 3)
    with pytest.raises(ConfigError, match="--workers 0"):
        check_workers(_cfg("mlp-digits"), 0)
    assert assignment(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]


def test_cli_trainWithWorkers_isOneProcessesRun_andABadCountIsOneErrorLine(tmp_path: Path) -> None:
    """`vgame train --workers 2 --accumulate 2 --json` gives one process's roots; --workers 3 is an
    error line (exit code 2) before any process starts or any file is made."""
    common = ["train", "--preset", "mlp-digits", "--steps", "3", "--seed", "4", "--accumulate", "2"]
    r = vgame(*common, "--workers", "2", "--out", str(tmp_path / "w2"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    one = train(
        TaskConfig.for_preset("mlp-digits", steps=3, seed=4, accumulate=2), "cpu-1t", tmp_path / "one"
    )
    assert (
        doc["workers"] == 2
        and doc["state_root"] == one.state_root.hex()
        and doc["log_root"] == one.log_root.hex()
    )
    bad = vgame(*common, "--workers", "3", "--out", str(tmp_path / "w3"))
    assert bad.returncode == 2
    assert "error: --workers 3: the task has accumulate = 2 micro-batches a step" in " ".join(
        bad.stderr.split()
    )
    assert not (tmp_path / "w3").exists()


def test_rankZerosWarnings_areLoggedByTheLauncher_wholeLinesAsTheyCome(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / MESSAGES_NAME
    relay = _Relay(path)
    relay.poll()  # no file yet: nothing
    path.write_bytes(b"the checkpoints to come need 3 GB\nhalf a li")
    with caplog.at_level(logging.WARNING, logger="game.training.parallel.launch"):
        relay.poll()
        with path.open("ab") as fh:
            fh.write(b"ne\n")
        relay.poll()
        relay.poll()
    assert [r.getMessage() for r in caplog.records] == ["the checkpoints to come need 3 GB", "half a line"]
