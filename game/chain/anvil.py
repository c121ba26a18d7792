"""A local anvil node, started by us on a free loopback port and always stopped again.

The node runs in its own process group so stopping it also stops the npm wrapper's child; it is
stopped on :meth:`AnvilChain.close`, on context exit, at interpreter exit and on Ctrl-C. The
binary is found via ``VGAME_ANVIL``, then the pinned npm package under ``contracts/node_modules``
(the native binary first, then the ``.bin`` wrapper), then ``anvil`` on ``PATH``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from game.chain.base import Chain
from game.errors import ChainError, ConfigError

log = logging.getLogger(__name__)

#: anvil's default mnemonic; its first accounts hold 10,000 ether each
ANVIL_MNEMONIC = "test test test test test test test test test test test junk"
_PINNED = "@foundry-rs/anvil@1.7.1"  # as contracts/package.json pins it (a test holds the two equal)
_LISTEN = re.compile(r"Listening on (\S+):(\d+)")

_live: weakref.WeakSet[AnvilChain] = weakref.WeakSet()


def repo_root() -> Path:
    """The source checkout holding ``contracts/`` (game/chain/anvil.py -> ../../..)."""
    return Path(__file__).resolve().parents[2]


def install_hint() -> str:
    """How to get anvil: in a source checkout, the pinned toolchain beside the contracts; for an
    installed package (no ``contracts/`` to run npm in), anvil on PATH."""
    if (repo_root() / "contracts" / "package.json").is_file():
        return "install the pinned toolchain with `npm ci --prefix contracts` (or set VGAME_ANVIL)"
    return f"install anvil (`npm install -g {_PINNED}`, or Foundry's foundryup) and put it on PATH, or set VGAME_ANVIL"


def find_anvil() -> Path:
    """Path of an anvil executable, or a :class:`ConfigError` that says how to install one."""
    env = os.environ.get("VGAME_ANVIL")
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"VGAME_ANVIL={env} is not an executable file")
        return path
    modules = repo_root() / "contracts" / "node_modules"
    # WHY the native binary first: killing the node wrapper alone could orphan the real anvil.
    for native in sorted(modules.glob("@foundry-rs/anvil-*/bin/anvil")):
        if os.access(native, os.X_OK):
            return native
    wrapper = modules / ".bin" / "anvil"
    if wrapper.exists():
        return wrapper
    found = shutil.which("anvil")
    if found:
        return Path(found)
    where = "under contracts/node_modules/ or on PATH" if modules.is_dir() else "on PATH"
    raise ConfigError(f"anvil not found {where}: {install_hint()}")


class AnvilProcess:
    """The anvil child process: start on port 0, read the port it bound, stop by process group."""

    def __init__(self, binary: Path, args: list[str], startup_timeout: float = 30.0) -> None:
        self._log = tempfile.NamedTemporaryFile(prefix="vgame-anvil-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [str(binary), "--host", "127.0.0.1", "--port", "0", *args]
        log.debug("starting %s", " ".join(cmd))
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: we stop the whole group
            )
        except OSError as exc:
            self._cleanup_log()
            raise ChainError(f"could not start anvil ({binary}): {exc}; {install_hint()}") from exc
        try:
            self.url = self._wait_listening(startup_timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_listening(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = Path(self._log.name).read_text(errors="replace")
            m = _LISTEN.search(text)
            if m:
                return f"http://{m.group(1)}:{m.group(2)}"
            if self.proc.poll() is not None:
                raise ChainError(
                    f"anvil exited with code {self.proc.returncode} before listening: {text[-2000:]}"
                )
            time.sleep(0.02)
        raise ChainError(f"anvil did not start listening within {timeout:.0f} s")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the group, then SIGKILL what is left; wait so no zombie stays."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        else:
            # the leader is gone; a wrapper's child may still be in the group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._cleanup_log()

    def _cleanup_log(self) -> None:
        with contextlib.suppress(OSError):
            self._log.close()
            os.unlink(self._log.name)


class AnvilChain(Chain):
    """anvil with automine: every transaction is its own block, like the embedded chain."""

    kind = "anvil"
    supports_time_travel = True

    def __init__(
        self,
        accounts: int = 10,
        chain_id: int | None = None,
        extra_args: list[str] | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        args = ["--accounts", str(accounts), "--mnemonic", ANVIL_MNEMONIC]
        if chain_id is not None:
            args += ["--chain-id", str(chain_id)]
        args += extra_args or []
        self.process = AnvilProcess(find_anvil(), args, startup_timeout)
        _live.add(self)
        try:
            w3 = Web3(Web3.HTTPProvider(self.process.url, request_kwargs={"timeout": 30}))
            _wait_ready(w3, startup_timeout)
            Account.enable_unaudited_hdwallet_features()
            local: list[LocalAccount] = [
                Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}")
                for i in range(accounts)
            ]
            super().__init__(w3, local)
        except BaseException:
            self.process.stop()
            raise
        log.info("anvil up at %s (pid %d)", self.url, self.pid)

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def pid(self) -> int:
        return self.process.pid

    def describe(self) -> str:
        return f"anvil at {self.url} (chain id {self.chain_id})"

    def time_travel(self, seconds: int) -> int:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._rpc("evm_increaseTime", [int(seconds)])
        self._rpc("evm_mine", [])
        return self.now()

    def mine(self, blocks: int = 1) -> None:
        self._rpc("anvil_mine", [hex(blocks)])

    def snapshot(self) -> Any:
        return self._rpc("evm_snapshot", [])

    def revert(self, snapshot_id: Any) -> None:
        if not self._rpc("evm_revert", [snapshot_id]):
            raise ChainError(f"anvil refused to revert to snapshot {snapshot_id}")
        self._forget_nonces()

    def _rpc(self, method: str, params: list[Any]) -> Any:
        resp = self.w3.provider.make_request(method, params)  # type: ignore[arg-type]
        if "error" in resp:
            raise ChainError(f"anvil {method} failed: {resp['error']}")
        return resp.get("result")

    def close(self) -> None:
        if not self.closed:
            self.process.stop()
            log.info("anvil (pid %d) stopped", self.pid)
        super().close()


def _wait_ready(w3: Web3, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            w3.eth.chain_id  # noqa: B018 - the request is the readiness probe
            return
        except Exception as exc:  # connection refused while the node boots
            last = exc
            time.sleep(0.05)
    raise ChainError(f"anvil did not answer JSON-RPC within {timeout:.0f} s: {last}")


@atexit.register
def _stop_all() -> None:
    """Never leave a node running after the interpreter exits (Ctrl-C included)."""
    for chain in list(_live):
        with contextlib.suppress(Exception):
            chain.close()
