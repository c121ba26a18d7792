"""``vgame bench plot``: the figure is drawn from hand-written bench JSON, and bad files are named."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from game.bench.plot import (
    DPI,
    BenchFileError,
    _draw_overhead,
    draw_benchmarks,
    plot_benchmarks,
    read_log,
    read_overhead,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def overhead_doc(preset: str, trainer: float, auditor: float) -> dict[str, Any]:
    """The shape of ``OverheadReport.to_dict`` (only what the plot reads, plus a little more)."""
    return {
        "preset": preset,
        "profile": "cpu-1t",
        "median_seconds": {
            "fp32": 0.001,
            "fp64": 0.001,
            "trainer": 0.001 * trainer,
            "auditor": 0.001 * auditor,
        },
        "ratios": {"trainer_over_fp64": trainer, "auditor_over_fp64": auditor, "trainer_over_fp32": 4.0},
        "paper": {"trainer_over_plain": [1.17, 1.38], "auditor_over_plain": [1.29, 1.69]},
        "targets": {
            "trainer_over_fp64": {"value": trainer, "target": 1.15, "reached": False, "paper": [1.17, 1.38]},
            "auditor_over_fp64": {"value": auditor, "target": 1.25, "reached": False, "paper": [1.29, 1.69]},
        },
    }


def log_doc(preset: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The shape of ``logsize.report_dict``; ``extra`` goes into every row (new formats)."""
    rows = [
        {
            "bits": bits,
            "values_per_step": 27414.0,
            "bits_per_value_packed": 1.834,
            "bits_per_value_trits": 1.6,
            "bits_per_value_zlib": 1.456,
            "bits_per_value_lzma": 1.49,
            "directed_fraction": 0.4,
            **(extra or {}),
        }
        for bits in (32, 26)
    ]
    return {"preset": preset, "rows": rows, "paper": {"packed_bits_per_value": 1.6}}


def write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_readLog_everyBitsPerValueField_nestedAndNewOnesToo(tmp_path: Path) -> None:
    extra = {"bits_per_value_rle": 1.3, "formats": {"zstd": {"bits_per_value": 1.2}}, "bits_per_value_x": "?"}
    rows = read_log(write(tmp_path / "log.json", log_doc("cnn-digits", extra)))
    assert [r.bits for r in rows] == [32, 26]
    assert rows[0].bits_per_value == {
        "packed": 1.834, "trits": 1.6, "zlib": 1.456, "lzma": 1.49, "rle": 1.3, "formats.zstd.all": 1.2,
    }  # fmt: skip
    assert rows[0].paper_packed == 1.6


def test_readOverhead_ratiosAndBandsFromTheFile(tmp_path: Path) -> None:
    point = read_overhead(write(tmp_path / "oh.json", overhead_doc("gpt-shakespeare", 4.34, 4.64)))
    assert point.ratios == {"trainer_over_fp64": 4.34, "auditor_over_fp64": 4.64}
    assert point.bands["trainer_over_fp64"].paper == (1.17, 1.38)
    assert point.bands["auditor_over_fp64"].target == 1.25


def split_doc(preset: str, trainer: float, auditor: float, record: float, replay: float) -> dict[str, Any]:
    """A ``bench overhead --split`` document: two more ratios."""
    doc = overhead_doc(preset, trainer, auditor)
    doc["ratios"] |= {"record_over_fp64": record, "replay_over_fp64": replay}
    return doc


def test_readOverhead_aSplitRunsThreadAloneRatios_andNoneWithoutSplit(tmp_path: Path) -> None:
    split = read_overhead(write(tmp_path / "split.json", split_doc("cnn-digits", 1.5, 1.4, 1.2, 1.1)))
    assert split.alone == {"trainer_over_fp64": 1.2, "auditor_over_fp64": 1.1}
    assert split.ratios == {"trainer_over_fp64": 1.5, "auditor_over_fp64": 1.4}
    assert read_overhead(write(tmp_path / "plain.json", overhead_doc("cnn-digits", 1.5, 1.4))).alone == {}
    bad = split_doc("cnn-digits", 1.5, 1.4, 1.2, 1.1)
    bad["ratios"]["record_over_fp64"] = "fast"
    with pytest.raises(BenchFileError, match=r"ratios\.record_over_fp64"):
        read_overhead(write(tmp_path / "bad.json", bad))


