"""L-BFGS, whose step evaluates the loss again (engine/step.py ``_closure_update``,
state/optstate.py).

Why: it was refused ("its step needs a closure"): the engine ran a step as one forward and
backward and called ``step()`` with nothing. Now its closure runs the step's micro-batches again
(from the step's buffers, with the same draws: the same function), and its state (curvature pairs
in lists, counts and the last loss in Python numbers) is committed with the step. Its steps
evaluate the loss several times, train through either interceptor to the same roots, audit on
another profile, and the judge's re-runs from the committed state agree, with and without its
line search. The paths that cannot evaluate a step's loss again refuse it in one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from game.errors import ConfigError
from game.judgeupdate import judged_step
from game.training.engine.audit import audit
from game.training.engine.states import decode_state
from game.training.engine.train import train
from game.training.native import front
from game.training.parallel.launch import launch
from game.training.state.canonical import encode_state
from game.training.state.checkpoint import parse_state
from game.training.state.tensors import move_state
from game.training.task.config import TaskConfig, load_config
from game.training.transcript.layout import TranscriptPaths
from tests.training.test_carried_optimizer import _with
from tests.training.test_task_api import make_plugin

LBFGS = "torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=4, history_size=3)"
WOLFE = 'torch.optim.LBFGS(m.parameters(), lr=1, max_iter=5, line_search_fn="strong_wolfe")'


def _cfg(root: Path, optimizer: str, **changes: object) -> TaskConfig:
    make_plugin(root, _with(optimizer))
    return load_config(root / "task.toml").replace(
        **{"steps": 4, "checkpoint_interval": 1, "accumulate": 2, **changes}
    )


@pytest.mark.parametrize("optimizer", [LBFGS, WOLFE], ids=["fixed_step", "strong_wolfe"])
def test_lbfgs_evaluatesTheLossAgain_trainsThroughEitherInterceptor_auditsAndIsJudgedAlike(
    tmp_path: Path, optimizer: str
) -> None:
    cfg = _cfg(tmp_path, optimizer)
    out = tmp_path / "t"
    result = train(cfg, "cpu-1t", out)
    with front.disabled():
        python = train(cfg, "cpu-1t", tmp_path / "python")
    assert (python.state_root, python.log_root) == (result.state_root, result.log_root)
    report = audit(out, "noisy")
    assert report.match and report.trainer_state_root == result.state_root
    for step in (2, 4):
        judged = judged_step(out, step, "noisy")
        assert judged.matches_transcript and not judged.rejected, step
    data = TranscriptPaths(out).checkpoint(4).read_bytes()
    state = decode_state(data, cfg)
    kept = state.optimizer.state[state.model.a.weight]
    assert kept["func_evals"] > 4  # the loss was evaluated more than once a step
    assert len(kept["old_dirs"]) >= 2 and type(kept["n_iter"]) is int
    assert encode_state(state) == data
    assert {"optim/a.weight/old_dirs#list", "optim/a.weight/old_dirs#0"} <= set(parse_state(data)[1])


def test_staleGradients_refuseIt_atStepZero(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, LBFGS, max_staleness=1)
    with pytest.raises(ConfigError, match=r"LBFGS\.step evaluates the loss again .*\(max_staleness > 0\)"):
        train(cfg, "cpu-1t", tmp_path / "t")


def test_dataParallelWorkers_refuseIt_atStepOne(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, LBFGS)
    with pytest.raises(ConfigError, match=r"LBFGS evaluates the loss again .* without --workers"):
        launch(cfg, "cpu-1t", tmp_path / "t", 2, search=[tmp_path])


def test_aStateMovedToADevice_takesTheCurvaturePairsWithIt(tmp_path: Path) -> None:
    """A checkpoint is decoded on the CPU and moved to the profile's device: L-BFGS's lists of
    tensors go with the rest (``meta`` stands in for a GPU)."""
    cfg = _cfg(tmp_path, LBFGS, steps=2)
    train(cfg, "cpu-1t", tmp_path / "t")
    state = decode_state(TranscriptPaths(tmp_path / "t").checkpoint(2).read_bytes(), cfg)
    move_state(state, "meta")
    (kept,) = state.optimizer.state.values()  # L-BFGS keeps its state under its first parameter
    held = [kept["d"], *kept["old_dirs"], *kept["old_stps"], *kept["ro"]]
    assert len(held) > 4 and all(t.device.type == "meta" for t in held)
