"""The GPU measurement scripts of issue 46 (``scripts/``), run on CPU as CI can.

A GPU is lent for minutes, and every measurement of it goes through these scripts
(``gpu_measure.sh`` and the Python it calls): one that has rotted since it last ran wastes the
lease. So each runs here down the CUDA path on CPU tensors (Triton's interpreter, or its kernels
recorded and not run), and what it reports is held to what must hold on any machine: a trainer's
step is the same launches every step, the group kernels launch fewer kernels than one a tensor, the
front calls Python less than the dispatch mode without changing the launches, a captured pass
gives the eager pass's gradients, the device leaf is the host's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def run_script(name: str, *args: str, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    """Run ``scripts/name`` from the repository root; its stdout (a failure shows its stderr)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def last_json(out: str) -> dict[str, Any]:
    line = [s for s in out.splitlines() if s.startswith("{")][-1]
    result: dict[str, Any] = json.loads(line)
    return result


@pytest.mark.parametrize("preset", ["mlp-digits", "cnn-digits"])
def test_graph_stability_a_trainer_step_is_the_same_launches_every_step(preset: str) -> None:
    # what a captured trainer step rests on: every launch and op of step 3 as step 2's
    got = last_json(run_script("graph_stability.py", "--preset", preset))
    record, replay = got["record"], got["replay"]
    assert record["launches"] > 0 and record["ops"] > record["launches"] / 2
    assert record["same_length"] and record["differ"] == 0, record["first"]
    # the auditor's entries differ step by step: its launches carry their counts
    assert replay["launches"] >= record["launches"]
    assert set(replay["differ_by_kind"]) <= {
        f"launch {k}" for k in ("round_and_write_listed_one", "round_and_write_listed", "scan")
    }


def test_count_launches_groups_and_front() -> None:
    from game.training.native.front import available as front_built

    parts = ["--parts", "--by-call"] if front_built() else []  # both go through the front
    got = last_json(
        run_script("count_launches.py", "--preset", "mlp-digits", "--steps", "1", "--repeats", "1", *parts)
    )
    assert got["plain_fp64_ms"] > 0
    interceptors = ["python"] + (["front"] if "groups front" in got else [])
    for mode in ("record", "replay"):
        for i in interceptors:
            grouped, single = got[f"groups {i}"][mode], got[f"one_tensor_a_call {i}"][mode]
            assert grouped["group"] > 0 and "group" not in single
            assert grouped["tensor"] + grouped["group"] < single["tensor"]
            assert grouped["host_ms"] > 0 and single["host_ms"] > 0
        if "front" in interceptors:  # the front takes Python calls off a step, never launches
            front, python = got["groups front"][mode], got["groups python"][mode]
            assert front["python_calls"] < python["python_calls"]
            assert (front["tensor"], front["group"]) == (python["tensor"], python["group"])
    if parts:
        timed = got["record_parts_ms"]
        assert list(timed) == [
            "step",
            "without_rounding_calls",
            "and_without_state_copy",
            "and_without_dropout_masks",
        ]
        assert all(ms > 0 for ms in timed.values())
        for mode, group in (("record", "round_and_band_group"), ("replay", "round_with_entries_group")):
            calls = got["by_call"][mode]
            assert calls[group]["tensors_a_call"] >= 2 and calls[group]["host_ms"] > 0
            assert calls["round_inplace_group"]["calls"] > 0


@pytest.mark.slow
def test_graph_probe_dry_run_replays_the_eager_gradients(tmp_path: Path) -> None:
    out = tmp_path / "graph.json"
    run_script("gpu_graph_probe.py", "--preset", "mlp-digits", "--steps", "2", "--dry-run", "--out", str(out))
    got = json.loads(out.read_text())
    assert got["dry_run"] and got["device"] == "cpu"
    for mode in ("plain", "record", "replay"):
        probe = got[f"captured_{mode}"]
        assert "error" not in probe, probe.get("trace")
        assert probe["captured_ms"] > 0 and got[f"eager_{mode}_ms"] > 0
    assert got["captured_record"]["grads_equal"] is True
    assert got["captured_replay"]["grads_equal"] is True
    assert got["captured_record"]["settles_failed"] == 0


