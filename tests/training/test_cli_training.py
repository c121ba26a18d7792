"""The training commands as a script sees them: --json shapes, exit codes and clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import default_signals

SMALL = ["--preset", "mlp-digits", "--steps", "4", "--seed", "5"]


def vgame(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "game.cli", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "t"
    r = vgame("train", *SMALL, "--profile", "cpu-1t", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["num_leaves"] == 5 and len(doc["state_root"]) == 64
    return out


def test_profiles_json_lists_real_emulated_and_noisy_profiles() -> None:
    r = vgame("profiles", "--json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    names = {p["name"] for p in doc["profiles"]}
    assert {"cpu-1t", "cpu-2t", "splitk-16", "splitk-64", "noisy"} <= names
    assert doc["transcript_writer"] == "c" or doc["transcript_writer"].startswith("python (")


def test_profiles_says_who_writes_the_transcript_and_why_not_the_c_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VGAME_WRITER", "0")
    r = vgame("profiles", "--json")
    assert r.returncode == 0, r.stderr
    assert (
        json.loads(r.stdout)["transcript_writer"] == "python (switched off: VGAME_NATIVE=0 or VGAME_WRITER=0)"
    )
    r = vgame("profiles")
    assert "transcript writer (compression, hashes, files): python (switched off" in " ".join(
        r.stdout.split()
    )


def test_audit_json_shape_and_exit_codes(trained: Path) -> None:
    r = vgame("audit", "--transcript", str(trained), "--profile", "noisy", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) >= {"match", "trainer_state_root", "auditor_state_root", "first_divergent_step",
                        "steps", "corrections", "profile"}  # fmt: skip
    assert doc["match"] is True and doc["first_divergent_step"] is None and doc["profile"] == "noisy"
    r = vgame("audit", "--transcript", str(trained), "--profile", "noisy", "--no-log", "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["match"] is False


def test_train_again_onAFinishedTranscript_saysNothingRanAndLeavesItAlone(trained: Path) -> None:
    leaves = (trained / "leaves.bin").read_bytes()
    r = vgame("train", *SMALL, "--profile", "cpu-1t", "--out", str(trained))
    assert r.returncode == 0, r.stderr
    assert "already trained" in r.stdout and "all 4 steps were on disk; none run" in r.stdout
    assert "resumed" not in r.stdout
    assert (trained / "leaves.bin").read_bytes() == leaves


def test_replay_step_json(trained: Path) -> None:
    r = vgame("replay-step", "--transcript", str(trained), "--step", "4", "--profile", "splitk-16", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "step": 4,
        "state_hash": json.loads(r.stdout)["state_hash"],
        "matches_transcript": True,
        "rejected": "",
    }


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--preset", "no-such", "--steps", "2", "--out", "x"], "no-such"),
        (["train", "--steps", "2", "--out", "x"], "--preset NAME (mlp-digits, cnn-digits"),
        (["train", *SMALL, "--profile", "tpu-9", "--out", "x"], "tpu-9"),
        (["audit", "--transcript", "/nonexistent/t", "--profile", "cpu-1t"], "nonexistent"),
        (["train", *SMALL, "--bits", "40", "--out", "x"], "bits"),
        (["train", *SMALL, "--out", "a-file"], "a-file is a file, not a directory"),
        (["audit", "--transcript", "a-file", "--profile", "cpu-1t"], "a-file is a file, not a directory"),
        (["task", "keygen", "--out", "a-file/key"], "a file stands where"),  # an OSError: one line
        # refused before the work (a million steps would outlast the timeout below)
        # an OSError is "path: what is wrong", not "[Errno 20] Not a directory: 'a-file/d'"
        (
            ["divergence", "--preset", "mlp-digits", "--steps", "1000000", "--out", "a-file/d"],
            "error: a-file/d: Not a",
        ),
        (["calibrate", "--preset", "mlp-digits", "--steps", "1000000", "--out", "."], ". is a directory"),
        (
            ["calibrate", "--preset", "mlp-digits", "--steps", "1000000", "--out", "a-file/b.toml"],
            "a-file is a file, so no directory",
        ),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a transcript")
    r = subprocess.run(
        [sys.executable, "-m", "game.cli", *args], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_divergence_writes_png_and_three_series(tmp_path: Path) -> None:
    out = tmp_path / "div"
    r = vgame("divergence", "--preset", "mlp-digits", "--steps", "4", "--trainer-profile", "cpu-1t",
              "--auditor-profile", "noisy", "--out", str(out), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (out / "divergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((out / "divergence.json").read_text())
    series = doc["series"]
    # one point per leaf (init + 4 steps); with the log the two parties never differ
    assert len(series) == 3 and all(len(v) == 5 for v in series.values())
    assert all(d == 0.0 for d in series["fp64+rounding, with log"])
    assert max(series["fp32"]) > 0.0


def test_calibrate_writes_a_bands_file_that_train_accepts(tmp_path: Path) -> None:
    bands = tmp_path / "bands.toml"
    r = vgame("calibrate", "--preset", "mlp-digits", "--profiles", "cpu-1t,noisy", "--steps", "1",
              "--no-random-inputs", "--out", str(bands), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["profiles"] == ["cpu-1t", "noisy"] and doc["margin"] == 16 and doc["out"] == str(bands)
    assert {o["op"] for o in doc["ops"]} == set(doc["bands"]["ops"])
    out = tmp_path / "t"
    r = vgame("train", *SMALL, "--bands", str(bands), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    r = vgame("audit", "--transcript", str(out), "--profile", "noisy", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["match"] is True


def test_calibrate_atOtherModelSizes_recordsThem(tmp_path: Path) -> None:
    """Bands depend on the sizes (longer reductions drift further), so they are measured at the
    size the task trains at, and the file says which."""
    bands = tmp_path / "bands.toml"
    r = vgame("calibrate", "--preset", "mlp-digits", "--model", "hidden=8", "--batch-size", "4",
              "--profiles", "cpu-1t,noisy", "--steps", "1", "--no-random-inputs", "--out", str(bands),
              "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"] == {"hidden": 8} and doc["batch_size"] == 4
    assert "hidden=8 and batch size 4" in bands.read_text()
    # a task at other sizes is warned (it may be a choice); another preset's task is refused
    r = vgame("train", *SMALL, "--steps", "1", "--bands", str(bands), "--out", str(tmp_path / "t"))
    said = " ".join(r.stderr.split())
    assert r.returncode == 0, r.stderr
    assert "was calibrated on mlp-digits at hidden=8, batch size 4; this task is mlp-digits at" in said
    assert "--batch-size 32" in said
    r = vgame("train", "--preset", "cnn-digits", "--steps", "1", "--bands", str(bands),
              "--out", str(tmp_path / "c"))  # fmt: skip
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "was calibrated on task 'mlp-digits', not 'cnn-digits'" in said
    assert not (tmp_path / "c").exists()
    # --model and --batch-size apply over a config file's sizes too
    (tmp_path / "task.toml").write_text('preset = "mlp-digits"\nsteps = 1\n[model]\nhidden = 16\n')
    r = vgame("train", "--config", str(tmp_path / "task.toml"), "--model", "hidden=12", "--batch-size", "4",
              "--out", str(tmp_path / "o"), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    recorded = json.loads((tmp_path / "o" / "manifest.json").read_text())["config"]
    assert recorded["model"] == {"hidden": 12} and recorded["batch_size"] == 4


def test_calibrate_with_one_profile_is_a_clear_error() -> None:
    r = vgame("calibrate", "--preset", "mlp-digits", "--profiles", "cpu-1t")
    assert r.returncode == 2 and "at least two profiles" in r.stderr


def test_train_packed_log_format_and_bad_format(tmp_path: Path) -> None:
    r = vgame("train", *SMALL, "--log-format", "packed", "--out", str(tmp_path / "p"), "--json")
    assert r.returncode == 0, r.stderr
    r = vgame("train", *SMALL, "--log-format", "zip", "--out", str(tmp_path / "z"))
    assert r.returncode == 2 and "log_format" in r.stderr


def test_error_messages_keep_their_brackets(tmp_path: Path) -> None:
    # rich must not eat "[rel, abs]" as markup: the message says what the file should hold
    bad = tmp_path / "bands.toml"
    bad.write_text('format = "vgame-bands-v1"\n[bands]\ndefault = [-35]\n')
    r = vgame("train", *SMALL, "--bands", str(bad), "--out", str(tmp_path / "t"))
    assert r.returncode == 2 and "expected [rel, abs]" in r.stderr


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)  # Ctrl-C; a service manager's stop or `kill`; the terminal closed: each the same clean way out
def test_train_interrupted_saysHowManyStepsAreOnDisk(tmp_path: Path, signum: int, code: int) -> None:
    out = tmp_path / "t"
    args = ["train", "--preset", "mlp-digits", "--steps", "5000", "--profile", "cpu-1t", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "game.cli", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    leaves = out / "leaves.bin"
    deadline = time.monotonic() + 120
    while not (leaves.is_file() and leaves.stat().st_size >= 3 * 32) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert stdout == ""  # no JSON document for a run that did not finish
    done = leaves.stat().st_size // 32
    assert 3 <= done < 5001
    said = f"interrupted: {done} of 5001 steps (0..5000) are complete in {out}; run the same command"
    assert said in stderr and len(stderr.splitlines()) == 1


# A Ctrl-C at a known point: the engine function the command calls (``module:function``) is
# replaced by one that reports some progress and then raises KeyboardInterrupt, as the signal would.
_INTERRUPTED = """
import importlib
import sys

