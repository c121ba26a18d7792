"""A task of one's own (issue 43): found by import path or entry point, its keys declared, its
inputs (data, initial weights, code, libraries) bound by the spec hash, and a party whose inputs
differ refusing before it replays, naming what differs."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from game.errors import ConfigError
from game.training.engine.audit import audit
from game.training.engine.replay import replay_transcript_step
from game.training.engine.runtime import runtime_for
from game.training.engine.states import decode_state, fresh_state
from game.training.engine.train import train
from game.training.state.canonical import encode_state
from game.training.task.config import TaskConfig, load_config
from game.training.task.plugins import code_digest
from game.training.transcript.reader import Transcript

_names = itertools.count()

TASK_PY = """
from pathlib import Path
import torch, torch.nn.functional as F
from torch import nn
from game.api import Task, task

HERE = Path(__file__).parent


class Net(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.a = nn.Linear(4, hidden)
        self.b = nn.Linear(hidden, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


@task(model={"hidden": 8}, params={"warmup": 2, "init": ""}, lr=0.05, batch_size=8, steps=4,
      optimizer="adam")
def build(cfg):
    return Task(
        model=lambda: Net(cfg.model.hidden),
        dataset=HERE / "data.npz",
        loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]),
        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.params.warmup)),
        init_weights=(HERE / cfg.params.init) if cfg.params.init else None,
    )


def plain(cfg):
    return build.build(cfg)


def broken(cfg):
    return "not a task"
