"""The task config: every number training depends on, and its canonical spec hash.

The client posts ``spec_hash()`` on-chain, so two parties agree on a task only if they agree on every
byte of :meth:`TaskConfig.canonical_json`: the config's fields (the general ones, the task's sizes
and its own declared keys), a format version, and the digests of the task's inputs (its data, its
initial weights, its code and the versions of the libraries it declares: :mod:`.inputs`). A task is
a built-in preset or a user's own, named by import path or entry point (:mod:`.plugins`), whose
declaration (:mod:`.declaration`) says which keys a config may set. This module imports no torch;
a user's task module may, when it is loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from game.errors import ConfigError
from game.registry import did_you_mean
from game.training.log import LOG_FORMATS
from game.training.numerics.bandfile import Band, BandsOrigin, BandTable, load_bands_file, preset_bands
from game.training.task import plugins
from game.training.task.catalog import (
    PRESET_INFO,
    PRESET_NAMES,
    ModelShape,
    check_int_range,
    dataset_sha256,
    preset_info,
)
from game.training.task.declaration import Declaration, Table
from game.training.task.define import TaskFactory, as_factory
from game.training.task.inputs import Digest, Inputs
from game.training.task.spec import SPEC_FORMAT, canonical_spec
from game.training.task.values import check_float, coerce, model_from, shape_dict

log = logging.getLogger(__name__)

#: Counter words of the RNG are 32 bits wide (see ``rng.py``): steps and example ids must fit.
MAX_STEPS = 2**32 - 1
MAX_EXAMPLES = 2**32

#: The standard optimizers a task without its own optimizer gets (``optimizer`` key).
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad")

#: Bands of a task that ships none: every op at the band the noisy profile sets for the presets'
#: (2**-35 of the value, 2**-46 of its tensor's top). Calibrate to narrow them (`vgame calibrate`).
DEFAULT_BANDS = BandTable(default=Band(-35, -46))

#: General keys a strict dict (a transcript's config) may lack: added after specs were posted.
OPTIONAL_KEYS = frozenset({"accumulate", "clip_grad_norm", "max_staleness"})

#: General keys left out of :meth:`TaskConfig.to_dict` while they hold their default, so that the
#: specs posted before they existed keep their hash (within one spec format).
OMITTED_AT_DEFAULT = {"max_staleness": 0}

_factories: dict[str, TaskFactory] = {}


def declaration_of(task: str, search: tuple[Path, ...] = ()) -> Declaration:
    """What task ``task`` declares: a preset's from the catalog (no import), a user's from its
    factory (its module imported once a process)."""
    if task in PRESET_INFO:
        return preset_info(task).declaration
    return factory_of(task, search).declaration


def factory_of(task: str, search: tuple[Path, ...] = ()) -> TaskFactory:
    """A user's task factory (a preset's lives in :mod:`.presets`, which imports torch)."""
    if task in PRESET_INFO:
        raise ConfigError(f"task {task!r} is a built-in preset (game.training.task.presets)")
    found = _factories.get(task)
    if found is None:
        loaded = plugins.load(task, search=search)
        found = _factories[task] = as_factory(loaded.factory, task)
        decl = found.declaration
        general = {f.name for f in dataclasses.fields(TaskConfig) if f.init} - {"task", "model", "params"}
        bad = sorted(set(decl.defaults) - general)
        if bad:
            raise ConfigError(
                f"task {task!r} declares defaults for {', '.join(bad)}, which are not config keys"
            )
        clash = sorted(set(decl.params) & (general | {"task", "preset", "model"}))
        if clash:
            raise ConfigError(
                f"task {task!r}: its own keys {', '.join(clash)} clash with general config keys"
            )
    return found


# --------------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskConfig:
    """One training task. Field order is irrelevant to the hash (keys are sorted)."""

    task: str  # a built-in preset's name, "module:attribute", or an entry point's name (plugins.py)
    model: ModelShape | Table  # the task's sizes: a preset's dataclass, or the Table a task declares
    seed: int = 0  # task seed: keys every random draw (init, data order, dropout); 0 <= seed < 2**64
    steps: int = 100  # training steps S; the run has S + 1 state leaves (step 0 is init)
    batch_size: int = 32  # examples per step
    optimizer: str = "sgd"  # the standard optimizer (OPTIMIZERS), for a task that gives none
    lr: float = 0.1  # learning rate (a task's scheduler may change it step by step)
    momentum: float = 0.0  # SGD / RMSprop momentum
    weight_decay: float = 0.0  # SGD, Adam, RMSprop, Adagrad: L2; AdamW: decoupled (matrices only)
    betas: tuple[float, float] = (0.9, 0.99)  # Adam / AdamW betas
    eps: float = 1e-8  # Adam / AdamW / RMSprop / Adagrad epsilon
    dropout: float = 0.0  # dropout probability (models that have dropout)
    accumulate: int = 1  # micro-batches per step: gradients summed in order, one update a step
    clip_grad_norm: float = 0.0  # clip the gradients' total 2-norm to this before the update; 0: off
    #: 0: synchronous (update u applies step u's micro-batches, all computed on state u - 1); B > 0:
    #: an update may apply any micro-batches computed on states u - 1 - B .. u - 1 (a parameter
    #: server's asynchrony), its schedule carried in its log chunk (log/schedule.py)
    max_staleness: int = 0
    bits: int = 32  # rounding grid: float32 with the low 32 - bits mantissa bits zero; 16..32
    tau: float = 0.25  # log threshold as a fraction of the grid ulp; 0 <= tau < 0.5
    checkpoint_interval: int = 10  # k: the trainer keeps a full checkpoint every k steps
    log_format: str = "sparse"  # "sparse" (in-band values only) or "packed" (a trit per value, the paper's)
    bands: BandTable | None = None  # calibrated divergence bands per op; None: the preset's shipped ones
    params: Table = field(default_factory=Table)  # the task's own declared keys (flat in the config)
    #: the inputs' digests, worked out once (not compared, not shown)
    _inputs: Inputs | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.bands is None:
            builtin = self.task in PRESET_INFO
            object.__setattr__(self, "bands", preset_bands(self.task) if builtin else DEFAULT_BANDS)
        self.validate()

    @property
    def preset(self) -> str:
        """The task's name (a preset's, or the plugin's as the config gives it): shown in reports."""
        return self.task

    @property
    def builtin(self) -> bool:
        """Whether the task is one of the presets that ship with vgame."""
        return self.task in PRESET_INFO

    @property
    def band_table(self) -> BandTable:
        """The bands (always set after construction)."""
        assert self.bands is not None
        return self.bands

    @property
    def declaration(self) -> Declaration:
        """What the task declares of its config (sizes, own keys, defaults)."""
        return declaration_of(self.task)

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def for_preset(cls, name: str, **overrides: Any) -> TaskConfig:
        """The task's defaults with ``overrides``; ``model`` may be a dict of size overrides."""
        return cls.from_dict({"task": name, **overrides}, partial=True)

    for_task = for_preset

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, partial: bool = False, search: tuple[Path, ...] = ()
    ) -> TaskConfig:
        """Strict inverse of :meth:`to_dict`; ``partial`` fills missing keys from the task's defaults.

        ``preset`` is read as ``task``. Unknown keys and badly typed values raise ConfigError naming
        the key; a task that cannot be loaded raises its PluginError. ``search``: directories a
        task's module may be found in (a config file's own)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"config: expected a table, got {type(data).__name__}")
        data = dict(data)
        if "preset" in data:
            if "task" in data and data["task"] != data["preset"]:
                raise ConfigError(f"preset {data['preset']!r} and task {data['task']!r}: give one of them")
            data["task"] = data.pop("preset")
        if "task" not in data:
            raise ConfigError(
                "task: missing (a preset: " + ", ".join(PRESET_NAMES) + "; or your own, module:attribute)"
            )
        name = data["task"]
        if not isinstance(name, str) or not name:
            raise ConfigError(f"task: expected a name, got {name!r}")
        decl = declaration_of(name, search)
        known = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name != "params"}
        own: dict[str, Any] = {}
        for key in data:
            if key not in known:
                if key not in decl.params:
                    valid = sorted({*known, *decl.params} - {"task"})
                    hint = did_you_mean(key, valid)
                    raise ConfigError(f"{key}: unknown config key{hint} (valid: {', '.join(valid)})")
                own[key] = data[key]
        values: dict[str, Any] = {"task": name}
        for fname, f in known.items():
            if fname in ("task", "model"):
                continue
            if fname == "bands":
                if fname in data:
                    values[fname] = BandTable.from_dict(data[fname])
                elif not partial:
                    raise ConfigError("bands: missing")
                continue
            if fname in data:
                values[fname] = coerce(fname, data[fname], f.type)
            elif fname in decl.defaults:
                values[fname] = coerce(fname, decl.defaults[fname], f.type)
            elif not partial and fname not in OPTIONAL_KEYS:
                raise ConfigError(f"{fname}: missing")
        values["params"] = decl.table("params", own, partial=True)
        if "model" in data:
            values["model"] = model_from(decl, data["model"], partial=partial)
        elif partial:
            values["model"] = model_from(decl, {}, partial=True)
        else:
            raise ConfigError("model: missing")
        return cls(**values)

    # ---- validation --------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value is out of range."""
        decl = declaration_of(self.task)
        if decl.shape is not None:
            if not isinstance(self.model, decl.shape):
                raise ConfigError(
                    f"model: task {self.task!r} needs {decl.shape.__name__}, got {type(self.model).__name__}"
                )
            self.model.validate()
        elif not isinstance(self.model, Table) or set(self.model) != set(decl.model):
            raise ConfigError(f"model: task {self.task!r} has sizes {sorted(decl.model)}, got {self.model!r}")
        if not isinstance(self.params, Table) or set(self.params) != set(decl.params):
            raise ConfigError(
                f"params: task {self.task!r} declares {sorted(decl.params)}, got {self.params!r}"
            )
        check_int_range("seed", self.seed, 0, 2**64 - 1)
        check_int_range("steps", self.steps, 1, MAX_STEPS)
        check_int_range("batch_size", self.batch_size, 1, 1 << 20)
        if self.steps * self.batch_size >= MAX_EXAMPLES:
            raise ConfigError("steps: steps * batch_size must stay below 2**32 (example ids are 32-bit)")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer: {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        check_float("lr", self.lr, 0.0, math.inf, lo_open=True)
        check_float("momentum", self.momentum, 0.0, 1.0, hi_open=True)
        check_float("weight_decay", self.weight_decay, 0.0, math.inf)
        if not (isinstance(self.betas, tuple) and len(self.betas) == 2):
            raise ConfigError(f"betas: expected two numbers, got {self.betas!r}")
        for i, beta in enumerate(self.betas):
            check_float(f"betas[{i}]", beta, 0.0, 1.0, hi_open=True)
        check_float("eps", self.eps, 0.0, math.inf, lo_open=True)
        check_float("dropout", self.dropout, 0.0, 1.0, hi_open=True)
        check_int_range("accumulate", self.accumulate, 1, self.batch_size)
        if self.batch_size % self.accumulate:
            raise ConfigError(
                f"accumulate: {self.accumulate} micro-batches do not divide batch_size {self.batch_size}"
            )
        check_float("clip_grad_norm", self.clip_grad_norm, 0.0, math.inf)
        check_int_range("max_staleness", self.max_staleness, 0, MAX_STEPS)
        check_int_range("bits", self.bits, 16, 32)
        check_float("tau", self.tau, 0.0, 0.5, hi_open=True)
        check_int_range("checkpoint_interval", self.checkpoint_interval, 1, MAX_STEPS)
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format: {self.log_format!r} is not one of {', '.join(LOG_FORMATS)}")
        if not isinstance(self.bands, BandTable):
            raise ConfigError(f"bands: expected a band table, got {type(self.bands).__name__}")
        self.bands.validate()

    # ---- serialisation -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/TOML-able dict: model as a sub-dict, betas as a list, the task's own keys
        at the top beside the general ones."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if f.name == "model":
                value = shape_dict(value)
            elif f.name == "bands":
                value = self.band_table.to_dict()
            elif f.name == "params":
                out.update(self.params.to_dict())
                continue
            elif isinstance(value, tuple):
                value = list(value)
            elif f.name in OMITTED_AT_DEFAULT and value == OMITTED_AT_DEFAULT[f.name]:
                continue
            out[f.name] = value
        return out

    @property
    def dataset(self) -> str:
        """A built-in preset's data file under game/data/ (a user's task has its own data: inputs())."""
        data_file = declaration_of(self.task).data_file
        if data_file is None:
            raise ConfigError(f"task {self.task!r} is not a preset: its data is its own (inputs())")
        return data_file

    def config_json(self) -> str:
        """The config alone as canonical JSON (what a task builds from: its cache key)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    def inputs(self) -> Inputs:
        """The digests of the task's data, initial weights, code and libraries (:mod:`.inputs`):
        for a preset, its packaged data file; for a user's task, what its build function gives
        (built once a process: hashing a large dataset takes a while)."""
        if self._inputs is None:
            object.__setattr__(self, "_inputs", _inputs_of(self))
        assert self._inputs is not None
        return self._inputs

    def canonical_json(self) -> bytes:
        """The bytes the spec hash covers (:func:`canonical_spec`)."""
        return canonical_spec(self.to_dict(), self.inputs().to_dict())

    def spec_hash(self) -> bytes:
        """SHA-256 of :meth:`canonical_json` (32 bytes; the value the client posts on-chain)."""
        return hashlib.sha256(self.canonical_json()).digest()

    @property
    def scheduled(self) -> bool:
        """Whether the task lets updates apply stale gradients: its chunks then carry the update's
        schedule (:mod:`game.training.log.schedule`)."""
        return self.max_staleness > 0

    @property
    def num_leaves(self) -> int:
        """The state leaves a run of this task has, step 0 (the initialisation) included: steps + 1.
        The client posts it on-chain with the task, and the contract refuses a commitment of any
        other size (the trainer's tree: :attr:`Manifest.num_leaves`)."""
        return self.steps + 1

    def replace(self, **changes: Any) -> TaskConfig:
        """A copy with ``changes`` (validated): general keys, the task's own keys (into ``params``),
        and ``model`` as a dict of size changes."""
        decl = declaration_of(self.task)
        fields = {f.name for f in dataclasses.fields(self) if not f.name.startswith("_")}
        unknown = sorted(k for k in changes if k not in fields and k not in decl.params)
        if unknown:
            own_keys = f"; task {self.task!r} declares {', '.join(decl.params)}" if decl.params else ""
            raise ConfigError(
                f"no config key {', '.join(map(repr, unknown))}: the keys are {', '.join(sorted(fields))}{own_keys}"
            )
        own = {k: changes.pop(k) for k in list(changes) if k in decl.params}
        if isinstance(changes.get("params"), Mapping) and not isinstance(changes["params"], Table):
            own = {**dict(changes.pop("params")), **own}  # a dict of the task's own keys, as ``model``
        if own:
            changes["params"] = decl.table("params", {**dict(self.params), **own}, partial=True)
        if (
            "model" in changes
            and isinstance(changes["model"], Mapping)
            and not isinstance(changes["model"], Table)
        ):
            merged = {**shape_dict(self.model), **changes["model"]}
            changes["model"] = model_from(declaration_of(self.task), merged, partial=True)
        return dataclasses.replace(self, **changes)

    def check_bands_origin(self, origin: BandsOrigin | None, where: str) -> None:
        """Refuse bands calibrated on another task; warn about bands measured at other sizes.

        Bands narrower than the real divergence can cost an honest trainer its dispute, and
        another task's file is a mix-up, never a choice (its ops are other ops). Other sizes may
        be a choice (a calibration at a smaller, cheaper size), so they are only warned about.
        """
        if origin is None:
            return
        if origin.preset != self.task:
            raise ConfigError(
                f"{where} was calibrated on task {origin.preset!r}, not {self.task!r}: "
                f"calibrate this task (`vgame calibrate --config TASK.toml --out FILE`) or leave "
                "the bands out to take the task's default ones"
            )
        try:
            same_model = model_from(declaration_of(self.task), origin.model, partial=True) == self.model
        except ConfigError:
            same_model = False
        if not same_model or origin.batch_size != self.batch_size:
            sizes = ",".join(f"{k}={v}" for k, v in shape_dict(self.model).items())
            log.warning(
                "%s was calibrated on %s; this task is %s at %s, batch size %d. Divergence grows "
                "with sizes: calibrate at the task's (`vgame calibrate --config TASK.toml --model %s "
                "--batch-size %d --out FILE`)",
                where,
                origin.describe(),
                self.task,
                sizes,
                self.batch_size,
                sizes,
                self.batch_size,
            )


def load_config(path: str | Path) -> TaskConfig:
    """Read a TOML task config; keys left out take the preset's defaults."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r}: invalid TOML: {exc}") from exc
    origin = None
    if isinstance(data.get("bands"), str):  # a bands file written by `vgame calibrate`, beside the config
        bands_path = p.parent / data["bands"]
        data["bands"], origin = load_bands_file(bands_path)
    cfg = TaskConfig.from_dict(data, partial=True, search=(p.parent,))
    if origin is not None:
        cfg.check_bands_origin(origin, f"bands file {str(bands_path)!r}")
    return cfg


def load_recorded(config: Mapping[str, Any], inputs: Mapping[str, Any]) -> TaskConfig:
    """A config as someone recorded it with its inputs (a transcript's manifest, a config left in
    the evidence directory), already held to the task's spec hash by the caller
    (:func:`~game.training.task.spec.recorded_spec_hash`), loaded: a user's task's code found here is
    held to the recorded code digest before its module is imported
    (:func:`~game.training.task.plugins.check_recorded_code`). Malformed inputs raise
    :class:`ConfigError`; code that is not the recorded one, its :class:`~.plugins.PluginError`."""
    name = config.get("task", config.get("preset")) if isinstance(config, Mapping) else None
    if isinstance(name, str) and name and name not in PRESET_INFO:
        plugins.check_recorded_code(name, Inputs.from_dict(inputs).code)
    return TaskConfig.from_dict(config)


def example_config(name: str) -> TaskConfig:
    """The example task shipped for preset ``name`` (``game/training/task/presets/<name>.toml``)."""
    preset_info(name)
    text = resources.files("game.training.task").joinpath("presets", f"{name}.toml").read_text("utf-8")
    return loads_config(text)


def loads_config(text: str) -> TaskConfig:
    """Parse a TOML task config from a string (see :func:`load_config`)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: invalid TOML: {exc}") from exc
    return TaskConfig.from_dict(data, partial=True)


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


#: A user's task's inputs by its config's JSON: worked out once a process (a large dataset takes a
#: while to hash, and every copy of a config, ``replace`` included, asks again).
_inputs_cache: dict[str, Inputs] = {}


def _inputs_of(cfg: TaskConfig) -> Inputs:
    """Digests of a task's inputs: a preset's packaged data file; a user's task's own (define.py)."""
    decl = declaration_of(cfg.task)
    if decl.data_file is not None:
        return Inputs(dataset=Digest("file", dataset_sha256(decl.data_file), {"name": decl.data_file}))
    key = cfg.config_json()
    found = _inputs_cache.get(key)
    if found is None:
        data, init, libraries = factory_of(cfg.task).inputs(cfg)
        found = _inputs_cache[key] = Inputs(
            dataset=data, init=init, code=plugins.load(cfg.task).code, libraries=libraries
        )
    return found


__all__ = [
    "DEFAULT_BANDS",
    "LOG_FORMATS",
    "MAX_EXAMPLES",
    "MAX_STEPS",
    "OPTIMIZERS",
    "SPEC_FORMAT",
    "TaskConfig",
    "declaration_of",
    "example_config",
    "factory_of",
    "load_config",
    "load_recorded",
    "loads_config",
]
