"""Secrets on the command line: the data key read from its file or its hex, a key written to its
file (its owner's alone), and the warnings given when a private key or a data key is typed where
every user of the machine can read it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import urllib.parse
from pathlib import Path

from game.cli.app import err_console
from game.errors import ConfigError, VGameError


def warn_key_in_argv(key: str | None, chain: str) -> None:
    """Warn when ``--key`` holds a raw private key for a chain off this machine: a command line is
    readable by every user of the machine (``ps``, ``/proc``) for as long as the process runs, days
    for a node. A keystore file, or ``VGAME_PRIVATE_KEY``, keeps it out. A loopback chain (anvil's
    development accounts, whose keys are public) is not warned about."""
    _warn_secret_in_argv(
        key,
        chain,
        "the private key given with --key",
        "set VGAME_PRIVATE_KEY, or pass a keystore file as --key",
    )


def warn_data_key_in_argv(data_key: str | None, chain: str) -> None:
    """The same for ``--data-key``: whoever reads the data key can read the task's data and model
    from the store, so a node that serves a real network takes it from a file or the environment."""
    _warn_secret_in_argv(
        data_key,
        chain,
        "the data key given with --data-key",
        "pass the key's file as --data-key (`task keygen --out`), or set VGAME_DATA_KEY",
    )


def _warn_secret_in_argv(secret: str | None, chain: str, what: str, remedy: str) -> None:
    if not secret or Path(secret).expanduser().is_file():
        return
    host = urllib.parse.urlparse(chain).hostname if "://" in chain else None
    if host is None or host == "localhost":
        return
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return
    err_console.print(
        f"[yellow]warning:[/] {what} can be read by every user of this machine (`ps`) while the "
        f"command runs; {remedy}",
        soft_wrap=True,
    )


def read_data_key(value: str, option: str = "--data-key") -> bytes:
    """A data key given as 64 hex characters, or as the file that holds them (what ``task keygen
    --out`` and ``task create --data-key-out`` write): a file's name on a command line gives
    nothing away, the key itself can be read by every user of the machine while a node runs."""
    from eth_utils import is_hex

    from game.store.keys import parse_key

    path = Path(value).expanduser()
    if path.is_file():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077 and os.name == "posix":
            err_console.print(
                f"[yellow]warning:[/] {value} (mode {mode:03o}) can be read by other users of this "
                f"machine, and with it the task's data and model: chmod 600 {value}",
                soft_wrap=True,
            )
        try:
            text = path.read_text("ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{option} {value}: the key file cannot be read ({exc})") from exc
        try:
            return parse_key(text)
        except VGameError as exc:
            raise ConfigError(f"{option} {value}: the file does not hold a data key: {exc}") from exc
    if not is_hex(value.strip()):
        raise ConfigError(
            f"{option} {_not_a_key(value)}: no such file, and not a data key (64 hex characters or a "
            "file holding them)"
        )
    return parse_key(value)


_HEX_RUN = re.compile(r"[0-9a-fA-F]{32}")


def _not_a_key(value: str) -> str:
    """``value`` to name in an error, unless it holds a long run of hex: then it is most likely a
    key with a typo (a stray quote or letter), and half a key is not printed either."""
    return "(a mistyped key? not shown)" if _HEX_RUN.search(value) else value


def given_data_key(data_key: str | None) -> bytes:
    """The task's data key from ``--data-key``, else from ``VGAME_DATA_KEY`` (either a file or 64
    hex, :func:`read_data_key`); a clear error when neither is given."""
    given = data_key or os.environ.get("VGAME_DATA_KEY")
    if not given:
        raise ConfigError(
            "the task's data key is needed: pass --data-key FILE (or HEX), or set VGAME_DATA_KEY"
        )
    return read_data_key(given, "--data-key" if data_key else "VGAME_DATA_KEY")


def write_secret(path: Path, text: str) -> bool:
    """Write a key to ``path``: its owner's alone from the first byte (mode 600), whole or not at
    all. A file that holds another key is never overwritten: it may be the only copy of a task's
    key. Returns whether a file was made (False: it held this key already)."""
    from game.fsio import atomic_write

    data = (text + "\n").encode("ascii")
    if path.exists():
        if path.is_file() and path.read_bytes().strip() == data.strip():
            return False
        raise ConfigError(
            f"{path} exists and holds another key (another task's?): name a new file; "
            f"to use the key it holds, pass --data-key {path}"
        )
    atomic_write(path, data, mode=0o600)
    return True
