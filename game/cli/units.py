"""Amounts and times as a person types and reads them: ``--payment 0.001ether`` read to the wei,
and ``task show``'s fields written out (amounts also in ETH, times in UTC and from now, durations in
days and hours).

Apart from :mod:`game.cli.task` (the commands, their options and what they send) because this is
arithmetic on units, exact and tested on its own, that a command only calls; ``--json`` keeps the
raw values and needs none of it.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import typer

_UNITS = {"wei": 0, "gwei": 9, "eth": 18, "ether": 18}
_AMOUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)\s*$")


def parse_wei(text: str) -> int:
    """An amount for ``--payment`` and the bonds: wei (``1000000000000000``), or a number with a
    unit (``0.001ether``, ``0.001 eth``, ``5gwei``), exact to the wei."""
    m = _AMOUNT.match(str(text).lower())
    if m is None or m.group(2) not in ("", *_UNITS):
        raise typer.BadParameter(f"{text!r} is not an amount: give wei (1000) or a unit (0.001ether, 5gwei)")
    value = Decimal(m.group(1)).scaleb(_UNITS[m.group(2) or "wei"])
    if value != value.to_integral_value():
        raise typer.BadParameter(f"{text!r} is not a whole number of wei")
    return int(value)


_WEI_FIELDS = ("payment", "trainer_bond", "auditor_bond")
_SECONDS_FIELDS = ("clock_allowance", "challenge_window", "judge_window", "commit_window")
_HASH_FIELDS = ("state_root", "log_root", "transcript_id")


def _span(seconds: int) -> str:
    """``90061`` -> ``1d 1h 1m 1s``: a duration as a person reads it."""
    parts = [
        (seconds // 86400, "d"),
        (seconds % 86400 // 3600, "h"),
        (seconds % 3600 // 60, "m"),
        (seconds % 60, "s"),
    ]
    return " ".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


def shown(key: str, value: Any, *, now: int) -> str:
    """A field of ``task show`` for a person: amounts also in ETH, times in UTC and from now,
    durations in days and hours, roots not yet committed said so (``--json`` keeps the raw values)."""
    from datetime import UTC, datetime

    from game import clock

    if key in _WEI_FIELDS:
        return f"{Decimal(value).scaleb(-18).normalize():f} ETH ({value} wei)"
    if key in _SECONDS_FIELDS:
        return f"{_span(value)} ({value} s)"
    if key in _HASH_FIELDS and not int(value, 16):
        return "none yet"
    if key in ("window_ends", "commit_by", "now"):
        if key == "window_ends" and not value:
            return "not started (it opens at the trainer's commit)"
        if key == "commit_by" and not value:
            return "not started (it opens when the trainer accepts)"
        when = datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if key == "now":
            return f"{when} (latest block)"
        ago = "from now" if clock.is_ahead(now, value) else "ago"
        return f"{when} ({_span(abs(clock.seconds_until(now, value)))} {ago})"
    if key in ("trainer_paid", "reward_share") and value is None:
        return "not settled yet"
    return str(value)


__all__ = ["parse_wei", "shown"]
