"""Band tables in the task config, the shipped calibrations, and the calibration itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from game.bench.calibrate import OpStats, calibrate
from game.errors import ConfigError
from game.training.dispatch.profiles import get_profile
from game.training.engine.step import StepEngine
from game.training.numerics.bandfile import (
    Band,
    BandsOrigin,
    BandTable,
    load_bands,
    loads_bands,
    loads_bands_file,
    preset_bands,
)
from game.training.task.catalog import PRESET_NAMES
from game.training.task.config import TaskConfig, load_config


def _table() -> BandTable:
    return BandTable(default=Band(-30, -40), ops={"aten.mm.default": Band(-34, -44)})


def test_table_roundTrips_throughDictAndToml(tmp_path: Path) -> None:
    t = _table()
    assert BandTable.from_dict(t.to_dict()) == t
    assert loads_bands(t.to_toml(comment="two lines\nof comment")) == t
    (tmp_path / "b.toml").write_text(t.to_toml())
    assert load_bands(tmp_path / "b.toml") == t


def test_unknownOp_getsTheDefault() -> None:
    t = _table()
    assert t.band("aten.mm.default") == Band(-34, -44)
    assert t.band("aten.never.default") == Band(-30, -40)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"ops": {}}, r"bands\.default: missing"),
        ({"default": [-30]}, r"bands\.default: expected \[rel, abs\]"),
        ({"default": [-30, -70]}, r"bands\.default\.abs: expected an integer exponent in -60\.\.-2"),
        ({"default": [-30, 0]}, r"bands\.default\.abs"),
        ({"default": [-30.5, -40]}, r"bands\.default\.rel"),
        ({"default": [-30, -40], "ops": {"aten.mm.default": "wide"}}, r"bands\.ops\.'aten\.mm\.default'"),
        ({"default": [-30, -40], "extra": 1}, r"bands\.extra: unknown key"),
    ],
)
def test_badTable_isAConfigErrorNamingTheKey(doc: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        BandTable.from_dict(doc)


def test_bandsAndLogFormat_areInTheSpecHash() -> None:
    cfg = TaskConfig.for_preset("mlp-digits")
    assert cfg.log_format == "sparse" and cfg.bands == preset_bands("mlp-digits")
    assert b'"bands":' in cfg.canonical_json() and b'"log_format":"sparse"' in cfg.canonical_json()
    hashes = {
        cfg.spec_hash(),
        cfg.replace(bands=_table()).spec_hash(),
        cfg.replace(log_format="packed").spec_hash(),
    }
    assert len(hashes) == 3
    assert TaskConfig.from_dict(cfg.to_dict()) == cfg  # the manifest's round trip keeps the bands


def test_badLogFormat_isAConfigError() -> None:
    with pytest.raises(ConfigError, match=r"log_format: 'zip' is not one of sparse, packed"):
        TaskConfig.for_preset("mlp-digits", log_format="zip")


def test_configFile_readsABandsFileBesideIt(tmp_path: Path) -> None:
    (tmp_path / "bands.toml").write_text(_table().to_toml())
    (tmp_path / "task.toml").write_text('preset = "mlp-digits"\nsteps = 3\nbands = "bands.toml"\n')
    assert load_config(tmp_path / "task.toml").bands == _table()
    (tmp_path / "task2.toml").write_text('preset = "mlp-digits"\nbands = "missing.toml"\n')
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        load_config(tmp_path / "task2.toml")


def test_bandsFile_ofAnotherPreset_isRefused_ofOtherSizes_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bands narrower than the real divergence can cost an honest trainer its dispute: a file
    measured on another model must not slip into a task unnoticed."""
    origin = BandsOrigin(preset="mlp-digits", model={"hidden": 16}, batch_size=8)
    (tmp_path / "bands.toml").write_text(_table().to_toml(origin=origin))
    assert loads_bands_file((tmp_path / "bands.toml").read_text()) == (_table(), origin)
    (tmp_path / "same.toml").write_text(
        'preset = "mlp-digits"\nbatch_size = 8\nbands = "bands.toml"\n[model]\nhidden = 16\n'
    )
    with caplog.at_level("WARNING"):
        assert load_config(tmp_path / "same.toml").bands == _table()
    assert not caplog.records
    (tmp_path / "wide.toml").write_text('preset = "mlp-digits"\nbatch_size = 8\nbands = "bands.toml"\n')
    with caplog.at_level("WARNING"):
        load_config(tmp_path / "wide.toml")
    assert "calibrated on mlp-digits at hidden=16, batch size 8; this task is mlp-digits at hidden=64" in (
        caplog.text
    )
    (tmp_path / "other.toml").write_text('preset = "cnn-digits"\nbands = "bands.toml"\n')
    with pytest.raises(ConfigError, match=r"calibrated on task 'mlp-digits', not 'cnn-digits'"):
        load_config(tmp_path / "other.toml")
    # a file from before the [calibrated] table says nothing about its origin: taken as it is
    (tmp_path / "bands.toml").write_text(_table().to_toml())
    assert load_config(tmp_path / "other.toml").bands == _table()