def interrupted(*args, progress=None, **kwargs):
    for done in (1, 2, 3):
        if progress is not None:
            progress(done, 40)
    raise KeyboardInterrupt

module, name = sys.argv[1].split(":")
setattr(importlib.import_module(module), name, interrupted)
sys.argv = ["vgame", *sys.argv[2:]]
from game.cli import main
main()
"""
_AUDIT = "game.training.engine.audit:audit"


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_interrupted_audit_saysHowFarItGot(extra: list[str], tmp_path: Path) -> None:
    args = ["audit", "--transcript", "t", "--profile", "cpu-1t", *extra]
    r = subprocess.run([sys.executable, "-c", _INTERRUPTED, _AUDIT, *args], capture_output=True, text=True)
    assert r.returncode == 130, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr  # no JSON document for an audit that did not end
    said = "interrupted: 3 of 40 steps replayed; an audit without --keep-progress keeps nothing, so run it again to start over"
    assert r.stderr.strip() == said
    r = subprocess.run([sys.executable, "-c", _INTERRUPTED, _AUDIT, *args, "--keep-progress", "kp"],
                       capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 130, r.stderr
    said = "interrupted: 3 of 40 steps replayed; run the same command to go on from the last save in kp"
    assert r.stderr.strip() == said


# A full disk at step 3, the way the writer reports it: the train function is replaced by one
# that writes nothing and raises what the writer raises.
_DISK_FULL = """
import sys
import game.training.engine.train as session
from game.errors import StepWriteError

