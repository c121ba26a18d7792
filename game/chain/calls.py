"""One function of a deployed contract, called or sent: what lies between the client's API and the chain.

A view is encoded, run with ``eth_call`` and its outputs decoded by their ABI types; a reply that
does not decode means the contract is gone from its address (:func:`contract_gone`: a chain reset
left no code there, or another contract stands there), one clear :class:`ContractGone` instead of
an ``eth_abi`` traceback. A transaction is encoded, sent by a :class:`~game.chain.tx.TxSender` and
its receipt turned into a :class:`~game.chain.types.TxReceipt` with the contract's events decoded.
A revert, either way, is raised as the contract's own error class.
"""

from __future__ import annotations

from typing import Any

from eth_abi import decode as abi_decode
from eth_abi.exceptions import DecodingError
from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3.contract import Contract

from game.chain import errors as E
from game.chain.artifacts import Artifact, abi_types
from game.chain.base import Chain
from game.chain.errors import Reverted
from game.chain.events import EventDecoder
from game.chain.tx import TxSender
from game.chain.types import TxReceipt
from game.errors import ContractGone


def call_view(
    chain: Chain, contract: Contract, artifact: Artifact, caller: str, fn: str, *args: Any
) -> tuple[Any, ...]:
    """The outputs of the view ``fn(*args)`` of ``contract``, called by ``caller``."""
    data = contract.encode_abi(fn, list(args))
    try:
        raw = chain.call({"to": contract.address, "data": data, "from": caller})
    except Reverted as rev:
        raise E.decode_revert(rev.data) from None
    entry = artifact.entry("function", fn)
    types = [_out_type(o) for o in entry["outputs"]]
    try:
        return tuple(abi_decode(types, raw))
    except DecodingError:  # an empty reply above all: the call reached an address with no code
        raise contract_gone(chain, contract.address, fn) from None


def contract_gone(chain: Chain, address: str, fn: str) -> ContractGone:
    """Why ``fn()``'s reply did not decode, as one clear error: a chain reset (anvil restarted)
    leaves no code at the address, and the empty reply made every node die in an ``eth_abi``
    traceback."""
    where = f"{address} on {chain.describe()}"
    if not chain.w3.eth.get_code(address):  # type: ignore[arg-type]
        return ContractGone(
            f"the game contract is gone from {where}: there is no code at that address (the chain "
            "was reset, e.g. a local anvil started afresh, or the address is wrong)"
        )
    return ContractGone(
        f"the game contract is gone from {where}: what is there does not answer {fn}() as the game "
        "does (the chain was reset and another contract deployed there, or the address is wrong)",
        no_code=False,
    )


def send_function(
    sender: TxSender,
    account: LocalAccount,
    contract: Contract,
    events: EventDecoder,
    fn: str,
    args: list[Any],
    value: int,
    *,
    gas: int | None = None,
    result: tuple[str, str] | None = None,
) -> TxReceipt:
    """Send ``fn(*args)`` with ``value`` wei from ``account`` and wait for it to be mined.

    ``gas`` buys that much instead of estimating; ``result`` = ``(event, field)`` names the value
    the receipt returns (e.g. the id of the task or game the transaction made)."""
    data = contract.encode_abi(fn, args)
    try:
        sent = sender.send(account, {"to": contract.address, "data": data, "value": value}, gas=gas)
    except Reverted as rev:
        raise E.decode_revert(rev.data) from None
    rec = sent.receipt
    decoded = events.decode_receipt(rec, contract.address)
    value_out: int | None = None
    if result is not None:
        ev = next((e for e in decoded if e.name == result[0]), None)
        value_out = int(getattr(ev, result[1])) if ev is not None else None
    return TxReceipt(
        function=fn,
        tx_hash="0x" + HexBytes(rec["transactionHash"]).hex().removeprefix("0x"),
        block_number=int(rec["blockNumber"]),
        gas_used=int(rec["gasUsed"]),
        gas_limit=sent.gas_limit,
        events=decoded,
        result=value_out,
    )


def _out_type(output: dict[str, Any]) -> str:
    return abi_types({"name": "", "inputs": [output]})[0]
