"""Any JSON-RPC endpoint (a testnet, an L2, a node of your own) with one signing key.

The key comes from ``--key`` (hex private key or keystore file), else ``VGAME_PRIVATE_KEY``,
else ``VGAME_KEYSTORE`` (an encrypted JSON keystore; the password from ``VGAME_KEYSTORE_PASSWORD``
or a prompt, when there is a terminal to ask on). The key never leaves this process: transactions
are signed locally.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, cast

import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import HTTPProvider, Web3
from web3.providers import JSONBaseProvider
from web3.types import RPCEndpoint, RPCResponse

from game.chain.base import Chain
from game.errors import ChainError, ConfigError, NodeUnreachable

log = logging.getLogger(__name__)


def load_account(key: str | None = None, *, reads_only: bool = False) -> LocalAccount:
    """A ``LocalAccount`` from a hex key or keystore path, falling back to the environment.

    ``reads_only``: with no key anywhere, a fresh account that holds nothing: a call (``eth_call``)
    needs a sender but no signature, so reading a task asks for no key."""
    key = key or os.environ.get("VGAME_PRIVATE_KEY") or os.environ.get("VGAME_KEYSTORE")
    if not key and reads_only:
        fresh: LocalAccount = Account.create()
        return fresh
    if not key:
        raise ConfigError(
            "a JSON-RPC chain needs a signing key: pass --key 0x... or a keystore file, "
            "or set VGAME_PRIVATE_KEY / VGAME_KEYSTORE"
        )
    hexkey = key[2:] if key.startswith("0x") else key
    is_hex = bool(hexkey) and all(c in "0123456789abcdefABCDEF" for c in hexkey)
    if len(hexkey) == 64 and is_hex:
        acct: LocalAccount = Account.from_key(bytes.fromhex(hexkey))
        return acct
    path = Path(key).expanduser()
    if not path.is_file():  # never echo what may be most of a private key: only a name like a path
        if is_hex or key.startswith("0x"):
            raise ConfigError(f"a hex private key is 64 hex digits (32 bytes); this one has {len(hexkey)}")
        if "/" in key or key.endswith(".json"):
            raise ConfigError(f"no keystore file at {path}")
        raise ConfigError("the key is neither a 64-hex-digit private key nor a keystore file")
    try:
        keystore = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"keystore {path.name} is not readable JSON: {exc}") from exc
    if not isinstance(keystore, dict) or not ({"crypto", "Crypto"} & set(keystore)):
        raise ConfigError(f"{path.name} is not an encrypted keystore (it has no 'crypto' section)")
    password = os.environ.get("VGAME_KEYSTORE_PASSWORD")
    if password is None:
        if not _has_terminal():
            raise ConfigError(
                f"keystore {path.name} needs its password: set VGAME_KEYSTORE_PASSWORD "
                "(there is no terminal to ask on)"
            )
        password = getpass.getpass(f"password for keystore {path.name}: ")
    try:
        secret = Account.decrypt(keystore, password)
    except ValueError as exc:
        raise ConfigError(f"could not decrypt keystore {path.name}: wrong password or corrupt file") from exc
    acct = Account.from_key(secret)
    return acct


def _has_terminal() -> bool:
    """Whether a password prompt has a terminal to ask on (``getpass`` reads ``/dev/tty``, not stdin)."""
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return False
    return True


class RpcChain(Chain):
    """A chain we do not control: no time travel, no snapshots, one account (the key's)."""

    kind = "rpc"
    supports_time_travel = False

    def __init__(
        self, url: str, *, key: str | None = None, timeout: float = 30.0, reads_only: bool = False
    ) -> None:
        provider: Any
        if url.startswith(("ws://", "wss://")):
            provider = SyncWebSocketProvider(url, timeout=timeout)
        else:
            provider = ReportingHTTPProvider(url, request_kwargs={"timeout": timeout})
        w3 = Web3(provider)
        try:
            chain_id = int(w3.eth.chain_id)
        except NodeUnreachable:
            raise  # it names the node and says it does not answer
        except Exception as exc:
            raise ChainError(f"no JSON-RPC node answers at {_redact(url)}: {exc}") from exc
        super().__init__(w3, [load_account(key, reads_only=reads_only)])
        self.url = url
        log.info("connected to %s (chain id %d) as %s", _redact(url), chain_id, self.accounts[0].address)

    def describe(self) -> str:
        return f"JSON-RPC {_redact(self.url)} (chain id {self.chain_id})"

    def close(self) -> None:
        provider = self.w3.provider
        if isinstance(provider, SyncWebSocketProvider):
            provider.close()
        super().close()


class ReportingHTTPProvider(HTTPProvider):
    """web3's HTTP provider, whose transport failures, once its own retries are spent, raise
    :class:`NodeUnreachable` (a ChainError) rather than a ``requests`` exception: callers and the
    CLI handle one error tree, and a long-lived node waits out an outage instead of dying."""

    def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        try:
            return super().make_request(method, params)
        except requests.RequestException as exc:
            raise NodeUnreachable(
                f"the JSON-RPC node at {_redact(self.endpoint_uri or '')} does not answer ({type(exc).__name__})"
            ) from exc


class SyncWebSocketProvider(JSONBaseProvider):
    """Blocking JSON-RPC over one websocket (web3 8 only ships an async websocket provider).

    Requests are strictly one at a time, so the next message on the socket is our answer.
    """

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        super().__init__()
        self.url = url
        self.timeout = timeout
        self._ws: Any = None
        self._stack = contextlib.ExitStack()
        self._lock = threading.Lock()

    def _socket(self) -> Any:
        if self._ws is None:
            from websockets.sync.client import connect as ws_connect

            self._ws = self._stack.enter_context(
                ws_connect(self.url, open_timeout=self.timeout, max_size=None)
            )
        return self._ws

    def close(self) -> None:
        with self._lock:
            self._stack.close()
            self._ws = None

    def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        from websockets.exceptions import WebSocketException

        request = self.encode_rpc_request(method, params)
        with self._lock:
            try:
                ws = self._socket()
                ws.send(request.decode())
                raw = ws.recv(timeout=self.timeout)
            except (OSError, TimeoutError, WebSocketException) as exc:
                # Drop the socket: a late answer to this request must not be read as the next
                # one's, and the next request connects afresh (the node may be back by then).
                with contextlib.suppress(OSError, WebSocketException):
                    self._stack.close()
                self._ws = None
                raise NodeUnreachable(
                    f"the JSON-RPC node at {_redact(self.url)} does not answer ({type(exc).__name__})"
                ) from exc
        return cast(RPCResponse, self.decode_rpc_response(raw if isinstance(raw, bytes) else raw.encode()))

    def is_connected(self, show_traceback: bool = False) -> bool:
        try:
            return "result" in self.make_request(RPCEndpoint("web3_clientVersion"), [])
        except Exception:
            if show_traceback:
                raise
            return False


def _redact(url: str) -> str:
    """Drop the path/query of a URL: provider URLs often embed an API key there."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"
