"""``vgame bench overhead`` and ``vgame bench log``: JSON shapes, ratio arithmetic, log-size laws.

No timing is asserted: only that the figures are consistent with one another.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from game.bench.logsize import check_bits, measure_log_size
from game.bench.overhead import (
    SPLIT_VARIANTS,
    VARIANTS,
    _block_order,
    _Variants,
    measure_overhead,
    targets_for,
)
from game.errors import ConfigError, TrainingError
from game.training.dispatch.profiles import get_profile
from game.training.log.packed import StepLog
from game.training.log.trits import BLOCK_BYTES, BLOCK_TRITS, packed_size
from game.training.native import front
from game.training.numerics.bandfile import Band, BandTable
from game.training.state.leaves import state_hash
from game.training.task.config import TaskConfig
from game.training.transcript.layout import LEAVES_NAME, LOG_DIR_NAME


def vgame(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "game.cli", *args], capture_output=True, text=True)


def tiny(preset: str) -> TaskConfig:
    sizes: dict[str, object] = {
        "mlp-digits": {"hidden": 16},
        "gpt-shakespeare": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8},
    }
    return TaskConfig.for_preset(preset, steps=3, batch_size=4, model=sizes[preset])


def test_overhead_ratios_are_ratios_of_the_reported_medians() -> None:
    report = measure_overhead(tiny("gpt-shakespeare"), steps=3, repeats=2, warmup=1, block=2)
    doc = report.to_dict()
    m, r = doc["median_seconds"], doc["ratios"]
    assert set(m) == set(VARIANTS) and all(v > 0 for v in m.values())
    assert doc["samples"] == {v: 4 for v in VARIANTS}  # blocks of steps 1-2 and 3, x 2 repeats
    assert doc["block"] == 2
    assert r["trainer_over_fp64"] == pytest.approx(m["trainer"] / m["fp64"])
    assert r["auditor_over_fp64"] == pytest.approx(m["auditor"] / m["fp64"])
    assert r["trainer_over_fp32"] == pytest.approx(m["trainer"] / m["fp32"])
    for name, t in doc["targets"].items():
        assert t["value"] == r[name] and t["reached"] == (t["value"] <= t["target"])
    assert doc["targets"]["trainer_over_fp64"]["target"] == 1.15
    assert doc["targets"]["auditor_over_fp64"]["target"] == 1.25
    assert doc["paper"] == {"trainer_over_plain": [1.17, 1.38], "auditor_over_plain": [1.29, 1.69]}


@pytest.mark.parametrize(
    ("profile", "model", "want"),
    [
        ("cpu-1t", {"n_layer": 12, "n_embd": 768}, (1.15, 1.25, "issue 5 (CPU)")),
        ("noisy", {"hidden": 16}, (1.15, 1.25, "issue 5 (CPU)")),
        (
            "cuda",
            {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 64},
            (1.3, 1.5, "issue 46 (GPU)"),
        ),
        ("cuda", {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 32}, (1.5, 1.5, "issue 46 (GPU)")),
        ("cuda", {"arch": "resnet50"}, (1.5, 1.5, "issue 46 (GPU)")),
    ],
)
def test_overhead_targets_are_the_ones_set_for_the_hardware(
    profile: str, model: dict[str, Any], want: tuple[float, float, str]
) -> None:
    # a GPU run was held to the CPU's 1.15x and 1.25x, where issue 46 sets 1.3x / 1.5x at the
    # GPT-2-small shape and 1.5x at gpt-shakespeare's size (no GPU needed: nothing runs)
    assert targets_for(profile, model) == want


def test_overhead_cpu_times_nest_within_the_wall_time() -> None:
    """Block by block, the step thread's CPU time is at most the block's wall time and the process's
    at least the thread's. Plain float64 on cpu-1t works on the step thread alone; the trainer's
    writer works on a thread of its own."""
    report = measure_overhead(tiny("gpt-shakespeare"), steps=3, repeats=1, warmup=1, block=2)
    for v in VARIANTS:
        assert len(report.thread_cpu[v]) == len(report.other_cpu[v]) == len(report.samples[v]) == 2
        for wall, cpu, other in zip(
            report.samples[v], report.thread_cpu[v], report.other_cpu[v], strict=True
        ):
            assert 0 < cpu <= wall + 1e-6 and other >= -1e-6
    assert min(report.other_cpu["trainer"]) > 0
    assert report.cpu["other_threads"]["fp64"] < 0.5 * report.cpu["step_thread"]["fp64"]
    doc = report.to_dict()["median_cpu_seconds"]
    assert set(doc) == {"step_thread", "waits", "other_threads"}
    for v in VARIANTS:
        waits = [w - c for w, c in zip(report.samples[v], report.thread_cpu[v], strict=True)]
        assert doc["step_thread"][v] == pytest.approx(statistics.median(report.thread_cpu[v]))
        assert doc["waits"][v] == pytest.approx(statistics.median(waits))
        assert doc["other_threads"][v] == pytest.approx(statistics.median(report.other_cpu[v]))


def test_overhead_split_adds_the_trainers_thread_alone_and_the_auditors_replay_alone() -> None:
    """``split`` times two more variants, with ratios of the medians like the others; the trainer's
    thread alone has no writer's thread working beside it."""
    report = measure_overhead(tiny("gpt-shakespeare"), steps=3, repeats=1, warmup=1, block=2, split=True)
    doc = report.to_dict()
    m, r = doc["median_seconds"], doc["ratios"]
    assert set(m) == set(VARIANTS + SPLIT_VARIANTS) and doc["samples"] == {v: 2 for v in m}
    assert r["record_over_fp64"] == pytest.approx(m["record"] / m["fp64"])
    assert r["replay_over_fp64"] == pytest.approx(m["replay"] / m["fp64"])
    assert set(doc["targets"]) == {"trainer_over_fp64", "auditor_over_fp64"}
    assert min(report.other_cpu["trainer"]) > 0
    assert report.cpu["other_threads"]["record"] < 0.5 * report.cpu["step_thread"]["record"]
    assert set(measure_overhead(tiny("mlp-digits"), steps=1, repeats=1, warmup=0).medians) == set(VARIANTS)