"""


def make_plugin(root: Path, body: str = TASK_PY) -> str:
    """A package of its own name under ``root`` (a task module and its data file); returns the name."""
    name = f"vgtask{os.getpid()}_{next(_names)}"
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(textwrap.dedent(body))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 4)).astype(np.float64)
    np.savez(pkg / "data.npz", x=x, y=(x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0))
    (root / "task.toml").write_text(f'task = "{name}.tasks:build"\n')
    return name


def trains_and_audits(
    root: Path, body: str, prepare: Callable[[Path], None] | None = None, **changes: Any
) -> bytes:
    """A task of ``body`` made under ``root`` (``prepare`` given its package's directory first,
    ``changes`` made to its config), trained on ``cpu-1t`` and audited on ``noisy``: the auditor
    must agree. Returns the state root."""
    name = make_plugin(root, body)
    if prepare is not None:
        prepare(root / name)
    cfg = load_config(root / "task.toml").replace(**changes)
    result = train(cfg, "cpu-1t", root / "t")
    report = audit(root / "t", "noisy")
    assert report.match and report.trainer_state_root == result.state_root
    return bytes(result.state_root)


@pytest.fixture
def plugin(tmp_path: Path) -> tuple[Path, str]:
    return tmp_path, make_plugin(tmp_path)


# ----------------------------------------------------------------------------------------------
# Finding a task
# ----------------------------------------------------------------------------------------------


def test_configBesideItsTask_findsIt_withTheDeclaredDefaults(plugin: tuple[Path, str]) -> None:
    root, name = plugin
    cfg = load_config(root / "task.toml")
    assert cfg.task == f"{name}.tasks:build"
    assert (cfg.lr, cfg.batch_size, cfg.steps, cfg.optimizer) == (0.05, 8, 4, "adam")
    assert dict(cfg.model) == {"hidden": 8} and cfg.model.hidden == 8
    assert dict(cfg.params) == {"warmup": 2, "init": ""}
    assert TaskConfig.from_dict(cfg.to_dict()) == cfg  # the transcript's strict form round-trips


def test_declaredKeys_areChecked(plugin: tuple[Path, str]) -> None:
    root, name = plugin
    target = f"{name}.tasks:build"
    load_config(root / "task.toml")  # puts the directory on the search path
    with pytest.raises(
        ConfigError,
        match=r"model\.hiden: unknown size for this task \(did you mean 'hidden'\?\) \(valid: hidden\)",
    ):
        TaskConfig.for_task(target, model={"hiden": 16})
    with pytest.raises(ConfigError, match=r"model\.hidden: expected int"):
        TaskConfig.for_task(target, model={"hidden": "wide"})
    with pytest.raises(
        ConfigError, match=r"warmpu: unknown config key \(did you mean 'warmup'\?\) \(valid: .*\bwarmup\b"
    ):
        TaskConfig.from_dict({"task": target, "warmpu": 3}, partial=True)
    with pytest.raises(ConfigError, match=r"^learning_rate: unknown config key \(valid: "):  # nothing near
        TaskConfig.from_dict({"task": target, "learning_rate": 3}, partial=True)
    cfg = TaskConfig.from_dict({"task": target, "warmup": 5, "model": {"hidden": 16}}, partial=True)
    assert cfg.params.warmup == 5 and cfg.model.hidden == 16
    assert cfg.replace(model={"hidden": 4}).model.hidden == 4


def test_aPlainBuildFunction_isATaskWithNoKeysOfItsOwn(plugin: tuple[Path, str]) -> None:
    root, name = plugin
    load_config(root / "task.toml")
    cfg = TaskConfig.for_task(f"{name}.tasks:plain", model={})
    assert dict(cfg.model) == {} and dict(cfg.params) == {}
    with pytest.raises(ConfigError, match="declares no model sizes"):
        TaskConfig.for_task(f"{name}.tasks:plain", model={"hidden": 3})


def test_entryPoint_namesTheTask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = make_plugin(tmp_path)
    dist = tmp_path / f"{name}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[vgame.tasks]\nep-{name} = {name}.tasks:build\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = TaskConfig.for_task(f"ep-{name}")
    assert cfg.model.hidden == 8 and cfg.inputs().code is not None


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nosuchpkg_vg.tasks:build", "no module named 'nosuchpkg_vg'"),
        ("{name}.tasks:nothere", "has no attribute 'nothere'"),
        ("{name}.tasks:broken", "returned str, not a Task"),
        ("{name}.boom:build", "importing {name}.boom failed: ZeroDivisionError"),
        ("no-such-entry-point", "not a built-in preset"),
    ],
)
def test_aTaskThatCannotLoad_isOneClearError(plugin: tuple[Path, str], target: str, message: str) -> None:
    root, name = plugin
    (root / name / "boom.py").write_text("1 / 0\n")
    load_config(root / "task.toml")
    with pytest.raises(ConfigError, match=message.format(name=name)) as info:
        cfg = TaskConfig.for_task(target.format(name=name))
        cfg.inputs()
    assert "\n" not in str(info.value)


def test_aTaskThatCannotLoad_isOneLine_fromTheCli(plugin: tuple[Path, str]) -> None:
    root, _ = plugin
    (root / "bad.toml").write_text('task = "nosuchpkg_vg.tasks:build"\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "game.cli",
            "train",
            "--config",
            str(root / "bad.toml"),
            "--out",
            str(root / "t"),
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("error: task 'nosuchpkg_vg.tasks:build': no module named"), out.stderr
    assert "Traceback" not in out.stderr


def test_aBugInTheTasksModel_isOneLineNamingIt_andExitCode2_fromTheCli(tmp_path: Path) -> None:
    """A model whose forward fails (here: a width its heads do not divide) is the task's bug: one
    line naming the exception, not a traceback, and not exit code 1 (an audit's mismatch)."""
    body = TASK_PY.replace(
        "        return self.b(torch.tanh(self.a(x)))",
        "        return self.b(torch.tanh(self.a(x))).view(-1, 7)",
    )
    make_plugin(tmp_path, body)
    out = _vgame(tmp_path, "train", "--config", str(tmp_path / "task.toml"), "--out", str(tmp_path / "t"))
    assert out.returncode == 2, out.stderr
    line = "error: the task's loss (its model's forward) raised RuntimeError: shape '[-1, 7]' is invalid"
    said = " ".join(out.stderr.split())  # as the terminal wraps it
    assert said.startswith(line), out.stderr
    assert "Traceback" not in said and said.endswith("(run with VGAME_DEBUG=1 for the traceback)")


def test_aModuleInsteadOfAFactory_isRefused_withTheFix(plugin: tuple[Path, str]) -> None:
    from game.api import Task

    with pytest.raises(ConfigError, match="give a function that builds the model"):
        Task(model=torch.nn.Linear(2, 2), dataset=torch.zeros(3, 2), loss=lambda m, b: b.sum())


# ----------------------------------------------------------------------------------------------
# Binding: every input moves the spec hash
# ----------------------------------------------------------------------------------------------


def _spec_in_fresh_process(root: Path, config: str = "task.toml") -> tuple[str, dict[str, object]]:
    code = (
        "import json, sys; from game.training.task.config import load_config; "
        f"c = load_config({str(root / config)!r}); print(json.dumps([c.spec_hash().hex(), c.inputs().to_dict()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    spec, inputs = json.loads(out.stdout)
    return spec, inputs


def test_oneByteOfData_weights_orCode_changesTheSpecHash(tmp_path: Path) -> None:
    root = tmp_path
    name = make_plugin(root)
    pkg = root / name
    before, inputs = _spec_in_fresh_process(root)
    assert inputs["dataset"]["kind"] == "tensors" and inputs["code"]["name"] == name  # type: ignore[index]

    # data: one value of the file's array
    with np.load(pkg / "data.npz") as npz:
        x, y = npz["x"].copy(), npz["y"]
    x[3, 2] = np.nextafter(x[3, 2], np.inf)
    np.savez(pkg / "data.npz", x=x, y=y)
    after_data, _ = _spec_in_fresh_process(root)
    assert after_data != before

    # code: one byte of the task's module
    src = (pkg / "tasks.py").read_text()
    (pkg / "tasks.py").write_text(src.replace("torch.tanh", "torch.tanh "))
    after_code, _ = _spec_in_fresh_process(root)
    assert after_code != after_data
    (pkg / "__pycache__").mkdir(exist_ok=True)
    (pkg / "__pycache__" / "junk.pyc").write_bytes(b"x")  # not source: not bound
    assert _spec_in_fresh_process(root)[0] == after_code

    # initial weights: a task that fine-tunes, then one value of its weights
    state = {
        "a.weight": torch.ones(8, 4),
        "a.bias": torch.zeros(8),
        "b.weight": torch.ones(3, 8),
        "b.bias": torch.zeros(3),
    }
    from safetensors.torch import save_file

    save_file(state, str(pkg / "w.safetensors"))
    (root / "ft.toml").write_text(f'task = "{name}.tasks:build"\ninit = "w.safetensors"\n')
    ft, ft_inputs = _spec_in_fresh_process(root, "ft.toml")
    assert ft_inputs["init"]["kind"] == "state_dict"  # type: ignore[index]
    state["b.bias"][1] = 1e-3
    save_file(state, str(pkg / "w.safetensors"))
    assert _spec_in_fresh_process(root, "ft.toml")[0] != ft
    # the same values in another container (a .pt file) bind the same task
    torch.save(state, pkg / "w.pt")
    (root / "ft2.toml").write_text(f'task = "{name}.tasks:build"\ninit = "w.pt"\n')
    assert (
        _spec_in_fresh_process(root, "ft2.toml")[1]["init"]
        == _spec_in_fresh_process(root, "ft.toml")[1]["init"]
    )


def test_codeDigest_coversThePackagesSourceFiles_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = make_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    first = code_digest(f"{name}.tasks")
    assert first.kind == "package" and first.detail["files"] == 2
    (tmp_path / name / "notes.txt").write_text("not code")
    assert code_digest(f"{name}.tasks") == first
    (tmp_path / name / "helpers.py").write_text("X = 1\n")
    assert code_digest(f"{name}.tasks").sha256 != first.sha256


# ----------------------------------------------------------------------------------------------
# A party whose inputs differ says which, before replaying
# ----------------------------------------------------------------------------------------------


def _vgame(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "game.cli", *args], capture_output=True, text=True, cwd=root)


@pytest.mark.parametrize("change", ["data", "code", "init"])
def test_anAuditorWithOtherInputs_refusesBeforeReplaying_namingWhat(tmp_path: Path, change: str) -> None:
    root = tmp_path
    name = make_plugin(root)
    pkg = root / name
    from safetensors.torch import save_file

    w = {
        "a.weight": torch.ones(8, 4),
        "a.bias": torch.zeros(8),
        "b.weight": torch.ones(3, 8),
        "b.bias": torch.zeros(3),
    }
    save_file(w, str(pkg / "w.safetensors"))
    (root / "task.toml").write_text(f'task = "{name}.tasks:build"\ninit = "w.safetensors"\nsteps = 2\n')
    trained = _vgame(root, "train", "--config", "task.toml", "--out", "t", "--json")
    assert trained.returncode == 0, trained.stderr
    assert _vgame(root, "audit", "--transcript", "t", "--profile", "noisy", "--json").returncode == 0

    if change == "data":
        with np.load(pkg / "data.npz") as npz:
            x, y = npz["x"].copy(), npz["y"]
        x[0, 0] += 1.0
        np.savez(pkg / "data.npz", x=x, y=y)
        said = "data: the task's is tensors"
    elif change == "code":
        (pkg / "tasks.py").write_text((pkg / "tasks.py").read_text() + "\n# another version\n")
        said = "task code: the task's is package"
    else:
        w["a.bias"][0] = 0.5
        save_file(w, str(pkg / "w.safetensors"))
        said = "initial weights: the task's is state_dict"
    refused = _vgame(root, "audit", "--transcript", "t", "--profile", "noisy")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert said in " ".join(refused.stderr.split())
    assert "replayed" not in refused.stdout


# ----------------------------------------------------------------------------------------------
# What the engine does with a task
# ----------------------------------------------------------------------------------------------


def test_theScheduler_standsWhereTheStepPutsIt_afterACheckpointIsRead(plugin: tuple[Path, str]) -> None:
    root, _ = plugin
    cfg = load_config(root / "task.toml").replace(steps=5, checkpoint_interval=1)
    result = train(cfg, "cpu-1t", root / "t")
    t = Transcript(result.out_dir)
    for step in range(cfg.steps + 1):
        state = decode_state(t.load_checkpoint(step), cfg)
        assert encode_state(state) == t.load_checkpoint(step)
        expected = cfg.lr * min(1.0, (step + 1) / cfg.params.warmup)
        assert state.optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-15)


