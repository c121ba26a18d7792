"""One figure of the benchmarks, drawn from the JSON that ``vgame bench overhead`` and ``bench log`` print.

Reading the saved JSON (rather than re-measuring) lets the figure in ``docs/`` be redrawn from the
very documents the tables in ``docs/benchmarks.md`` come from. Two panels:

* overhead: trainer/fp64 and auditor/fp64 per preset as bars, the paper's ranges as bands and the
  targets as dashed lines (both read from the files); a run with ``--split`` also shows, hatched
  inside each bar, what the trainer's thread alone and the auditor's replay alone cost, so the rest
  of the bar is what the work beside the step (the writer, the read, the hasher) adds;
* log size: every ``bits_per_value*`` figure of every row (packed, trits, zlib, lzma, or whatever
  a newer ``bench log`` adds) per preset and grid width, on a log axis, with the paper's packed line.

A file that is missing, not JSON, or lacks what a panel needs raises :class:`BenchFileError`
naming the file.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from game.errors import ConfigError
from game.training.task.config import TaskConfig

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not with the CLI
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

RATIOS = ("trainer_over_fp64", "auditor_over_fp64")
#: The ``--split`` ratio drawn inside each of :data:`RATIOS`' bars: that side's own thread alone.
ALONE = {"trainer_over_fp64": "record_over_fp64", "auditor_over_fp64": "replay_over_fp64"}
BPV_PREFIX = "bits_per_value"
#: The PNG's resolution (the figure is 4.6 inches high, 6.5 or more wide a panel).
DPI = 120


class BenchFileError(ConfigError):
    """A benchmark JSON file is missing, not JSON, or not the shape its bench writes."""


@dataclass(frozen=True)
class Band:
    """A ratio's paper range and the issue's target for it."""

    paper: tuple[float, float]
    target: float


@dataclass(frozen=True)
class OverheadPoint:
    """One ``bench overhead`` document: a preset's two ratios and the bands they are judged by."""

    preset: str
    ratios: dict[str, float]  # trainer_over_fp64, auditor_over_fp64
    bands: dict[str, Band]
    source: Path
    label: str = ""  # the preset, and what differs from the default run (sizes, packed log, a GPU)
    #: a ``--split`` run's thread-alone ratio for each of RATIOS (:data:`ALONE`); empty without
    alone: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LogPoint:
    """One row of a ``bench log`` document: a preset at one grid width, bits per value per format."""

    preset: str
    bits: int | None
    bits_per_value: dict[str, float]  # format (packed, zlib, ...) -> bits per value
    paper_packed: float | None
    source: Path


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BenchFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchFileError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BenchFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise BenchFileError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def _obj(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (missing keys are reported by the caller)."""
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _require(path: Path, what: str, value: Any) -> float:
    num = _number(value)
    if num is None:
        raise BenchFileError(
            f"{path}: {what} is missing or not a number (is this `vgame bench overhead --json`?)"
        )
    return num


def read_overhead(path: Path) -> OverheadPoint:
    """Ratios, paper ranges and targets of one ``vgame bench overhead --json`` document."""
    doc = _load(path)
    preset = doc.get("preset")
    if not isinstance(preset, str):
        raise BenchFileError(f"{path}: no 'preset' (is this `vgame bench overhead --json`?)")
    ratios_doc, targets_doc = _obj(doc.get("ratios")), _obj(doc.get("targets"))
    ratios: dict[str, float] = {}
    bands: dict[str, Band] = {}
    for name in RATIOS:
        t = _obj(targets_doc.get(name))
        ratios[name] = _require(path, f"ratios.{name}", ratios_doc.get(name, t.get("value")))
        paper = t.get("paper")
        if not (isinstance(paper, list) and len(paper) == 2):
            raise BenchFileError(f"{path}: targets.{name}.paper must be a [low, high] pair")
        lo, hi = (_require(path, f"targets.{name}.paper", v) for v in paper)
        bands[name] = Band((lo, hi), _require(path, f"targets.{name}.target", t.get("target")))
    alone = {
        name: _require(path, f"ratios.{key}", ratios_doc[key])
        for name, key in ALONE.items()
        if key in ratios_doc
    }
    return OverheadPoint(preset, ratios, bands, Path(path), _overhead_label(preset, doc), alone)


def _overhead_label(preset: str, doc: dict[str, Any]) -> str:
    """The axis label: the preset, lines for sizes other than the preset's (a paper-size run), a line
    for a packed log, a line for a profile other than cpu-1t."""
    config = _obj(doc.get("config"))
    lines = [preset]
    sizes = _sizes_changed(preset, config)
    lines.extend(sizes)  # one a line: a group of two bars is narrow
    if config.get("log_format") == "packed":
        lines.append("packed log")
    profile = doc.get("profile")
    if isinstance(profile, str) and profile != "cpu-1t":
        lines.append(f"on {profile}")
    return "\n".join(lines)


def _sizes_changed(preset: str, config: dict[str, Any]) -> list[str]:
    """``key=value`` for each model size, and ``batch N``, that differ from the preset's defaults;
    nothing for a preset this version does not know (a file from another version)."""
    try:
        default = TaskConfig.for_preset(preset).to_dict()
    except ConfigError:
        return []
    model, default_model = _obj(config.get("model")), _obj(default.get("model"))
    out = [f"{k}={v}" for k, v in model.items() if default_model.get(k) != v]
    batch = config.get("batch_size")
    if batch is not None and batch != default.get("batch_size"):
        out.append(f"batch {batch}")
    return out


def _bpv_fields(node: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every numeric ``bits_per_value*`` field under ``node``, named by its path without the prefix."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if not isinstance(key, str):
            continue
        if key.startswith(BPV_PREFIX):
            num = _number(value)
            if num is not None:
                label = key[len(BPV_PREFIX) :].strip("_") or "all"
                yield (f"{prefix}{label}", num)
        elif isinstance(value, dict):
            yield from _bpv_fields(value, f"{prefix}{key}.")


def read_log(path: Path) -> list[LogPoint]:
    """Bits per value of every row of one ``vgame bench log --json`` document."""
    doc = _load(path)
    preset = doc.get("preset")
    rows = doc.get("rows")
    if not isinstance(preset, str) or not isinstance(rows, list):
        raise BenchFileError(
            f"{path}: needs 'preset' and a list of 'rows' (is this `vgame bench log --json`?)"
        )
    paper_packed = _number(_obj(doc.get("paper")).get("packed_bits_per_value"))
    points = []
    for i, row in enumerate(rows):
        fields = dict(_bpv_fields(row))
        if not fields:
            raise BenchFileError(f"{path}: rows[{i}] has no numeric bits_per_value* field")
        bits = row.get("bits")
        points.append(
            LogPoint(preset, bits if isinstance(bits, int) else None, fields, paper_packed, Path(path))
        )
    return points


def _unique_labels(names: Sequence[str]) -> list[str]:
    """Presets as axis labels; a preset given twice gets ``#2``, ``#3``."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} #{seen[n]}")
    return out


def _draw_overhead(ax: Any, points: Sequence[OverheadPoint]) -> None:
    colours = {"trainer_over_fp64": "tab:blue", "auditor_over_fp64": "tab:orange"}
    who = {"trainer_over_fp64": "trainer", "auditor_over_fp64": "auditor"}
    alone_label = {
        "trainer_over_fp64": "trainer's thread alone",
        "auditor_over_fp64": "auditor's replay alone",
    }
    width = 0.38
    xs = range(len(points))
    for j, name in enumerate(RATIOS):
        offs = [x + (j - 0.5) * width for x in xs]
        vals = [p.ratios[name] for p in points]
        bars = ax.bar(offs, vals, width, color=colours[name], label=f"{who[name]} / fp64", zorder=2)
        ax.bar_label(bars, labels=[f"{v:.2f}x" for v in vals], fontsize=7, padding=2)
        if any(name in p.alone for p in points):  # a run without --split has no inner bar
            inner = [p.alone.get(name, math.nan) for p in points]
            ax.bar(offs, inner, width * 0.7, fill=False, hatch="///", edgecolor="black", linewidth=0.5,
                   zorder=2.5, label=alone_label[name])  # fmt: skip
        # WHY sorted: files may disagree (older runs); each distinct band is drawn once, in a fixed order
        for band in sorted({p.bands[name] for p in points}, key=lambda b: (b.paper, b.target)):
            lo, hi = band.paper
            ax.axhspan(lo, hi, color=colours[name], alpha=0.18, linewidth=0, zorder=1,
                       label=f"paper {who[name]} {lo:.2f}-{hi:.2f}x")  # fmt: skip
            ax.axhline(band.target, color=colours[name], linewidth=1.3, linestyle="--", zorder=3,
                       label=f"target {who[name]} <= {band.target:.2f}x")  # fmt: skip
    ax.axhline(1.0, color="grey", linewidth=0.6, zorder=1)
    ax.set_xticks(list(xs), _unique_labels([p.label or p.preset for p in points]), fontsize=8)
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.set_ylim(0, max(max(*p.ratios.values(), *p.alone.values()) for p in points) * 1.45)
    ax.set_ylabel("time per step / plain float64")
    ax.set_title("Overhead of verifiable training (lower is better)")
    ax.legend(fontsize=7, ncols=3, loc="upper center")


def _draw_log(ax: Any, points: Sequence[LogPoint]) -> None:
    from matplotlib.ticker import NullLocator

    formats = list(dict.fromkeys(f for p in points for f in p.bits_per_value))
    width = 0.8 / len(formats)
    xs = range(len(points))
    values: list[float] = []
    for j, fmt in enumerate(formats):
        offs = [x - 0.4 + (j + 0.5) * width for x in xs]
        vals = [p.bits_per_value.get(fmt, math.nan) for p in points]
        values += [v for v in vals if v > 0]
        bars = ax.bar(offs, vals, width, label=fmt, zorder=2)
        # WHY upright: up to seven bars share a group, too narrow for their figures side by side
        ax.bar_label(bars, labels=[f"{v:.2g}" if v > 0 else "" for v in vals], fontsize=6, padding=2,
                     rotation=90)  # fmt: skip
    papers = sorted({p.paper_packed for p in points if p.paper_packed is not None})
    for paper in papers:
        ax.axhline(
            paper, color="black", linewidth=1.0, linestyle="--", zorder=3, label=f"paper packed {paper:g}"
        )
    names = _unique_labels([p.preset if p.bits is None else f"{p.preset}\nb={p.bits}" for p in points])
    ax.set_xticks(list(xs), names, fontsize=7, rotation=35, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.set_yscale("log")
    lo, hi = min(values + papers), max(values + papers)
    bottom, top = lo / 1.3, hi * 5  # headroom for the legend's two rows above the tallest bars' labels
    ax.set_ylim(bottom, top)
    # WHY explicit ticks: matplotlib labels only some decades of a log axis; 1-2-5 steps read well
    ax.yaxis.set_minor_locator(NullLocator())
    decades = range(math.floor(math.log10(bottom)), math.ceil(math.log10(top)) + 1)
    # (no tick above the tallest bars' labels: the legend sits there)
    ticks = [m * 10.0**k for k in decades for m in (1, 2, 5) if bottom <= m * 10.0**k <= hi * 1.6]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t:g}" for t in ticks])
    ax.set_ylim(bottom, top)
    ax.set_ylabel("bits per logged value (log scale)")
    ax.set_title("Size of the rounding log")
    ax.legend(fontsize=7, ncols=min(len(formats) + len(papers), 5), loc="upper center")


def draw_benchmarks(overhead: Sequence[OverheadPoint], logs: Sequence[LogPoint]) -> Figure:
    """The figure with the panels that have data (overhead, log size) side by side, laid out, unsaved."""
    if not overhead and not logs:
        raise ConfigError("nothing to plot: give at least one overhead or log file")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    draws: list[Callable[[Any], None]] = []
    widths: list[float] = []
    if overhead:
        draws.append(lambda ax: _draw_overhead(ax, overhead))
        # WHY wider: each group's label is as wide as its longest line (a size such as n_embd=768)
        widths.append(max(6.5, 1.25 * len(overhead)))
    if logs:
        draws.append(lambda ax: _draw_log(ax, logs))
        # WHY wider: a bar per format and grid width, each with its figure upright above it
        widths.append(max(6.5, 0.13 * len(logs) * len({f for p in logs for f in p.bits_per_value})))
    fig, axes = plt.subplots(1, len(draws), figsize=(sum(widths), 4.6), squeeze=False, width_ratios=widths)
    try:
        for ax, draw in zip(axes[0], draws, strict=True):
            draw(ax)
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return fig


def plot_benchmarks(overhead: Sequence[OverheadPoint], logs: Sequence[LogPoint], out: Path) -> Path:
    """Draw the panels that have data (overhead, log size) side by side into ``out`` (a PNG, or
    any format matplotlib writes, by the suffix: .svg, .pdf)."""
    import matplotlib.pyplot as plt
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    if Path(out).suffix.lower().lstrip(".") not in kinds:
        raise ConfigError(
            f"{out}: name the figure's file with one of {', '.join('.' + k for k in sorted(kinds))}"
        )
    fig = draw_benchmarks(overhead, logs)
    try:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=DPI)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot write the figure: {exc}") from None
    finally:
        plt.close(fig)
    log.info("wrote %s (%d overhead, %d log rows)", out, len(overhead), len(logs))
    return out
