"""``vgame bench gas``: the report is complete and consistent (small trees, so it runs in seconds)."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from game.bench.gas import measure

FUNCTIONS = {
    "deploy",
    "createTask",
    "accept",
    "cancel",
    "commit",
    "challenge",
    "challengeData",
    "provideData",
    "reveal",
    "respond",
    "rule",
    "timeout",
    "finalize",
    "claimReward",
    "withdraw",
}


def test_measure_everyFunctionOnce_andDisputeOfLog2Rounds(chain: Any) -> None:
    block = chain.block_number()
    report = measure(chain, [3, 6])
    assert chain.block_number() == block  # each size ran inside a snapshot
    for size in report.sizes:
        assert set(size.functions) == FUNCTIONS
        assert all(g > 21_000 for g in size.functions.values())
        k = size.log2_leaves
        assert size.rounds_expected == k
        assert size.reveal.count == size.respond.count == k
        assert size.bisection_txs == 2 * k and size.dispute_txs == 2 * k + 2
        assert size.reveal.min <= size.reveal.median <= size.reveal.max
        assert size.dispute_gas >= size.functions["challenge"] + size.functions["rule"] + k * size.reveal.min
        assert 0 < size.max_used_over_limit < 1  # every transaction had gas to spare
    # a deeper tree means longer proofs: the reveal costs more, the response does not
    small, big = report.sizes
    assert big.reveal.max > small.reveal.max


def test_cli_benchGas_json(monkeypatch: Any) -> None:
    from game.cli import _register
    from game.cli.app import app

    _register()
    result = CliRunner().invoke(app, ["bench", "gas", "--sizes", "2,4", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [s["log2_leaves"] for s in doc["sizes"]] == [2, 4]
    for s in doc["sizes"]:
        assert set(s["functions"]) == FUNCTIONS
        assert set(s["targets_met"]) == {"move_gas", "dispute_gas", "bisection_txs"}
        assert s["targets_met"]["bisection_txs"] is True


def test_cli_benchGas_badSizes_exitNonZero() -> None:
    from game.cli import _register
    from game.cli.app import app

    _register()
    result = CliRunner().invoke(app, ["bench", "gas", "--sizes", "0"])
    assert result.exit_code != 0