def test_accumulate_cutsTheBatchInOrder_andStillReplays(plugin: tuple[Path, str]) -> None:
    from game.training.engine.audit import audit

    root, _ = plugin
    cfg = load_config(root / "task.toml").replace(accumulate=4, clip_grad_norm=0.5, steps=3)
    runtime = runtime_for(cfg)
    batch = runtime.batch(2)
    parts = runtime.micro_batches(batch)
    assert [p.example_ids.tolist() for p in parts] == [[8, 9], [10, 11], [12, 13], [14, 15]]
    assert torch.equal(torch.cat([p.data["x"] for p in parts]), batch.data["x"])
    one = train(cfg.replace(accumulate=1), "cpu-1t", root / "one")
    four = train(cfg, "cpu-1t", root / "four")
    assert one.state_root != four.state_root  # a clipped sum of four means is not one mean
    for profile in ("noisy", "splitk-16"):
        report = audit(root / "four", profile)
        assert report.match and report.trainer_state_root == four.state_root


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        ("Adam", "weight_decay=0.01"),
        ("AdamW", "amsgrad=True"),
        ("SGD", "momentum=0.9, nesterov=True"),
        ("Adagrad", ""),
    ],
)
def test_aFusedOptimizer_trainsAsItsForeachPath_andAudits(tmp_path: Path, cls: str, kwargs: str) -> None:
    """``fused=True`` (nanoGPT's choice wherever CUDA is) was refused at step 0. It now runs the
    optimizer's foreach path: every state the same as the same task built ``foreach=True``, and an
    auditor on another profile agrees."""
    roots = {}
    for path in ("fused", "foreach"):
        root = tmp_path / path
        opt = f"torch.optim.{cls}(m.parameters(), lr=cfg.lr, {kwargs + ', ' if kwargs else ''}{path}=True)"
        body = TASK_PY.replace(
            "        init_weights=", f"        optimizer=lambda m: {opt},\n        init_weights="
        )
        roots[path] = trains_and_audits(root, body, steps=3)
    assert roots["fused"] == roots["foreach"]


