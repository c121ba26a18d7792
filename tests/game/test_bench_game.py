"""``vgame bench game``: whole disputes counted, priced and timed (small trees, so it runs in seconds)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from typer.testing import CliRunner

from game.bench.dispute import GameSizeResult, bench_document, measure_game
from game.bench.gas import DISPUTE_GAS_TARGET, MOVE_GAS_TARGET
from game.errors import ConfigError

SIZE_KEYS = {
    "log2_leaves", "leaves", "pinned_step", "transactions", "bisection_txs", "rounds", "rounds_expected",
    "reveal", "respond", "move_gas_max", "dispute_gas", "wall_seconds", "tree_seconds", "targets",
}  # fmt: skip


def check_size(s: GameSizeResult, repeats: int) -> None:
    """What every measured size must satisfy, whatever the chain."""
    rounds = math.ceil(math.log2(s.leaves - 1))
    assert s.rounds == s.rounds_expected == rounds
    assert s.reveal.count == s.respond.count == rounds
    assert s.bisection_txs == 2 * rounds
    assert s.transactions == 1 + 2 * rounds + 1  # challenge, moves, ruling
    assert 21_000 < s.reveal.min <= s.reveal.median <= s.reveal.max <= MOVE_GAS_TARGET
    assert 21_000 < s.respond.min <= s.respond.median <= s.respond.max <= MOVE_GAS_TARGET
    assert s.dispute_gas > s.reveal.min * rounds + s.respond.min * rounds  # plus challenge and ruling
    assert s.dispute_gas <= DISPUTE_GAS_TARGET
    assert all(t["reached"] for t in s.targets().values())
    w = s.wall_seconds
    assert len(w.samples) == repeats and 0 < w.min <= w.median <= w.max


def test_measureGame_smallTree_countsGasAndTime(chain: Any) -> None:
    block = chain.block_number()
    report = measure_game(chain, [4], repeats=2)
    assert chain.block_number() == block  # set-up and every repeat ran inside snapshots
    assert report.chain == "embedded" and report.repeats == 2
    (size,) = report.sizes
    assert size.leaves == 16 and size.transactions == 10
    check_size(size, repeats=2)


def test_benchDocument_jsonKeys(chain: Any) -> None:
    report = measure_game(chain, [3], repeats=1)
    doc = json.loads(json.dumps(bench_document([report])))  # plain JSON, nothing exotic
    assert set(doc) == {"targets", "chains", "all_targets_reached"}
    assert doc["targets"]["move_gas"] == MOVE_GAS_TARGET
    assert doc["targets"]["dispute_gas"] == DISPUTE_GAS_TARGET
    (ch,) = doc["chains"]
    assert set(ch) == {"chain", "description", "repeats", "sizes"}
    (s,) = ch["sizes"]
    assert set(s) == SIZE_KEYS
    assert set(s["wall_seconds"]) == {"median", "min", "max", "samples"}
    assert set(s["reveal"]) == set(s["respond"]) == {"count", "max", "median", "min"}
    assert set(s["targets"]) == {"move_gas", "dispute_gas"}
    assert doc["all_targets_reached"] is True


@pytest.mark.parametrize(("sizes", "repeats"), [([0], 1), ([], 1), ([3], 0)])
def test_measureGame_badArguments_refusedBeforeDeploying(chain: Any, sizes: list[int], repeats: int) -> None:
    block = chain.block_number()
    with pytest.raises(ConfigError):
        measure_game(chain, sizes, repeats=repeats)
    assert chain.block_number() == block


@pytest.mark.anvil
def test_measureGame_anvil_sameGasAsEmbedded(anvil_chain: Any, chain: Any) -> None:
    on_anvil = measure_game(anvil_chain, [4], repeats=1)
    on_embedded = measure_game(chain, [4], repeats=1)
    assert on_anvil.chain == "anvil"
    a, e = on_anvil.sizes[0], on_embedded.sizes[0]
    check_size(a, repeats=1)
    assert (a.transactions, a.reveal, a.respond) == (e.transactions, e.reveal, e.respond)


def test_cli_benchGame_json_leavesRepeatableAndCommaSeparated() -> None:
    from game.cli import _register
    from game.cli.app import app

    _register()
    args = [
        "bench",
        "game",
        "--chain",
        "embedded",
        "--leaves",
        "2,3",
        "--leaves",
        "4",
        "--repeats",
        "1",
        "--json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (ch,) = doc["chains"]
    assert ch["chain"] == "embedded"
    assert [s["log2_leaves"] for s in ch["sizes"]] == [2, 3, 4]
    assert [s["transactions"] for s in ch["sizes"]] == [2 + 2 * 2, 2 + 2 * 3, 2 + 2 * 4]
    assert ch["repeats"] == 1 and all(len(s["wall_seconds"]["samples"]) == 1 for s in ch["sizes"])


@pytest.mark.parametrize(
    "args", [["--leaves", "0"], ["--leaves", "x"], ["--chain", "mainnet"], ["--repeats", "0"]]
)
def test_cli_benchGame_badOptions_exitNonZero(args: list[str]) -> None:
    from game.cli import _register
    from game.cli.app import app

    _register()
    result = CliRunner().invoke(app, ["bench", "game", *args])
    assert result.exit_code != 0


@pytest.mark.parametrize(
    ("given", "sizes"),
    [(["10,20"], [10, 20]), (["2^10", "2**20"], [10, 20]), (["3", "3,2^3"], [3]), (None, [10, 20])],
)
def test_parseLeaves_takesExponentsOrPowersOfTwo(given: list[str] | None, sizes: list[int]) -> None:
    from game.cli.bench_game import parse_leaves

    assert parse_leaves(given) == sizes


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("1024", "1,024 leaves is --leaves 10 (or 2^10)"),  # the "N = 2^10" typed as a count
        ("1048576", "--leaves 20"),
        ("25", "1..24, not 25"),
        ("3^4", "not '3^4'"),
        ("", "at least one size"),
    ],
)
def test_parseLeaves_leafCountOrNonsense_saysWhatToPass(given: str, says: str) -> None:
    import typer

    from game.cli.bench_game import parse_leaves

    with pytest.raises(typer.BadParameter, match=re.escape(says)):
        parse_leaves([given])
