"""The options several commands take, declared once so that their names and help agree, and the
helpers that read them: the chain, model sizes, a profile this machine runs, a file that can be
written, the first block to scan, and the task a command runs (``--preset``/``--config`` and their
overrides).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from game.errors import ConfigError

if TYPE_CHECKING:
    from game.training.task.config import TaskConfig

# Options that several commands take, declared once so their names and help agree.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")]
DataKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--data-key", help="The task's data key: its file, or 64 hex (else VGAME_DATA_KEY, the same)."
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Model sizes the task declares, over its defaults or its config's [model], e.g. "
        '"n_layer=12,n_head=12,n_embd=768,block_size=64" or "arch=resnet50".',
    ),
]
BatchSizeOpt = Annotated[int | None, typer.Option("--batch-size", min=1, help="Examples per step.")]
AccumulateOpt = Annotated[
    int | None,
    typer.Option("--accumulate", min=1, help="Micro-batches a step (must divide the batch size)."),
]
LrOpt = Annotated[float | None, typer.Option("--lr", help="Learning rate (what the task reads as cfg.lr).")]
PresetOpt = Annotated[
    str | None,
    typer.Option(
        "--preset",
        help="The task: a built-in preset (mlp-digits, cnn-digits, gpt-shakespeare) or your own, as "
        "module:attribute or an entry point's name (group vgame.tasks).",
    ),
]

#: The one meaning of ``--chain`` (README, "Chains"): which chain the command runs on. ``embedded``
#: and ``anvil`` are each a fresh chain that lives as long as the command; a URL is a running node
#: that outlives it. A command that cannot use one of the kinds refuses it with the fix
#: (:func:`checked_chain`).
FRESH_CHAINS = ("embedded", "anvil")
URL_SCHEMES = ("http://", "https://", "ws://", "wss://")
CHAIN_MEANING = (
    "embedded (a fresh in-process chain), anvil (a fresh local anvil that this command starts and "
    "stops) or the JSON-RPC URL of a running node (http://127.0.0.1:8545 for an anvil you started)"
)
#: How to get a chain that outlives one command, for the commands that need one.
START_ANVIL = "contracts/node_modules/.bin/anvil --block-time 1"
RunningChainOpt = Annotated[
    str,
    typer.Option(
        "--chain",
        envvar="VGAME_CHAIN",
        show_default=False,
        help="The JSON-RPC URL of a running node, e.g. http://127.0.0.1:8545 for an anvil you started. "
        "embedded and anvil, each a fresh chain that ends with the command, are refused here.",
    ),
]


def checked_chain(spec: str | None, *, outlives: str | None = None, moves_time: str | None = None) -> str:
    """``--chain`` read the one way every command reads it (:data:`CHAIN_MEANING`), or a
    :class:`ConfigError` that says which kinds this command takes and how to get one.

    ``outlives``: why this command needs a chain that outlives it (a task posted on a fresh chain
    is gone when the command ends; nodes share one chain with other processes), so ``embedded``
    and ``anvil`` are refused. ``moves_time``: why it needs a chain it may move the clock of and
    revert (the benchmarks), so a running node's URL is refused."""
    spec = (spec or "").strip()
    if not spec and outlives is not None:
        raise ConfigError(
            "--chain is required: the JSON-RPC URL of a running node, e.g. http://127.0.0.1:8545 for "
            f"an anvil you started with `{START_ANVIL}` (or set VGAME_CHAIN)"
        )
    if spec in FRESH_CHAINS:
        if outlives is not None:
            raise ConfigError(
                f"--chain {spec} is a fresh chain that ends with this command, but {outlives}: start "
                f"one that outlives it (`{START_ANVIL}`) and pass its JSON-RPC URL, "
                "--chain http://127.0.0.1:8545"
            )
        return spec
    if spec.startswith(URL_SCHEMES):
        if moves_time is not None:
            raise ConfigError(
                f"--chain {spec}: {moves_time}, which a running node does not allow; "
                "use --chain embedded or --chain anvil (a fresh chain for this command)"
            )
        return spec
    kinds = ["embedded, anvil (each a fresh chain for this command)"] if outlives is None else []
    if moves_time is None:
        kinds.append("the JSON-RPC URL of a running node (http(s):// or ws(s)://)")
    raise ConfigError(f"--chain {spec!r} is not a chain: give {' or '.join(kinds)}")