@pytest.mark.parametrize(
    ("opt", "why"),
    [
        (
            "ASGD(m.parameters(), lr=cfg.lr)",
            "its float32 mu beside float64 averages: the average added twice",
        ),
        (
            "Adafactor(m.parameters(), lr=cfg.lr)",
            "its factored second moments: a row and a column, refused as state",
        ),
    ],
    ids=["asgd", "adafactor"],
)
def test_anOptimizerOfTorch_trainsAudits_andIsJudgedAlike(tmp_path: Path, opt: str, why: str) -> None:
    """Torch's ASGD trained and audited, and the judge's re-run of every step from step 2 on gave
    another leaf; Adafactor stopped after step 1 (``why``). Both now train, audit, and the judge's
    re-run of steps 2 and 3 gives the trainer's leaves."""
    body = TASK_PY.replace(
        "        init_weights=", f"        optimizer=lambda m: torch.optim.{opt},\n        init_weights="
    )
    trains_and_audits(tmp_path, body, steps=3, checkpoint_interval=1)
    for step in (2, 3):
        assert replay_transcript_step(tmp_path / "t", step, "noisy").matches_transcript, why


def test_anOptimizerWithATensorLearningRate_trainsOnItsPerTensorLoop_andAudits(tmp_path: Path) -> None:
    """An ``lr`` given as a tensor (as ``torch.compile`` recipes give it) is refused by torch's
    foreach path without ``capturable``; vgame switched every optimizer to that path, so the task
    stopped at step 1 with torch's ValueError where plain torch on CPU trains it. Such a group keeps
    its per-tensor loop (torch's own choice on CPU), whose ops are rounded one tensor at a time,
    and the auditor agrees."""
    opt = "torch.optim.Adam(m.parameters(), lr=torch.tensor(cfg.lr, dtype=torch.float64))"
    body = TASK_PY.replace(
        "        init_weights=", f"        optimizer=lambda m: {opt},\n        init_weights="
    )
    trains_and_audits(tmp_path, body, steps=3)


