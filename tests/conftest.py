"""Shared fixtures: chains and the deployed game (chain -> deployed game -> clients).

* ``chain``: the embedded py-evm chain with the game deployed once per session; every test runs
  inside a snapshot that is reverted afterwards, so tests see a fresh contract and cannot leak.
* ``game_address``: where the game is deployed on ``chain``.
* ``game_client``: factory ``game_client(who, **options)``; ``who`` is an account index, a
  ``LocalAccount``, or a role name (``client`` 0, ``trainer`` 1, ``judge`` 2, ``auditor`` 3,
  ``auditor2`` 4, ``stranger`` 5).
* ``anvil_chain``: a fresh anvil node per test (tests using it are marked ``anvil``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

# CI replays the same examples every run (a red CI must be reproducible, not a dice roll); locally
# each run explores new ones. Set HYPOTHESIS_PROFILE=ci to reproduce CI's examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# Triton reads TRITON_INTERPRET once, when it is first imported, and a library that a test module
# imports at collection may import Triton (PEFT does): so on a machine without a GPU the switch
# that runs the kernels' tests in Triton's interpreter is set here, before any test module is
# collected, not in those modules, which a module collected before them would make too late.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

ROLES = {"client": 0, "trainer": 1, "judge": 2, "auditor": 3, "auditor2": 4, "stranger": 5}


@pytest.fixture(scope="session")
def _embedded_with_game() -> Iterator[tuple[Any, str]]:
    from game.chain.backends import connect
    from game.chain.deploy import deploy

    with connect("embedded", accounts=10) as chain:
        address = deploy(chain, chain.account(0))
        yield chain, address


@pytest.fixture
def chain(_embedded_with_game: tuple[Any, str]) -> Iterator[Any]:
    """The embedded chain, reverted to the freshly-deployed state after the test."""
    ch, _ = _embedded_with_game
    snap = ch.snapshot()
    try:
        yield ch
    finally:
        ch.revert(snap)


@pytest.fixture
def game_address(chain: Any, _embedded_with_game: tuple[Any, str]) -> str:
    return _embedded_with_game[1]


@pytest.fixture
def game_client(chain: Any, game_address: str) -> Callable[..., Any]:
    from game.chain.client import ClientOptions, VerificationGameClient

    def make(who: int | str | Any = "client", **options: Any) -> VerificationGameClient:
        if isinstance(who, str):
            who = ROLES[who]
        account = chain.account(who) if isinstance(who, int) else who
        return VerificationGameClient(chain, game_address, account, options=ClientOptions(**options))

    return make


@pytest.fixture
def anvil_chain() -> Iterator[Any]:
    from game.chain.anvil import find_anvil
    from game.chain.backends import connect
    from game.errors import ConfigError

    try:
        find_anvil()
    except ConfigError as exc:
        pytest.skip(str(exc))
    with connect("anvil") as ch:
        yield ch


@pytest.fixture
def planted(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """A module on the import path that leaves a mark when it is imported: a task someone names in
    a config they leave, to run their code on the reader's machine. The task's name and the mark's
    path (which must not exist after a reader refused the config)."""
    import sys

    mark, code = tmp_path / "imported", tmp_path / "code"
    code.mkdir()
    (code / "planted_task.py").write_text(f"open({str(mark)!r}, 'w').close()\nbuild = None\n")
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.delitem(sys.modules, "planted_task", raising=False)
    return "planted_task:build", mark
