"""``vgame bench log``: rounding-log size per step (packed, sparse, compressed) and corrections, per grid."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from game.cli.app import bench_app, console, emit_json, fail
from game.cli.options import BandsOpt, BatchSizeOpt, JsonOpt, ModelOpt, parse_model_overrides, task_config
from game.errors import VGameError


def _parse_bits(text: str) -> list[int]:
    from game.bench.logsize import check_bits

    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter("bits are comma-separated grid widths, e.g. 32,28,26") from None
    try:
        return check_bits(values)
    except VGameError as exc:
        raise typer.BadParameter(str(exc)) from None


@bench_app.command("log")
def log_size(
    preset: Annotated[str, typer.Option("--preset", help="Task preset, e.g. gpt-shakespeare.")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Recorded steps per grid width.")] = 5,
    bits: Annotated[str, typer.Option("--bits", help="Grid widths (16..32), comma-separated.")] = "32,28,26",
    model: ModelOpt = None,
    batch_size: BatchSizeOpt = None,
    bands: BandsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Record steps at each grid width; report the log per step, bits per value and noisy corrections."""
    from game.bench.logsize import measure_log_size, report_dict

    widths = _parse_bits(bits)
    try:
        cfg = task_config(
            preset,
            model=parse_model_overrides(model),
            batch_size=batch_size,
            bands=bands,
        )
        if json_out:
            rows = measure_log_size(cfg, widths, steps=steps)
        else:
            with console.status("measuring the log") as status:
                rows = measure_log_size(cfg, widths, steps=steps, progress=lambda m: status.update(m))
    except VGameError as exc:
        raise fail(exc) from None
    doc = report_dict(preset, rows, cfg.to_dict())
    if json_out:
        emit_json(doc)
    else:
        _print(doc, steps)


def _print(doc: dict[str, Any], steps: int) -> None:
    from rich.table import Table

    table = Table(
        title=f"{doc['preset']}: rounding log per step ({steps} steps, trainer {doc['trainer_profile']}, "
        f"corrections by a {doc['auditor_profile']} auditor)",
        title_justify="left",
    )
    cols = ("bits", "values", "packed B", "zlib-9 B", "bits/value packed", "zlib", "lzma",
            "sparse B", "bits/value sparse", "sparse, no compression", "entries", "free bits",
            "corrections packed / sparse")  # fmt: skip
    for c in cols:
        table.add_column(c, justify="right")
    for r in doc["rows"]:
        table.add_row(
            str(r["bits"]), f"{r['values_per_step']:,.0f}", f"{r['packed_bytes_per_step']:,.0f}",
            f"{r['zlib_bytes_per_step']:,.0f}", f"{r['bits_per_value_packed']:.3f}",
            f"{r['bits_per_value_zlib']:.3f}", f"{r['bits_per_value_lzma']:.3f}",
            f"{r['sparse_bytes_per_step']:,.0f}", f"{r['bits_per_value_sparse']:.4f}",
            f"{r['bits_per_value_sparse_stored']:.4f}", f"{r['entries_per_step']:,.1f}",
            f"{r['free_bits_per_step']:,.0f}",
            f"{r['corrections_per_step']:,.1f} / {r['sparse_corrections_per_step']:,.1f}",
        )  # fmt: skip
    console.print(table)
    p = doc["paper"]
    z32, z26 = p["zip_bits_per_value_b32"], p["zip_bits_per_value_b26"]
    console.print(
        f"paper: packed {p['packed_bits_per_value']} bits/value; zip at b=32 {z32['resnet50']:.2f} (ResNet-50) / "
        f"{z32['gpt2']:.2f} (GPT-2), at b=26 {z26['resnet50']:.2f} / {z26['gpt2']:.2f}; corrections per step "
        f"at b=32 about {p['corrections_per_step_b32']['resnet50']} (ResNet-50) / "
        f"{p['corrections_per_step_b32']['gpt2']} (GPT-2), 0 at b<=27"
    )
    console.print(
        "sparse: only in-band values rounded to the odd neighbour are listed (issue 6 target: <= 0.05 bits/value "
        "at b=32); free bits: values within 16 bands of a midpoint, whose side a trainer could still choose"
    )