@pytest.mark.parametrize(
    ("returned", "pick"),
    [
        ('(loss_of(m, b), {"acc": 0.5})', r"\[0\]"),
        ('{"loss": loss_of(m, b), "logits": m(b["x"])}', r'\["loss"\]'),
        ("types.SimpleNamespace(loss=loss_of(m, b))", r"\.loss"),
    ],
    ids=["tuple", "dict", "output"],
)
def test_aLossReturnedWithMetrics_isOneErrorSayingWhereTheLossIs(
    tmp_path: Path, returned: str, pick: str
) -> None:
    """A loss function written for a framework that logs (``(loss, logs)``, ``{"loss": ...}``, a
    model's output with ``.loss``) was refused as "got tuple" alone."""
    body = TASK_PY.replace(
        "import torch, torch.nn.functional as F", "import types, torch, torch.nn.functional as F"
    )
    body = body.replace(
        '        loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]),',
        f"        loss=lambda m, b: {returned},",
    ).replace("@task(", 'def loss_of(m, b):\n    return F.cross_entropy(m(b["x"]), b["y"])\n\n\n@task(')
    make_plugin(tmp_path, body)
    with pytest.raises(
        ConfigError,
        match=rf"Task\.loss: expected a scalar tensor, got \w+: it holds one at {pick}; return that alone .*Task\.metrics",
    ):
        train(load_config(tmp_path / "task.toml").replace(steps=1), "cpu-1t", tmp_path / "t")