def test_overhead_split_variants_do_the_trainers_and_the_auditors_work(tmp_path: Path) -> None:
    """After the same blocks, ``record``'s and ``replay``'s states hash to the trainer's leaves, as
    the auditor's does, and ``record`` puts no step on disk."""
    names = VARIANTS + SPLIT_VARIANTS
    with _Variants(tiny("gpt-shakespeare"), tmp_path, get_profile("cpu-1t"), names) as variants:
        for k, (first, last) in enumerate(((1, 2), (3, 3))):
            for name in _block_order(k, names):
                variants.prepare(name, first, last)
                variants.run(name, first, last)
            leaf = variants.writer.leaves[last]
            assert {v: state_hash(variants.states[v]) == leaf for v in names[2:]} == dict.fromkeys(
                names[2:], True
            )
    dropped = tmp_path / "dropped"
    assert not any((dropped / LOG_DIR_NAME).iterdir()) and (dropped / LEAVES_NAME).read_bytes() == b""


@pytest.mark.parametrize("names", [VARIANTS, VARIANTS + SPLIT_VARIANTS])
def test_overhead_block_order_rotates_and_readers_follow_the_trainer(names: tuple[str, ...]) -> None:
    firsts = set()
    for k in range(2 * len(names)):
        order = _block_order(k, names)
        assert sorted(order) == sorted(names)
        for reader in ("auditor", "replay"):
            if reader in names:
                assert order.index(reader) > order.index("trainer")
        firsts.add(order[0])
    assert firsts == set(names) - {"auditor", "replay"}  # every variant but a reader leads a block


def test_overhead_rejects_zero_steps() -> None:
    with pytest.raises(TrainingError, match="steps"):
        measure_overhead(tiny("mlp-digits"), steps=0)


def test_bench_overhead_json_has_the_documented_keys() -> None:
    r = vgame("bench", "overhead", "--preset", "mlp-digits", "--steps", "2", "--repeats", "1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) >= {"preset", "profile", "interceptor", "steps", "warmup", "repeats", "median_seconds", "samples",
                        "median_cpu_seconds", "ratios", "paper", "targets", "config"}  # fmt: skip
    assert doc["profile"] == "cpu-1t" and doc["preset"] == "mlp-digits"
    assert set(doc["ratios"]) >= {"trainer_over_fp64", "auditor_over_fp64", "trainer_over_fp32"}
    m = doc["median_seconds"]
    assert doc["ratios"]["trainer_over_fp64"] == pytest.approx(m["trainer"] / m["fp64"])