def test_gpu_profile_runs_on_a_cpu_profile(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    run_script(
        "gpu_profile.py", "--preset", "mlp-digits", "--steps", "1", "--profile", "cpu-1t", "--out", str(out)
    )
    got = json.loads(out.read_text())
    for key in ("trainer_s_per_step", "auditor_s_per_step", "fp64_s_per_step"):
        assert got[key] > 0, key
    assert got["trainer_own"] and all(row["calls"] > 0 for row in got["trainer_own"])
    profiled = got["torch_profile"]
    assert sorted(profiled) == ["auditor", "plain", "trainer"]
    for kind, step in profiled.items():
        assert step["wall_ms"] > 0 and step["ops"], kind
        # a CPU profile runs nothing on a device: no kernel time, no launch
        assert (step["device_ms"], step["device_share"], step["launches"]) == (0, 0, 0), kind


@pytest.mark.slow
def test_gpu_profile_clocksTheRoundingsHostWork_byThread_downTheCudaPath(tmp_path: Path) -> None:
    """The host clocks (``host``) see what a deferring step adds: the front's calls, the Triton
    launches inside them, the snapshot and the read-back, all on the step's thread here (on CPU,
    autograd runs the backward pass on the caller's thread); nothing on another."""
    out = tmp_path / "profile.json"
    run_script(
        "gpu_profile.py",
        "--preset",
        "mlp-digits",
        "--steps",
        "1",
        "--profile",
        "cpu-1t",
        "--cuda-path-on-cpu",
        "--out",
        str(out),
    )
    host = json.loads(out.read_text())["host"]
    assert sorted(host) == ["auditor", "trainer"]
    for role, got in host.items():
        step, other = got["step"], got["other"]
        assert step["rounding_calls"] > 0 and step["launches"] >= step["rounding_calls"], role
        # mlp-digits draws no dropout: every launch is inside a call, every call inside the step
        assert 0 < step["launches_ms"] <= step["rounding_calls_ms"] < got["wall_ms"], role
        assert got["snapshot_ms"] > 0 and got["settle_ms"] > 0, role
        assert (got["queue_ms"] > 0) is (role == "trainer"), role  # the auditor here writes nothing
        assert set(other.values()) == {0}, role


@pytest.mark.slow
def test_gpu_leaf_check_in_the_interpreter() -> None:
    out = run_script(
        "gpu_leaf_check.py",
        "--device",
        "cpu",
        "--gb",
        "0.000001",
        "--reps",
        "1",
        env={"TRITON_INTERPRET": "1"},
    )
    assert "off grid: OffGridError" in out and "param/p3" in out
    assert out.rstrip().endswith("leafcheck: ok")


def test_gpu_measure_names_its_stages_in_one_list(tmp_path: Path) -> None:
    # the usage line, the default run, the case arms and the unknown-stage message name the same stages
    text = (SCRIPTS / "gpu_measure.sh").read_text()
    default = re.search(r"^all=\(([a-z ]+)\)$", text, flags=re.M)
    usage = re.search(r"# Stages \(default: all, in this order\): ([a-z, \n#]+)\.", text)
    assert default and usage
    stages = default.group(1).split()
    arms = re.findall(r"^    ([a-z]+)\)$", text, flags=re.M)
    assert sorted(arms) == sorted(stages)
    assert re.sub(r"[#\s]+", " ", usage.group(1)).split(", ") == stages
    proc = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_measure.sh"), str(tmp_path / "out"), "nosuch"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    log = (tmp_path / "out" / "run.log").read_text()
    unknown = re.search(r"unknown stage nosuch \(known: ([a-z ]+)\)", log)
    assert unknown and unknown.group(1).split() == stages
    assert log.rstrip().endswith("done")


def test_gpu_wheels_fetches_only_pinned_packages() -> None:
    # each wheel gpu_wheels.sh fetches for a GPU image is pinned in the lock, and eth-utils (which the
    # CLI loads to register its commands, and a stock torch image lacks) is among them
    text = (SCRIPTS / "gpu_wheels.sh").read_text()
    listed = re.search(r"^names=\(([a-z_ -]+)\)$", text, flags=re.M)
    assert listed
    names = listed.group(1).split()
    lock = (ROOT / "requirements.lock").read_text().lower()
    assert [n for n in names if not re.search(rf"^{re.escape(n.lower())}==", lock, flags=re.M)] == []
    assert "eth-utils" in names


def test_log_host_ms_rebuilds_each_chunk_it_times(tmp_path: Path) -> None:
    # the trainer's side turns each chunk's listed lanes, left as a deferring step's kernels leave
    # them, into the same chunk bytes again: what it times is a step's real read-back
    out = tmp_path / "run"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "game.cli",
            "train",
            "--preset",
            "mlp-digits",
            "--steps",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    got = last_json(
        run_script("log_host_ms.py", "--transcript", str(out), "--repeats", "1", "--step-ms", "50")
    )
    assert got["transcript_steps"] == 2 and set(got["steps"]) == {"1", "2"}
    for step in got["steps"].values():
        assert step["same_chunk"] is True and step["listed"] > 0
        writer = step["writer"]
        assert writer["payload_bytes"] > 0 and writer["block"] == 0  # a small payload: one piece
        assert all(w["bytes"] == writer["one_piece_bytes"] for w in writer["ms_by_threads"].values())
        parts = (
            "auditor_read_ms",
            "auditor_read_busy_ms",
            "auditor_setup_ms",
            "auditor_wait_ms",
            "trainer_host_ms",
            "writer_build_ms",
        )
        assert min(step[k] for k in parts) >= 0
        assert set(step["auditor_wait_ms_by_depth"]) == {"1", "2"}  # one ahead, and a GPU auditor's