@pytest.mark.parametrize(
    ("returned", "hint"),
    [
        (
            'F.cross_entropy(m(b["x"]), b["y"], reduction="none")',
            r"one loss per example .*\(reduction='none'\); reduce it .*loss\.mean\(\)",
        ),
        (
            'F.cross_entropy(m(b["x"]), b["y"]).reshape(1, 1)',
            r"one value with dimensions; .*loss\.reshape\(\(\)\)",
        ),
        (
            'float(F.cross_entropy(m(b["x"]), b["y"]))',
            r"a Python number, which has no gradient .*return the tensor",
        ),
    ],
    ids=["unreduced", "shaped", "number"],
)
def test_aLossNotAScalarTensor_isOneErrorSayingHowToMakeItOne(
    tmp_path: Path, returned: str, hint: str
) -> None:
    """A loss left per example (``reduction="none"``), kept with dimensions or taken as a Python
    number was refused as "got a tensor of shape (16,)" or "got float" alone."""
    body = TASK_PY.replace(
        '        loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]),',
        f"        loss=lambda m, b: {returned},",
    )
    make_plugin(tmp_path, body)
    with pytest.raises(ConfigError, match=rf"Task\.loss: expected a scalar tensor, got .*: {hint}"):
        train(load_config(tmp_path / "task.toml").replace(steps=1), "cpu-1t", tmp_path / "t")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            'optimizer=lambda m: type("NeedsMore", (torch.optim.SGD,), '
            '{"step": lambda self, closure, scale: None})(m.parameters(), lr=cfg.lr)',
            r"Task\.optimizer: NeedsMore\.step needs closure, scale, .* use an optimizer whose step takes none",
        ),
        (
            'scheduler=lambda opt: type("TwoArgs", (torch.optim.lr_scheduler.ReduceLROnPlateau,), '
            '{"step": lambda self, metrics, other: None})(opt)',
            r"Task\.scheduler: TwoArgs is not .* with nothing or the step's loss given \(its step needs metrics, other",
        ),
    ],
)
def test_anOptimizerOrSchedulerWhoseStepNeedsAnArgument_isRefusedAtStepZeroByName(
    tmp_path: Path, line: str, message: str
) -> None:
    """The engine steps a task's optimizer with nothing given (or a closure, L-BFGS's) and its
    scheduler with nothing or the step's loss: one whose step needs more is refused by name at
    step 0 (L-BFGS had stopped at step 1 with torch's own TypeError)."""
    body = TASK_PY.replace("        init_weights=", f"        {line},\n        init_weights=")
    if "scheduler" in line:
        body = body.replace(
            "        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: "
            "min(1.0, (s + 1) / cfg.params.warmup)),\n",
            "",
        )
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml").replace(steps=2)
    with pytest.raises(ConfigError, match=message):
        train(cfg, "cpu-1t", tmp_path / "t")
    assert not (tmp_path / "t" / "manifest.json").exists()


def test_aModelFromAnUndeclaredLibrary_isRefusedAtStepZero(tmp_path: Path) -> None:
    (tmp_path / "otherlib_vg").mkdir()
    (tmp_path / "otherlib_vg" / "__init__.py").write_text(
        "import torch\nclass Layer(torch.nn.Linear):\n    pass\n"
    )
    body = TASK_PY.replace(
        "self.a = nn.Linear(4, hidden)", "import otherlib_vg; self.a = otherlib_vg.Layer(4, hidden)"
    )
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml")
    with pytest.raises(
        ConfigError, match=r"Layer of otherlib_vg.*add libraries=\('otherlib_vg',\) to the Task"
    ):
        fresh_state(cfg)


