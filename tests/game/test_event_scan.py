"""Scanning for games across a reorganisation: an event mined again lower down is still seen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from game.agents import RESCAN_BLOCKS, games_of_task, next_scan_from
from tests.game.conftest import Setup


def test_nextScanFrom_keepsTheNewestBlocks_neverGoesBack() -> None:
    assert next_scan_from(0, 1000) == 1001 - RESCAN_BLOCKS
    assert next_scan_from(990, 1000) == 990  # never behind where this scan began
    assert next_scan_from(5, 5) == 5


def test_challengeMinedAgainInAReplacedBlock_isStillFound(
    committed_task: Callable[[int], Setup], chain: Any
) -> None:
    """A scan that saw blocks up to N, then a reorganisation: the challenge lands in a new block
    at or below N. A scan position of N + 1 would never look there again, and the trainer would
    lose the game on its clock without having seen it."""
    s = committed_task(65)
    start = chain.block_number()
    fork = chain.snapshot()
    chain.mine(3)  # the blocks the first scan sees, which the reorganisation replaces
    seen, nxt = games_of_task(s.trainer, s.task_id, start)
    assert seen == [] and nxt <= start
    chain.revert(fork)
    gid = s.auditor.challenge(s.task_id).result  # mined in a block the first scan already covered
    assert chain.block_number() < start + 3
    found, again = games_of_task(s.trainer, s.task_id, nxt)
    assert found == [gid] and again <= chain.block_number()
    assert games_of_task(s.trainer, s.task_id, again)[0] == [gid]  # seen again: callers dedupe