def test_bench_overhead_split_json_has_its_ratios() -> None:
    r = vgame(
        "bench", "overhead", "--preset", "mlp-digits", "--steps", "1", "--repeats", "1", "--split", "--json"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc["median_seconds"]) == set(VARIANTS + SPLIT_VARIANTS)
    assert set(doc["ratios"]) >= {"record_over_fp64", "replay_over_fp64"}
    for v in SPLIT_VARIANTS:
        assert doc["ratios"][f"{v}_over_fp64"] == pytest.approx(
            doc["median_seconds"][v] / doc["median_seconds"]["fp64"]
        )


def test_overhead_onAnotherProfile_reportsIt() -> None:
    report = measure_overhead(tiny("mlp-digits"), steps=1, repeats=1, warmup=0, profile="cpu-2t")
    assert report.to_dict()["profile"] == "cpu-2t"


def test_overhead_reportsWhatMetTheOps() -> None:
    """The report says whether the C++ front or the Python mode ran (a GPU run's figures mean
    little without it)."""
    here = "front" if front.available() else "python"
    assert measure_overhead(tiny("mlp-digits"), steps=1, repeats=1, warmup=0).to_dict()["interceptor"] == here
    with front.disabled():
        report = measure_overhead(tiny("mlp-digits"), steps=1, repeats=1, warmup=0)
    assert report.to_dict()["interceptor"] == "python"


@pytest.mark.parametrize("profile", ["noisy", "splitk-16"])
def test_overhead_onAnEmulatingProfile_refusesToTimeIt(profile: str) -> None:
    """Emulation runs in Python: its times say nothing about any machine."""
    with pytest.raises(TrainingError, match="emulates"):
        measure_overhead(tiny("mlp-digits"), steps=1, profile=profile)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_overhead_onCuda_timesEveryVariant() -> None:
    doc = measure_overhead(tiny("gpt-shakespeare"), steps=1, repeats=1, warmup=1, profile="cuda").to_dict()
    assert doc["profile"] == "cuda" and doc["samples"] == {v: 1 for v in VARIANTS}


@pytest.fixture(scope="module")
def log_rows() -> list[dict[str, Any]]:
    return [row.to_dict() for row in measure_log_size(tiny("gpt-shakespeare"), (32, 26), steps=2)]


def test_log_size_rows_are_consistent(log_rows: list[dict[str, Any]]) -> None:
    assert [r["bits"] for r in log_rows] == [32, 26]
    for r in log_rows:
        tot = r["totals"]
        assert tot["values"] > 0 and tot["values"] == r["values_per_step"] * 2
        # the chunk is its header plus exactly the packed trits, 23 bytes per 116 (the tail 5 per byte)
        assert tot["packed_bytes"] - tot["header_bytes"] >= tot["values"] * BLOCK_BYTES / BLOCK_TRITS
        assert r["bits_per_value_trits"] == pytest.approx(8 * BLOCK_BYTES / BLOCK_TRITS, rel=2e-3)
        assert r["bits_per_value_packed"] > r["bits_per_value_trits"]
        assert tot["zlib_bytes"] <= tot["packed_bytes"] and tot["lzma_bytes"] <= tot["packed_bytes"]
        assert r["bits_per_value_zlib"] <= r["bits_per_value_packed"]
        assert 0.0 <= r["directed_fraction"] <= 1.0
        assert tot["corrections"] >= 0
        # the sparse log: far smaller than the packed one, with or without compression
        assert 0 < tot["sparse_bytes"] <= min(tot["sparse_stored_bytes"], tot["sparse_zlib_bytes"])
        assert r["bits_per_value_sparse"] < r["bits_per_value_packed"] / 10
        # a free bit is a value within 16 bands; an entry lies within 4 bands: entries <= free
        assert 0 <= tot["entries"] <= tot["free"]


