"""Chain backends, deployment and the typed client of the verification game contract.

The usual entry points, importable from here (loaded on first use, so ``import game.chain.types``
stays cheap and nothing here imports torch)::

    from game.chain import VerificationGameClient, connect
    from game.chain.deploy import deploy                # (a submodule shares the name)

    with connect("embedded") as chain:                  # or "anvil", or an http(s)/ws(s) URL
        address = deploy(chain, chain.account(0))
        client = VerificationGameClient(chain, address, chain.account(0))
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Chain": "game.chain.base",
    "connect": "game.chain.backends",
    "TimeTravelUnsupported": "game.chain.base",
    "deploy_contract": "game.chain.deploy",
    "VerificationGameClient": "game.chain.client",
    "ClientOptions": "game.chain.views",
    "GameHandle": "game.chain.views",
    "GasPolicy": "game.chain.tx",
    "EventPoller": "game.chain.events",
    "get_events": "game.chain.events",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'game.chain' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