def test_overrides_aKeyNoTaskHas_isOneErrorListingTheKeys_andParamsMayBeADict(
    plugin: tuple[Path, str],
) -> None:
    root, _ = plugin
    from game.api import config

    with pytest.raises(
        ConfigError, match=r"no config key 'warmpu': the keys are accumulate, .*declares warmup, init"
    ):
        config(root / "task.toml", warmpu=3)
    assert config(root / "task.toml", params={"warmup": 3}).params.warmup == 3  # type: ignore[attr-defined]
    assert config(root / "task.toml", warmup=3) == config(root / "task.toml", params={"warmup": 3})


def test_aModelThatTakesTheLogOfZero_onLanesItMasksOut_trainsAndAuditsBitExactly(tmp_path: Path) -> None:
    """A log of 0 on lanes the model masks out afterwards (T5's relative-position buckets do this)
    is an inf, which is its own rounding and the same on every machine: it passes unlogged, where
    it used to stop the training at step 1. Trained through the C++ front, audited through the
    Python mode."""
    body = TASK_PY.replace(
        "        return self.b(torch.tanh(self.a(x)))",
        "        h = self.a(x)\n        h = torch.where(h > 0, torch.log(h.clamp_min(0.0)), h)\n"
        "        return self.b(torch.tanh(h))",
    )
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml").replace(steps=4)
    trained = train(cfg, "cpu-1t", tmp_path / "run")
    assert trained.steps_run == 4
    report = audit(tmp_path / "run", "noisy")
    assert report.match and report.trainer_state_root == trained.state_root, report.to_dict()


CTC_PY = """
import torch, torch.nn.functional as F
from torch import nn
from game.api import Task, TensorData, task


class Frames(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)

    def forward(self, x):
        return self.fc(x).log_softmax(-1)


def ctc(model, batch):
    x, y = batch
    log_probs = model(x).transpose(0, 1)  # (time, batch, classes)
    t, n = log_probs.shape[:2]
    lengths = torch.full((n,), t, dtype=torch.long), torch.full((n,), y.shape[1], dtype=torch.long)
    return F.ctc_loss(log_probs, y, *lengths)


@task(model={}, optimizer="adamw", lr=1e-2, batch_size=4, steps=4)
def build(cfg):
    g = torch.Generator().manual_seed(0)
    return Task(model=Frames, dataset=TensorData(torch.randn(16, 10, 4, generator=g, dtype=torch.float64),
                torch.randint(1, 6, (16, 3), generator=g)), loss=ctc)
"""


def test_aCtcLoss_trainsThroughTheFront_andAuditsBitExactlyThroughThePythonMode(tmp_path: Path) -> None:
    """torch's CTC loss sums in log space, where a path that cannot be taken is a log of 0: its
    alphas hold -inf, which now pass the rounding as they are (it stopped at step 1). With length
    tensors the front sees ``_ctc_loss`` and the Python mode ``_ctc_loss.Tensor`` (and the same for
    its backward): the log names both alike (optable.LOG_NAMES), or the audit fails."""
    make_plugin(tmp_path, CTC_PY)
    cfg = load_config(tmp_path / "task.toml")
    trained = train(cfg, "cpu-1t", tmp_path / "run")
    assert trained.steps_run == 4 and trained.final_loss is not None
    report = audit(tmp_path / "run", "noisy")
    assert report.match and report.trainer_state_root == trained.state_root, report.to_dict()
    assert report.rejected_log_steps == ()