BandsOpt = Annotated[
    Path | None,
    typer.Option("--bands", help="A bands file from `vgame calibrate` instead of the preset's own."),
]


def parse_model_overrides(text: str | None) -> dict[str, int | str]:
    """``--model "n_layer=12,arch=resnet50"`` -> ``{"n_layer": 12, "arch": "resnet50"}``.

    A value that reads as an integer is one; any other is kept as a string. The config checks the
    names and the types.
    """
    out: dict[str, int | str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise typer.BadParameter(
                f"model sizes are NAME=VALUE pairs, comma-separated; got {part.strip()!r}"
            )
        try:
            out[key.strip()] = int(value)
        except ValueError:
            out[key.strip()] = value.strip()
    return out


def check_profile(name: str) -> None:
    """Refuse at once a profile this machine cannot run: an unknown name (the error lists the valid
    ones) or a CUDA profile without a GPU, before any work (or, for a node, hours of waiting)."""
    from game.training.dispatch.profiles import get_profile

    get_profile(name).require()


def check_out_file(path: Path, option: str = "--out", *, example: str = "out") -> None:
    """Refuse, before any work, a file path that cannot be written: a directory, a file standing
    where one of its parent directories would be made, or a directory this user may not write in."""
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory: name the file to write (e.g. {path / example})")
    for parent in path.parents:
        if not parent.exists():
            continue
        if not parent.is_dir():
            raise ConfigError(f"{option} {path}: {parent} is a file, so no directory can be made there")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{option} {path}: {parent} is not writable")
        return


FromBlockOpt = Annotated[
    int | None,
    typer.Option(
        "--from-block",
        envvar="VGAME_FROM_BLOCK",
        min=0,
        show_default="the block the contract was deployed in, its deployedInBlock()",
        help="The first block event scans read.",
    ),
]


def checked_first_block(first_block: int | None, latest: int) -> int | None:
    """``--from-block`` checked against the chain: a block not mined yet is a typo, and every scan
    from it would find nothing (a judge would never see its games). None stays None: the
    contract's own deployment block."""
    if first_block is not None and first_block > latest:
        raise ConfigError(
            f"--from-block {first_block} is after the chain's latest block ({latest}): give the block "
            "the game contract was deployed in"
        )
    return first_block


def task_config(
    preset: str | None,
    config: Path | None = None,
    *,
    steps: int | None = None,
    seed: int | None = None,
    bits: int | None = None,
    tau: float | None = None,
    log_format: str | None = None,
    bands: Path | None = None,
    model: dict[str, int | str] | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    accumulate: int | None = None,
) -> TaskConfig:
    """The task from ``--preset`` and/or ``--config``, with command-line overrides applied last
    (``model`` over the task's sizes, key by key)."""
    from game.training.numerics.bandfile import BandsOrigin, load_bands_file
    from game.training.task.catalog import PRESET_NAMES
    from game.training.task.config import TaskConfig, load_config

    overrides: dict[str, Any] = {}
    for key, value in (
        ("steps", steps),
        ("seed", seed),
        ("bits", bits),
        ("tau", tau),
        ("log_format", log_format),
    ):
        if value is not None:
            overrides[key] = float(value) if key == "tau" else value
    origin: BandsOrigin | None = None
    if bands is not None:
        overrides["bands"], origin = load_bands_file(bands)
    if model:
        overrides["model"] = model
    if batch_size is not None:
        overrides["batch_size"] = batch_size
    if accumulate is not None:
        overrides["accumulate"] = accumulate
    if lr is not None:
        overrides["lr"] = float(lr)
    if config is not None:
        cfg = load_config(config)
        if preset is not None and preset != cfg.preset:
            raise ConfigError(
                f"--preset {preset} disagrees with preset {cfg.preset!r} in {config}; pass only one of them"
            )
        cfg = cfg.replace(**overrides) if overrides else cfg
    elif preset is None:
        raise ConfigError(
            f"no task given: pass --preset NAME ({', '.join(PRESET_NAMES)}, or your own as "
            "module:attribute) or --config FILE.toml"
        )
    else:
        cfg = TaskConfig.for_preset(preset, **overrides)
    cfg.check_bands_origin(origin, f"--bands {bands}")
    return cfg