def test_drawOverhead_hatchesEachSplitRunsThreadAloneInsideItsBar(tmp_path: Path) -> None:
    """The inner bars stand at the thread-alone ratios of the runs that have them, none elsewhere."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [
        read_overhead(write(tmp_path / "a.json", split_doc("cnn-digits", 1.5, 1.4, 1.2, 1.1))),
        read_overhead(write(tmp_path / "b.json", overhead_doc("gpt-shakespeare", 1.3, 1.2))),
    ]
    fig, ax = plt.subplots()
    try:
        _draw_overhead(ax, points)
        bars = {c.get_label(): [r.get_height() for r in c.patches] for c in ax.containers}
    finally:
        plt.close(fig)
    assert bars["trainer / fp64"] == [1.5, 1.3] and bars["auditor / fp64"] == [1.4, 1.2]
    inner_trainer, inner_auditor = bars["trainer's thread alone"], bars["auditor's replay alone"]
    assert inner_trainer[0] == 1.2 and inner_auditor[0] == 1.1
    assert math.isnan(inner_trainer[1]) and math.isnan(inner_auditor[1])
    fig, ax = plt.subplots()
    try:
        _draw_overhead(ax, points[1:])
        assert {c.get_label() for c in ax.containers} == {"trainer / fp64", "auditor / fp64"}
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    ("profile", "log_format", "label"),
    [
        ("cpu-1t", "sparse", "gpt-shakespeare"),
        ("cpu-1t", "packed", "gpt-shakespeare\npacked log"),
        ("cuda", "sparse", "gpt-shakespeare\non cuda"),
        ("cuda", "packed", "gpt-shakespeare\npacked log\non cuda"),
    ],
)
def test_readOverhead_labelSaysWhatDiffersFromTheDefaultRun(
    tmp_path: Path, profile: str, log_format: str, label: str
) -> None:
    """Two runs of one preset (a packed log, a GPU) must not share a bar label."""
    doc = {
        **overhead_doc("gpt-shakespeare", 2.0, 2.0),
        "profile": profile,
        "config": {"log_format": log_format},
    }
    assert read_overhead(write(tmp_path / "oh.json", doc)).label == label


@pytest.mark.parametrize(
    ("preset", "config", "label"),
    [
        (
            "gpt-shakespeare",
            {"model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 32}},
            "gpt-shakespeare",
        ),
        (
            "gpt-shakespeare",
            {"model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 64}, "batch_size": 8},
            "gpt-shakespeare\nn_layer=12\nn_head=12\nn_embd=768\nblock_size=64",
        ),
        (
            "cnn-digits",
            {"model": {"channels": 64, "hidden": 64, "arch": "resnet50"}, "batch_size": 8},
            "cnn-digits\nchannels=64\narch=resnet50\nbatch 8",
        ),
        ("no-such-preset", {"model": {"n_layer": 12}, "batch_size": 8}, "no-such-preset"),
    ],
)
def test_readOverhead_otherSizes_labelNamesThem(
    tmp_path: Path, preset: str, config: dict[str, Any], label: str
) -> None:
    """A paper-size run beside the preset's own must say its sizes, not read as a second run (``#2``)."""
    doc = {**overhead_doc(preset, 1.2, 1.2), "config": {"log_format": "sparse", **config}}
    assert read_overhead(write(tmp_path / "oh.json", doc)).label == label