def test_aModelWhoseOwnArithmeticGivesNaNAtStepOne_isToldSo_notThatItDiverged(tmp_path: Path) -> None:
    """A log of a negative on lanes the model masks out afterwards is a NaN at step 1, from the
    model as built: the error says so and how to avoid it, not that the training diverged and to
    lower the learning rate."""
    from game.errors import NonFiniteError

    body = TASK_PY.replace(
        "        return self.b(torch.tanh(self.a(x)))",
        "        h = self.a(x)\n        h = torch.where(h > 0, torch.log(h), h)\n"
        "        return self.b(torch.tanh(h))",
    )
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml")
    with pytest.raises(
        NonFiniteError, match=r"at step 1, op #\d+ aten\.log\.default: \d+ NaN.*model's own arithmetic"
    ) as caught:
        train(cfg, "cpu-1t", tmp_path / "run")
    assert "smaller lr" not in str(caught.value)


def test_aTaskRefusedAtStepOne_leavesNoTranscript_andTheFixedRunGoesOnInTheSameOut(tmp_path: Path) -> None:
    """A run stopped in step 1 (here a NaN from the model's own arithmetic) had written leaf 0, so
    the run with the code fixed, into the same ``--out``, was refused as another task's. The
    transcript of leaf 0 alone is removed as the error goes up; the directory, and anything not a
    transcript's in it, stays."""
    from game.errors import NonFiniteError

    body = TASK_PY.replace(
        "        return self.b(torch.tanh(self.a(x)))",
        "        h = self.a(x)\n        h = torch.where(h > 0, torch.log(h), h)\n"
        "        return self.b(torch.tanh(h))",
    )
    make_plugin(tmp_path, body)
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(NonFiniteError):
        train(load_config(tmp_path / "task.toml"), "cpu-1t", out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    make_plugin(tmp_path, TASK_PY)  # the fix
    result = train(load_config(tmp_path / "task.toml"), "cpu-1t", out)
    assert result.steps_run == load_config(tmp_path / "task.toml").steps
    assert (out / "notes.txt").read_text() == "mine"


def test_aTranscriptWithTrainedSteps_isNeverDiscarded(tmp_path: Path) -> None:
    from game.errors import TranscriptError
    from game.training.transcript.writer import TranscriptWriter

    make_plugin(tmp_path, TASK_PY)
    cfg = load_config(tmp_path / "task.toml").replace(steps=2)
    train(cfg, "cpu-1t", tmp_path / "run")
    writer = TranscriptWriter.resume(tmp_path / "run", cfg)
    with pytest.raises(TranscriptError, match="trained steps"):
        writer.discard()
    assert (tmp_path / "run" / "manifest.json").is_file()


@pytest.mark.parametrize("where", ["build", "model"])
def test_aTaskWhoseOwnCodeRaises_whileBeingBuilt_isOneLineNamingIt(tmp_path: Path, where: str) -> None:
    """A build function or a model constructor that raises (a transformers config refusing an odd
    head size) was a traceback from deep in the CLI; it is a TaskCodeError naming what raised. The
    model is built before the transcript is made, so a run with the code fixed is not refused as
    "another task" by the empty transcript the failed one left."""
    from game.errors import TaskCodeError

    if where == "build":
        body = TASK_PY.replace(
            "def build(cfg):\n", "def build(cfg):\n    raise ValueError('odd head size')\n"
        )
    else:
        body = TASK_PY.replace(
            "        super().__init__()\n",
            "        super().__init__()\n        raise ValueError('odd head size')\n",
        )
    make_plugin(tmp_path, body)
    cfg = load_config(tmp_path / "task.toml")
    said = "its build function" if where == "build" else "the task's model factory"
    with pytest.raises(
        TaskCodeError, match=rf"{said} raised ValueError: odd head size \(run with VGAME_DEBUG=1"
    ):
        train(cfg, "cpu-1t", tmp_path / "run")
    assert not list((tmp_path / "run").glob("*"))  # no transcript for the next run to trip over