@pytest.mark.parametrize(
    ("calibrated", "match"),
    [
        ('"x"', r"calibrated: expected a table"),
        ("{ model = {}, batch_size = 8 }", r"calibrated\.preset"),
        ('{ preset = "mlp-digits", model = { hidden = true }, batch_size = 8 }', r"calibrated\.model"),
        ('{ preset = "mlp-digits", model = {}, batch_size = "8" }', r"calibrated\.batch_size"),
    ],
)
def test_badCalibratedTable_isAConfigError(calibrated: str, match: str) -> None:
    text = f"calibrated = {calibrated}\n" + _table().to_toml()
    with pytest.raises(ConfigError, match=match):
        loads_bands(text)


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_shippedBands_coverEveryInexactOpOfThePreset(preset: str) -> None:
    # An op the calibration never saw would fall back to the default band: it must not happen for
    # the presets we ship (and the default is the widest band measured).
    cfg = TaskConfig.for_preset(preset, steps=2)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    state = engine.init_state()
    result = engine.run_step(state, 1, mode="record")
    assert result.log is not None
    logged = {r.op_name for r in result.log.records}
    table = cfg.band_table
    assert logged <= set(table.ops), logged - set(table.ops)
    for band in table.ops.values():
        assert band.rel <= table.default.rel and band.abs <= table.default.abs


def test_opStats_bandCoversEveryMeasuredDifference_withTheMargin() -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(4000, dtype=torch.float64, generator=g)
    ref[:10] *= 2.0**-30  # cancelled outputs: small values, errors of the top's scale
    alt = ref * (1 + (torch.rand(4000, dtype=torch.float64, generator=g) - 0.5) * 2.0**-38)
    alt[:10] += 2.0**-44
    st = OpStats("op")
    st.add(ref, alt)
    band = st.band(16)
    d = (ref - alt).abs()
    e_x = torch.frexp(ref)[1] - 1
    e_top = int(torch.frexp(ref.abs().max())[1]) - 1
    bound = torch.ldexp(torch.ones_like(ref), e_x + band.rel) + 2.0 ** (band.abs + e_top)
    assert bool((d * 16 <= bound).all())  # the margin is on top of covering every sample


def test_calibrate_measuresEveryOpWithinTheNoiseBound() -> None:
    cfg = TaskConfig.for_preset("mlp-digits", steps=2, model={"hidden": 16}, batch_size=8)
    result = calibrate(cfg, ["cpu-1t", "noisy", "splitk-16"], steps=2, margin=16)
    assert {o["op"] for o in result.ops} == set(result.table.ops)
    for op in result.ops:
        assert op["values"] > 0
        # noisy perturbs by a relative 2**-40: less than 2**-39 of the binade; bands add the 16x margin
        assert op["max_rel_log2"] is None or op["max_rel_log2"] <= -39 + 1e-9
        assert op["band"][0] <= -39 + 4
    assert loads_bands_file(result.to_toml()) == (
        result.table,
        BandsOrigin(preset="mlp-digits", model={"hidden": 16}, batch_size=8),
    )
    # its header is the command that ran: a task given by its config is named by it
    assert result.to_toml().startswith(
        "# Divergence bands calibrated by `vgame calibrate --preset mlp-digits --"
    )
    assert result.to_toml("--config task.toml").startswith(
        "# Divergence bands calibrated by `vgame calibrate --config task.toml --profiles cpu-1t,noisy,splitk-16"
    )


@pytest.mark.parametrize(
    ("profiles", "kwargs", "match"),
    [
        (["cpu-1t"], {}, "at least two profiles"),
        (["cpu-1t", "nope"], {}, "unknown profile 'nope'"),
        (["cpu-1t", "noisy"], {"margin": 8}, "margin"),
        (["cpu-1t", "noisy"], {"steps": 0}, "steps"),
    ],
)
def test_calibrate_badArguments_areConfigErrors(
    profiles: list[str], kwargs: dict[str, int], match: str
) -> None:
    cfg = TaskConfig.for_preset("mlp-digits", steps=2)
    with pytest.raises(ConfigError, match=match):
        calibrate(cfg, profiles, **{"steps": 1, **kwargs})