def test_packed_chunk_of_many_values_costs_under_1_6_bits_per_value() -> None:
    # A chunk's size is its header plus 23 bytes per 116 values: for large n 1.586 bits per value,
    # under the paper's 1.6 (5 per byte); the v1 layout is that 1.6.
    step_log = StepLog(1)
    n = 1_000_003
    step_log.append(0, "aten.mm.default", torch.randint(0, 3, (n,), dtype=torch.uint8))
    chunk = step_log.encode(1, b"\x11" * 32)
    assert len(chunk) - packed_size(n) < 100
    assert 184 / 116 <= 8 * len(chunk) / n < 1.587
    assert 1.6 <= 8 * len(step_log.encode(1, b"\x11" * 32, version=1)) / n <= 1.61


def test_bits_outside_16_to_32_are_refused() -> None:
    for bad in ([15], [33], []):
        with pytest.raises(ConfigError):
            check_bits(bad)
    assert check_bits([32, 28, 26]) == [32, 28, 26]


@pytest.mark.parametrize("bits", ["33", "15", "abc", "32,8"])
def test_bench_log_bad_bits_exits_2_with_a_clear_message(bits: str) -> None:
    r = vgame("bench", "log", "--preset", "mlp-digits", "--bits", bits)
    assert r.returncode == 2
    assert "bits" in r.stderr


def test_bench_log_json_has_the_documented_keys() -> None:
    r = vgame("bench", "log", "--preset", "mlp-digits", "--steps", "1", "--bits", "32", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) >= {"preset", "trainer_profile", "auditor_profile", "rows", "paper", "config"}
    assert doc["paper"]["packed_bits_per_value"] == 1.6
    row = doc["rows"][0]
    assert set(row) >= {"bits", "values_per_step", "packed_bytes_per_step", "zlib_bytes_per_step",
                        "lzma_bytes_per_step", "bits_per_value_packed", "bits_per_value_zlib",
                        "bits_per_value_lzma", "directed_fraction", "corrections_per_step",
                        "bits_per_value_sparse", "bits_per_value_sparse_stored", "entries_per_step",
                        "free_bits_per_step", "sparse_corrections_per_step"}  # fmt: skip
    assert row["zlib_bytes_per_step"] <= row["packed_bytes_per_step"]


def test_model_overrides_parse_and_reach_the_config() -> None:
    import typer

    from game.cli.options import parse_model_overrides

    assert parse_model_overrides("n_layer=12, n_embd=768") == {"n_layer": 12, "n_embd": 768}
    assert parse_model_overrides(None) == {} and parse_model_overrides("") == {}
    assert parse_model_overrides("arch=resnet50, channels=8") == {"arch": "resnet50", "channels": 8}
    for bad in ("n_layer", "n_layer=", "=3"):
        with pytest.raises(typer.BadParameter, match="NAME=VALUE"):
            parse_model_overrides(bad)
    cfg = TaskConfig.for_preset("cnn-digits", model=parse_model_overrides("arch=resnet50"))
    assert (cfg.model.arch, cfg.model.channels) == ("resnet50", 64)  # type: ignore[union-attr]
    # A string where the config wants an integer is the config's error, naming the key.
    with pytest.raises(ConfigError, match=r"model\.n_layer: expected an integer"):
        TaskConfig.for_preset("gpt-shakespeare", model=parse_model_overrides("n_layer=x"))
    r = vgame("bench", "log", "--preset", "mlp-digits", "--model", "width=3", "--steps", "1")
    assert r.returncode == 2 and "model.width: unknown size" in r.stderr


def test_bench_log_takes_a_calibrated_bands_file(tmp_path: Path) -> None:
    """Bands calibrated at another size are what the log at that size is measured with."""
    table = BandTable(Band(-30, -40), {"aten.mm.default": Band(-28, -38)})
    bands = tmp_path / "bands.toml"
    bands.write_text(table.to_toml())
    r = vgame("bench", "log", "--preset", "mlp-digits", "--steps", "1", "--bits", "32",
              "--bands", str(bands), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["config"]["bands"] == table.to_dict()
    r = vgame("bench", "log", "--preset", "mlp-digits", "--bands", str(tmp_path / "none.toml"))
    assert r.returncode != 0 and "none.toml" in r.stderr.replace("\n", "")  # rich wraps long paths