def test_plot_bothPanels_writesNonEmptyPng(tmp_path: Path) -> None:
    overhead = [
        read_overhead(write(tmp_path / f"oh-{p}.json", overhead_doc(p, t, a)))
        for p, t, a in (("mlp-digits", 5.07, 4.74), ("gpt-shakespeare", 4.34, 4.64))
    ]
    logs = read_log(write(tmp_path / "log.json", log_doc("mlp-digits")))
    out = plot_benchmarks(overhead, logs, tmp_path / "img" / "benchmarks.png")
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_plot_fileNameWithoutAFigureSuffix_isRefusedBeforeDrawing(tmp_path: Path) -> None:
    from game.errors import ConfigError

    overhead = [read_overhead(write(tmp_path / "oh.json", overhead_doc("mlp-digits", 5.07, 4.74)))]
    with pytest.raises(ConfigError, match=r"p\.txt: name the figure's file with one of .*\.png.*\.svg"):
        plot_benchmarks(overhead, [], tmp_path / "p.txt")  # was matplotlib's ValueError, a traceback
    assert not (tmp_path / "p.txt").exists()
    assert plot_benchmarks(overhead, [], tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")


def test_draw_logPanelsFiguresAsTheDocsFigureHasThem_noTwoOverlapNorTheLegend(tmp_path: Path) -> None:
    """Nine groups of seven bars, as in docs/img/benchmarks.png: every bar's figure must be readable."""
    sparse = {
        "bits_per_value_sparse": 0.022,
        "bits_per_value_sparse_stored": 0.029,
        "bits_per_value_sparse_zlib": 0.022,
    }
    logs = [
        point
        for preset in ("gpt-shakespeare", "cnn-digits", "mlp-digits")
        for point in read_log(write(tmp_path / f"{preset}.json", three_widths(log_doc(preset, sparse))))
    ]
    overhead = [read_overhead(write(tmp_path / "oh.json", overhead_doc("cnn-digits", 1.44, 1.42)))]
    fig = draw_benchmarks(overhead, logs)
    try:
        fig.set_dpi(DPI)
        renderer = fig.canvas.get_renderer()
        fig.draw(renderer)
        for ax in fig.axes:
            boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text()]
            assert boxes
            legend = ax.get_legend().get_window_extent(renderer)
            for i, box in enumerate(boxes):
                assert not box.overlaps(legend), (ax.get_title(), ax.texts[i].get_text())
                for other in boxes[i + 1 :]:
                    assert not box.overlaps(other), (ax.get_title(), box, other)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_draw_overheadPanelAsTheDocsFigureHasIt_noTwoGroupLabelsOverlap(tmp_path: Path) -> None:
    """Six groups, two of them at paper sizes, as in docs/img/benchmarks.png: each label readable."""
    runs: list[tuple[str, dict[str, Any]]] = [
        ("gpt-shakespeare", {}),
        ("cnn-digits", {}),
        ("gpt-shakespeare", {"log_format": "packed"}),
        ("mlp-digits", {}),
        ("gpt-shakespeare", {"model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 64}}),
        ("cnn-digits", {"model": {"channels": 64, "hidden": 64, "arch": "resnet50"}, "batch_size": 8}),
    ]
    overhead = [
        read_overhead(write(tmp_path / f"oh{i}.json", {**overhead_doc(p, 1.3, 1.3), "config": c}))
        for i, (p, c) in enumerate(runs)
    ]
    fig = draw_benchmarks(overhead, [])
    try:
        fig.set_dpi(DPI)
        renderer = fig.canvas.get_renderer()
        fig.draw(renderer)
        labels = [t for t in fig.axes[0].get_xticklabels() if t.get_text()]
        assert len(labels) == len(runs)
        boxes = [t.get_window_extent(renderer) for t in labels]
        for i, box in enumerate(boxes):
            for other in boxes[i + 1 :]:
                assert not box.overlaps(other), (labels[i].get_text(), box, other)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def three_widths(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with a third grid width, 28, as ``vgame bench log`` runs by default."""
    return {**doc, "rows": [doc["rows"][0], {**doc["rows"][0], "bits": 28}, doc["rows"][1]]}


@pytest.mark.parametrize(
    ("text", "reader", "message"),
    [
        ("{not json", read_overhead, "not JSON"),
        ("[1, 2]", read_log, "expected a JSON object"),
        (json.dumps({"preset": "x", "ratios": {}}), read_overhead, "trainer_over_fp64"),
        (json.dumps({"preset": "x", "rows": [{"bits": 32}]}), read_log, "rows[0]"),
        (json.dumps({"rows": []}), read_log, "preset"),
    ],
)
def test_read_malformedFile_errorNamesTheFile(tmp_path: Path, text: str, reader: Any, message: str) -> None:
    bad = tmp_path / "broken-bench.json"
    bad.write_text(text)
    with pytest.raises(BenchFileError, match=re.escape(message)) as info:
        reader(bad)
    assert str(bad) in str(info.value)


def test_cli_benchPlot_writesPng_andMalformedFileFailsNamingIt(tmp_path: Path) -> None:
    from game.cli import _register
    from game.cli.app import app

    _register()
    oh = write(tmp_path / "oh.json", overhead_doc("cnn-digits", 4.01, 4.11))
    lg = write(tmp_path / "log.json", log_doc("cnn-digits"))
    out = tmp_path / "b.png"
    args = ["bench", "plot", "--out", str(out), "--overhead", str(oh), "--log", str(lg), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["png"] == str(out) and doc["presets"] == ["cnn-digits"]
    assert out.read_bytes().startswith(PNG_MAGIC)

    bad = tmp_path / "truncated.json"
    bad.write_text('{"preset": "cnn-digits", "rows": [')
    result = CliRunner().invoke(app, ["bench", "plot", "--out", str(out), "--log", str(bad)])
    assert result.exit_code == 2
    said = "".join(result.output.split())  # rich wraps long paths
    assert str(bad) in said and "notJSON" in said


def test_cli_benchPlot_noInput_fails(tmp_path: Path) -> None:
    from game.cli import _register
    from game.cli.app import app

    _register()
    result = CliRunner().invoke(app, ["bench", "plot", "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert not (tmp_path / "x.png").exists()
