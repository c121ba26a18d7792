"""A parameter-server run whose driver dies goes on from its transcript (issue 45, no lost work):
the driver, the one process of a run Ray does not restart, is killed with SIGKILL mid-run (its Ray
with it), and the same command finishes the run from the updates on disk. The transcript verifies,
audits bit-exactly on another profile and, for a synchronous task, commits the one-process roots.
The lost updates a failover leaves for the next entry to list survive a death in between."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from game.errors import TranscriptError
from game.training.engine.audit import audit
from game.training.engine.scheduled import train_scheduled
from game.training.engine.step import engine_for
from game.training.engine.train import train
from game.training.log.schedule import LostUpdate, MicroBatchId
from game.training.ps.pool import WorkPool
from game.training.ps.resume import keep_pending, read_pending, resume
from game.training.task.config import TaskConfig
from game.training.transcript.reader import Transcript, steps_on_disk
from tests.procs import default_signals
from tests.training.schedules import simulated_schedule

STEPS = 60
TASK = ["--preset", "mlp-digits", "--model", "hidden=16", "--batch-size", "8", "--steps", str(STEPS),
        "--accumulate", "2", "--profile", "cpu-1t"]  # fmt: skip


def _cfg(max_staleness: int) -> TaskConfig:
    return TaskConfig.for_preset(
        "mlp-digits",
        model={"hidden": 16},
        batch_size=8,
        steps=STEPS,
        accumulate=2,
        max_staleness=max_staleness,
    )


def _ps_train(mode: str, out: Path, logs: Path, *extra: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "game.cli",
        "ps",
        "train",
        "--mode",
        mode,
        *TASK,
        *extra,
        "--out",
        str(out),
        "--json",
    ]
    with (logs.with_suffix(".out")).open("wb") as stdout, (logs.with_suffix(".err")).open("wb") as stderr:
        return subprocess.Popen(
            argv,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # its Ray is in its group: nothing outlives the test
            preexec_fn=default_signals,
        )


def _said(logs: Path) -> str:
    return logs.with_suffix(".out").read_text() + logs.with_suffix(".err").read_text()[-3000:]


@pytest.mark.parametrize(("mode", "staleness"), [("sync", 0), ("async", 3)])
def test_driverKilledMidRun_theSameCommandGoesOn_andTheTranscriptAuditsBitExact(
    mode: str, staleness: int, tmp_path: Path
) -> None:
    out = tmp_path / "t"
    extra = ["--max-staleness", str(staleness)] if staleness else []
    extra += ["--kill-at", "server@4", "--every", "3"]  # a failover before the death, too
    first = _ps_train(mode, out, tmp_path / "first", *extra)
    try:
        deadline = time.monotonic() + 240
        while steps_on_disk(out) < 12 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert first.poll() is None, _said(tmp_path / "first")
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    kept = steps_on_disk(out) - 1
    assert 11 <= kept < STEPS, kept  # leaves 0..11 at least were on disk
    second = _ps_train(mode, out, tmp_path / "second", *extra)
    try:
        second.wait(300)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    assert second.returncode == 0, _said(tmp_path / "second")
    doc = json.loads((tmp_path / "second.out").read_text())
    assert kept - 1 <= doc["resumed_from"] <= kept  # the last step may have been cut mid-write
    assert doc["kills"] == []  # the planned kill was the first run's
    t = Transcript(out)
    t.verify()
    verdict = audit(out, "cpu-2t")
    assert verdict.match and verdict.schedule_errors == ()
    if not staleness:
        one = train(_cfg(0), "cpu-1t", tmp_path / "one")
        assert (t.manifest.state_root, t.manifest.log_root) == (one.state_root.hex(), one.log_root.hex())
    else:
        ref = train_scheduled(t.config, "cpu-1t", tmp_path / "ref", t.schedule())
        assert (ref.manifest.state_root, ref.manifest.log_root) == (
            t.manifest.state_root,
            t.manifest.log_root,
        )


def test_resume_afterAFailover_cutsBackToItsState_andKeepsTheLostUpdatesToList(tmp_path: Path) -> None:
    """The driver died after a failover to state 5 had lost updates 6-8, before the update that
    lists them was on disk (here: before the transcript was even cut back)."""
    cfg = _cfg(2).replace(steps=12, checkpoint_interval=4)
    entries, _, _ = simulated_schedule(cfg.steps, 2, 2, workers=3, seed=5)
    out, home = tmp_path / "t", tmp_path / "t.ps"
    train_scheduled(cfg, "cpu-1t", out, entries)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["complete"], manifest["state_root"], manifest["log_root"] = False, None, None
    (out / "manifest.json").write_text(json.dumps(manifest))  # a run that died before its finish
    t = Transcript(out)
    lost = [LostUpdate(u, t.leaf(u)) for u in (6, 7, 8)]
    keep_pending(home, 5, lost)
    writer, back = resume(out, cfg, "cpu-1t", home, engine_for(cfg, "cpu-1t"))
    writer.close()
    assert back.step == 5 and steps_on_disk(out) == 6 and back.leaves == t.leaves()[:6]
    assert back.entries == entries[:5] and back.lost == lost
    pool = WorkPool(cfg.steps, 2, 2)
    pool.restore(back.leaves, back.entries, back.lost)
    applied = {a.micro for e in entries[:5] for a in e.applied}
    first_left = min(
        MicroBatchId(s, j) for s in range(1, 13) for j in range(2) if MicroBatchId(s, j) not in applied
    )
    assert pool.update == 6 and pool.next_micro() == first_left
    assert read_pending(home) == (5, lost)
    with pytest.raises(TranscriptError, match="started on profile 'cpu-1t', not 'cpu-2t'"):
        resume(out, cfg, "cpu-2t", home, engine_for(cfg, "cpu-2t"))
