"""A CUDA step's host side on any machine, for the scripts that count or compare its work
(``count_launches.py``, ``graph_stability.py``; issue 46).

A step's sequence of ops and tensors does not depend on their values, so the step runs on CPU
tensors down the CUDA path (``defer_anywhere``, Triton's interpreter switch set so that CPU
tensors are the kernels'), and each Triton kernel is handed to a callback instead of being run
(the step's numbers are then not rounded: only what was launched, and the host's time, mean
anything). Imported before anything of ``game``: Triton reads the switch when its kernels are
first defined.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors are the kernels' (they never run here)

#: What a launch is handed to: (table, kernel name, grid, positional args, keyword args).
OnLaunch = Callable[[str, str, Any, tuple[Any, ...], dict[str, Any]], None]


def stub_kernels(on_launch: OnLaunch) -> str:
    """Replace every rounding kernel, per tensor (table ``tensor``) and per group (``group``), by a
    stand-in that calls ``on_launch`` and runs nothing. Returns the group switch's name
    (``VGAME_GROUPS``). A tree from before the group kernels has the per-tensor table only (so that
    an older tree can be measured with these scripts)."""
    from game.training.numerics import cuda_kernels

    tables = {"tensor": cuda_kernels.KERNELS}
    switch = "VGAME_GROUPS"
    try:
        from game.training.numerics import cuda_groups

        tables["group"] = cuda_groups.GROUP_KERNELS
        switch = cuda_groups.SWITCH
    except ImportError:
        pass

    class Stub:
        def __init__(self, table: str, name: str) -> None:
            self.table, self.name = table, name

        def __getitem__(self, grid: Any) -> Any:
            def launch(*a: Any, **k: Any) -> None:
                on_launch(self.table, self.name, grid, a, k)

            return launch

    for kind, table in tables.items():
        for name in table:
            table[name] = Stub(kind, name)
    return switch


def engines(preset: str, model: str | None, batch_size: int | None, steps: int) -> tuple[Any, dict[int, Any]]:
    """A step engine down the CUDA path on CPU tensors for ``steps`` steps of the task, and the
    trainer's logs of steps ``1 .. steps`` recorded by an ordinary CPU engine (their entries are
    what an auditor's host reads)."""
    from game.cli.options import parse_model_overrides, task_config
    from game.training.dispatch.profiles import get_profile
    from game.training.engine.step import StepEngine

    cfg = task_config(preset, model=parse_model_overrides(model), batch_size=batch_size).replace(steps=steps)
    engine = StepEngine(cfg, get_profile("cpu-1t"))
    engine.defer_anywhere = True
    reference = StepEngine(cfg, get_profile("cpu-1t"))
    state = reference.init_state()
    logs = {s: reference.run_step(state, s, mode="record").log for s in range(1, steps + 1)}
    return engine, logs


def run(main: Callable[[], None]) -> None:
    """``main()``, with a bad preset, model or size said in one line, as the CLI says it."""
    from game.errors import VGameError

    try:
        main()
    except VGameError as exc:
        sys.exit(f"error: {exc}")