def full(*args, **kwargs):
    raise StepWriteError("writing step 3 to t failed: [Errno 28] No space left on device", 3)

session.train = full
sys.argv = ["vgame", *sys.argv[1:]]
from game.cli import main
main()
"""


def test_train_failingToWrite_saysWhatIsKeptAndHowToGoOn(tmp_path: Path) -> None:
    out = tmp_path / "t"
    args = ["train", "--preset", "mlp-digits", "--steps", "4", "--out", str(out)]
    wide = {**os.environ, "COLUMNS": "400"}  # a long path is not folded across lines
    r = subprocess.run([sys.executable, "-c", _DISK_FULL, *args], capture_output=True, text=True, env=wide)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    said = " ".join(r.stderr.split())
    assert said.startswith("error: writing step 3 to t failed: [Errno 28] No space left on device.")
    assert f"0 of 5 steps (0..4) are complete in {out}; once the cause is fixed" in said
    assert said.endswith("run the same command to go on from there")


def test_version_isTheInstalledDistributions() -> None:
    from importlib.metadata import version

    import game

    r = vgame("--version")
    assert r.returncode == 0 and r.stdout.split() == ["vgame", game.__version__]
    assert version("vgame") == game.__version__  # pyproject takes it from game.__version__


def test_interrupted_commandWithNothingKept_saysInterrupted() -> None:
    """A Ctrl-C in any other command is one word, not silence (typer exits 130 before main sees it)."""
    args = ["replay-step", "--transcript", "t", "--step", "2", "--profile", "cpu-1t"]
    r = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED, "game.judgeupdate:judged_step", *args],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 130 and r.stdout == "", r.stderr
    assert r.stderr.strip() == "interrupted: vgame replay-step"


def test_profilesThisMachineCannotRun_areRefusedBeforeAnyTraining(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine runs cuda")
    work = tmp_path / "work"
    r = vgame("bench", "replication", "--preset", "mlp-digits", "--steps", "2", "--profiles", "cpu-1t,cuda",
              "--workdir", str(work))  # fmt: skip
    hint = "profile 'cuda' is not available on this machine (see `vgame profiles`)"
    assert r.returncode == 2 and hint in r.stderr
    assert not work.exists() or not any(work.iterdir())  # cpu-1t's run was trained first, and kept
    r = vgame("calibrate", "--preset", "mlp-digits", "--steps", "2", "--profiles", "cpu-1t,cuda",
              "--out", str(tmp_path / "b.toml"))  # fmt: skip
    assert r.returncode == 2 and hint in r.stderr
    # the bench of issue 46's GPU figures says the same, before any step
    r = vgame("bench", "overhead", "--preset", "mlp-digits", "--profile", "cuda", "--steps", "2")
    assert r.returncode == 2 and hint in r.stderr


def test_audit_keepProgress_goesOnFromTheLastSave(trained: Path, tmp_path: Path) -> None:
    from game.training.engine.audit import audit

    keep = tmp_path / "progress"

    def stop(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # as a Ctrl-C would stop it, progress saved every step
        audit(trained, "splitk-16", keep_progress=keep, save_every_s=0.0, progress=stop)
    args = ["audit", "--transcript", str(trained), "--profile", "splitk-16", "--keep-progress", str(keep)]
    r = vgame(*args, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["resumed_from"] == 2 and doc["match"] is True
    assert list(keep.iterdir()) == []  # done: the saved progress is gone
    r = vgame(*args, "--save-every", "-1")
    assert r.returncode == 2 and "--save-every" in r.stderr
    r = vgame(*args[:-1], str(trained / "progress"))  # the trainer's directory is not the audit's
    assert r.returncode == 2 and "lies inside the transcript" in " ".join(r.stderr.split()), r.stderr
    assert not (trained / "progress").exists()
