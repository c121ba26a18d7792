"""Deploy a committed contract artifact and check the chain holds exactly its runtime code."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3 import Web3

from game.chain.artifacts import GAME_CONTRACT, load_artifact
from game.chain.base import Chain
from game.chain.errors import Reverted, decode_revert
from game.chain.tx import GasPolicy, TxSender
from game.errors import ChainError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deployment:
    address: str
    gas_used: int
    tx_hash: str
    block_number: int


def deploy(
    chain: Chain,
    account: LocalAccount | None = None,
    *,
    name: str = GAME_CONTRACT,
    policy: GasPolicy | None = None,
) -> str:
    """Deploy contract ``name`` (default the game; it has no constructor arguments); its address."""
    return deploy_contract(chain, account, name=name, policy=policy).address


def deploy_contract(
    chain: Chain,
    account: LocalAccount | None = None,
    *,
    name: str = GAME_CONTRACT,
    policy: GasPolicy | None = None,
) -> Deployment:
    """Deploy contract ``name`` and say where and at what cost.

    The deployed runtime code is compared with the artifact's ``deployedBytecode`` (but for the
    immutables the constructor wrote) so a stale or foreign artifact cannot go unnoticed.
    """
    art = load_artifact(name)
    sender = account or chain.account(0)
    try:
        sent = TxSender(chain, policy).send(sender, {"to": None, "data": art.bytecode, "value": 0})
    except Reverted as rev:
        raise decode_revert(rev.data) from None
    address = sent.receipt["contractAddress"]
    if address is None:
        raise ChainError(f"deploying {name} produced no contract address")
    address = Web3.to_checksum_address(address)
    code = bytes(chain.w3.eth.get_code(address))
    if art.deployed_bytecode and not art.is_runtime_code(code):
        raise ChainError(f"{name} at {address} does not hold the artifact's runtime code")
    log.info("deployed %s at %s (gas %d)", name, address, sent.receipt["gasUsed"])
    return Deployment(
        address=address,
        gas_used=int(sent.receipt["gasUsed"]),
        tx_hash="0x" + HexBytes(sent.receipt["transactionHash"]).hex().removeprefix("0x"),
        block_number=int(sent.receipt["blockNumber"]),
    )
