""":func:`connect`, the one way to get a chain backend, chosen by name.

A backend is chosen by one string everywhere (CLI ``--chain``, agent configs, tests):

* ``"embedded"`` (default): an in-process py-evm chain (web3's ``EthereumTesterProvider``);
* ``"anvil"``: a local anvil node the tool starts on a free loopback port and stops on close;
* ``"http(s)://..."`` or ``"ws(s)://..."``: any JSON-RPC endpoint, signing with a private key.

What a backend offers is :class:`game.chain.base.Chain`; the backends are imported only when
chosen (anvil's and the JSON-RPC one's dependencies stay unloaded for the embedded chain).
"""

from __future__ import annotations

from typing import Any

from game.chain.base import Chain
from game.errors import ConfigError

DEFAULT_CHAIN = "embedded"


def connect(
    spec: str = DEFAULT_CHAIN, *, key: str | None = None, reads_only: bool = False, **options: Any
) -> Chain:
    """Open the chain named by ``spec``: ``embedded``, ``anvil`` or a JSON-RPC URL.

    ``key`` (a hex private key or a keystore file path) is only used by URL backends; without it
    they read ``VGAME_PRIVATE_KEY`` or ``VGAME_KEYSTORE``, and with ``reads_only`` they need none
    (the chain then only reads). Extra ``options`` go to the backend
    (e.g. ``accounts=20`` for embedded, ``block_time`` for anvil).
    """
    spec = (spec or DEFAULT_CHAIN).strip()
    if spec == "embedded":
        from game.chain.embedded import EmbeddedChain

        return EmbeddedChain(**options)
    if spec == "anvil":
        from game.chain.anvil import AnvilChain

        return AnvilChain(**options)
    if spec.startswith(("http://", "https://", "ws://", "wss://")):
        from game.chain.rpc import RpcChain

        return RpcChain(spec, key=key, reads_only=reads_only, **options)
    raise ConfigError(f"unknown chain {spec!r}: use 'embedded', 'anvil' or an http(s)/ws(s) JSON-RPC URL")
