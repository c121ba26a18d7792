"""The contract's events as frozen dataclasses, log decoding, queries and a poller for agents.

Events carry everything an agent needs to act (design rule), so an agent's loop is: poll new
events, decide, send. Field names are the Solidity names in snake_case; enum fields are decoded to
:mod:`game.chain.types` enums; every event also knows where it happened (block, tx, log index).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import requests
from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_utils import event_abi_to_log_topic, to_checksum_address
from hexbytes import HexBytes
from web3.exceptions import Web3RPCError

from game.chain.artifacts import Artifact, abi_types, load_artifact
from game.chain.base import Chain
from game.chain.types import ENUMS, ContractEvent, EndReason, Outcome, snake
from game.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskCreated(ContractEvent):
    task_id: int
    trainer: str
    judge: str
    client: str
    spec_hash: bytes
    key_hash: bytes
    num_leaves: int
    payment: int
    trainer_bond: int
    auditor_bond: int
    clock_allowance: int
    challenge_window: int
    judge_window: int
    commit_window: int
    indexed: ClassVar[tuple[str, ...]] = ("task_id", "trainer", "judge")


@dataclass(frozen=True)
class TaskAccepted(ContractEvent):
    task_id: int
    commit_by: int
    indexed: ClassVar[tuple[str, ...]] = ("task_id",)


@dataclass(frozen=True)
class TaskCancelled(ContractEvent):
    task_id: int
    indexed: ClassVar[tuple[str, ...]] = ("task_id",)


@dataclass(frozen=True)
class Committed(ContractEvent):
    task_id: int
    state_root: bytes
    log_root: bytes
    num_leaves: int
    transcript_id: bytes
    first_leaf: bytes
    last_leaf: bytes
    window_ends: int
    indexed: ClassVar[tuple[str, ...]] = ("task_id",)


@dataclass(frozen=True)
class Challenged(ContractEvent):
    task_id: int
    game_id: int
    auditor: str
    dispute_init: bool
    lo: int
    hi: int
    indexed: ClassVar[tuple[str, ...]] = ("task_id", "game_id", "auditor")


@dataclass(frozen=True)
class DataRequested(ContractEvent):
    game_id: int
    task_id: int
    index: int
    piece: int  # the piece of chunk ``index`` demanded (reduced by its piece count if known yet)
    deadline: int
    indexed: ClassVar[tuple[str, ...]] = ("game_id", "task_id")


@dataclass(frozen=True)
class DataProvided(ContractEvent):
    game_id: int
    task_id: int
    index: int
    piece: int  # the piece of chunk ``index`` posted (the demanded one, reduced by the piece count)
    chunk_length: int  # the whole chunk's length in bytes (its leaf binds it)
    data: bytes  # piece ``piece`` of the log chunk of step ``index``, verified against the log root
    indexed: ClassVar[tuple[str, ...]] = ("game_id", "task_id")


@dataclass(frozen=True)
class WindowExtended(ContractEvent):
    task_id: int
    window_ends: int  # unix time: the challenge window's new end, after a demand the trainer took time over
    indexed: ClassVar[tuple[str, ...]] = ("task_id",)


@dataclass(frozen=True)
class LeafRevealed(ContractEvent):
    game_id: int
    index: int
    leaf: bytes
    trainer_clock_left: int
    indexed: ClassVar[tuple[str, ...]] = ("game_id",)


@dataclass(frozen=True)
class Responded(ContractEvent):
    game_id: int
    agree: bool
    lo: int
    hi: int
    auditor_clock_left: int
    indexed: ClassVar[tuple[str, ...]] = ("game_id",)


@dataclass(frozen=True)
class StepPinned(ContractEvent):
    game_id: int
    task_id: int
    step: int
    pre_leaf: bytes
    post_leaf: bytes
    judge_deadline: int
    indexed: ClassVar[tuple[str, ...]] = ("game_id", "task_id")


@dataclass(frozen=True)
class Ruled(ContractEvent):
    game_id: int
    computed: bytes
    trainer_won: bool
    indexed: ClassVar[tuple[str, ...]] = ("game_id",)


@dataclass(frozen=True)
class GameEnded(ContractEvent):
    game_id: int
    task_id: int
    outcome: Outcome
    reason: EndReason
    winner: str  # the zero address when nobody was shown wrong (Void, Answered)
    indexed: ClassVar[tuple[str, ...]] = ("game_id", "task_id")


@dataclass(frozen=True)
class TaskFinalized(ContractEvent):
    task_id: int
    trainer_paid: bool
    auditor_wins: int  # games that ended AuditorWon; each may claim reward_share
    reward_share: int
    burnt: int
    indexed: ClassVar[tuple[str, ...]] = ("task_id",)


@dataclass(frozen=True)
class RewardPaid(ContractEvent):
    game_id: int
    auditor: str
    amount: int
    indexed: ClassVar[tuple[str, ...]] = ("game_id", "auditor")


@dataclass(frozen=True)
class Credited(ContractEvent):
    account: str
    task_id: int
    amount: int
    indexed: ClassVar[tuple[str, ...]] = ("account", "task_id")


@dataclass(frozen=True)
class Withdrawn(ContractEvent):
    account: str
    amount: int
    indexed: ClassVar[tuple[str, ...]] = ("account",)


EVENT_CLASSES: dict[str, type[ContractEvent]] = {
    cls.__name__: cls
    for cls in (
        TaskCreated,
        TaskAccepted,
        TaskCancelled,
        Committed,
        Challenged,
        DataRequested,
        DataProvided,
        WindowExtended,
        LeafRevealed,
        Responded,
        StepPinned,
        Ruled,
        GameEnded,
        TaskFinalized,
        RewardPaid,
        Credited,
        Withdrawn,
    )
}


@dataclass(frozen=True)
class _EventSpec:
    cls: type[ContractEvent]
    topic: bytes
    names: list[str]  # snake_case, ABI order
    types: list[str]
    indexed: list[bool]


class EventDecoder:
    """topic0 -> event class for one contract ABI; decodes raw logs into dataclasses."""

    def __init__(self, artifact: Artifact | None = None) -> None:
        art = artifact or load_artifact()
        self.by_topic: dict[bytes, _EventSpec] = {}
        self.by_name: dict[str, _EventSpec] = {}
        for entry in art.items("event"):
            cls = EVENT_CLASSES.get(entry["name"])
            if cls is None:
                log.warning(
                    "event %s of %s has no dataclass; it will be skipped", entry["name"], art.contract_name
                )
                continue
            spec = _EventSpec(
                cls=cls,
                topic=bytes(event_abi_to_log_topic(entry)),  # type: ignore[arg-type]
                names=[snake(i["name"]) for i in entry["inputs"]],
                types=abi_types(entry),
                indexed=[bool(i.get("indexed")) for i in entry["inputs"]],
            )
            self.by_topic[spec.topic] = spec
            self.by_name[entry["name"]] = spec

    def decode(self, raw: Any) -> ContractEvent | None:
        """A dataclass for a raw log of this contract, or None for a log it does not know."""
        topics = [bytes(t) for t in raw["topics"]]
        if not topics or topics[0] not in self.by_topic:
            return None
        spec = self.by_topic[topics[0]]
        plain = [t for t, ix in zip(spec.types, spec.indexed, strict=True) if not ix]
        data_values = iter(abi_decode(plain, bytes(raw["data"])))
        topic_values = iter(topics[1:])
        values: dict[str, Any] = {}
        for name, typ, ix in zip(spec.names, spec.types, spec.indexed, strict=True):
            v = abi_decode([typ], next(topic_values))[0] if ix else next(data_values)
            values[name] = v
        annotations = {f.name: str(f.type) for f in fields(spec.cls)}
        for name, v in list(values.items()):
            enum = ENUMS.get(annotations.get(name, ""))
            if enum is not None:
                values[name] = enum(v)
            elif isinstance(v, str) and v.startswith("0x") and len(v) == 42:
                values[name] = to_checksum_address(v)
            elif isinstance(v, bytes | bytearray):
                values[name] = bytes(v)
        return spec.cls(
            **values,
            block_number=int(raw["blockNumber"]),
            tx_hash="0x" + HexBytes(raw["transactionHash"]).hex().removeprefix("0x"),
            log_index=int(raw["logIndex"]),
            address=to_checksum_address(raw["address"]),
        )

    def decode_receipt(self, receipt: Any, address: str) -> tuple[ContractEvent, ...]:
        out = []
        for raw in receipt["logs"]:
            if to_checksum_address(raw["address"]) != to_checksum_address(address):
                continue
            ev = self.decode(raw)
            if ev is not None:
                out.append(ev)
        return tuple(out)

    def topics(self, name: str | None, filters: dict[str, Any]) -> list[Any]:
        """The ``topics`` filter for ``eth_getLogs``: topic0 plus any indexed arguments given."""
        if name is None:
            return [["0x" + t.hex() for t in self.by_topic]]
        spec = self.by_name.get(name)
        if spec is None:
            raise ConfigError(f"no event named {name!r}; known: {sorted(self.by_name)}")
        unknown = set(filters) - set(spec.names)
        if unknown:
            raise ConfigError(f"event {name} has no fields {sorted(unknown)}")
        out: list[Any] = ["0x" + spec.topic.hex()]
        for n, t, ix in zip(spec.names, spec.types, spec.indexed, strict=True):
            if ix:
                out.append(None if n not in filters else "0x" + abi_encode([t], [filters[n]]).hex())
        while out[-1] is None:
            out.pop()
        return out


def _matches(ev: ContractEvent, filters: dict[str, Any]) -> bool:
    for k, want in filters.items():
        have = getattr(ev, k, _MISSING)
        if have is _MISSING:
            return False
        if isinstance(want, str) and isinstance(have, str):
            if want.lower() != have.lower():
                return False
        elif have != want:
            return False
    return True


_MISSING = object()


def get_events(
    chain: Chain,
    address: str,
    name: str | None = None,
    from_block: int = 0,
    to_block: int | str = "latest",
    *,
    decoder: EventDecoder | None = None,
    chunk: int = 100_000,
    **filters: Any,
) -> list[ContractEvent]:
    """Events of the contract at ``address`` in ``[from_block, to_block]``, oldest first.

    ``name`` picks one event; ``filters`` match fields by value (indexed ones go to the node as
    topics; all are checked here too). Ranges are fetched ``chunk`` blocks at a time (a scan from
    block 0 of a public testnet is some 100 queries) because public nodes cap ``eth_getLogs``, each
    its own way (a block range of 10,000, 2,000 or 500, or 10,000 results) and in its own words: a
    range the node refuses, or does not answer in time, is halved until it answers, and the span
    that then answered is kept for the chain's later queries.
    """
    decoder = decoder or EventDecoder()
    topics = decoder.topics(name, filters)
    last = chain.block_number() if to_block == "latest" else int(to_block)
    out: list[ContractEvent] = []
    start = from_block
    span = min(chunk, getattr(chain, "_vgame_log_span", chunk))
    while start <= last:
        end = min(last, start + span - 1)
        try:
            raws = chain.w3.eth.get_logs(
                {
                    "address": to_checksum_address(address),
                    "fromBlock": start,
                    "toBlock": end,
                    "topics": topics,
                }
            )
        except (Web3RPCError, ValueError, requests.Timeout) as exc:
            if end == start:  # one block refused: not a cap on the range
                raise
            span = max(1, (end - start + 1) // 2)
            log.info(
                "the node refused eth_getLogs over %d blocks (%s); asking for %d", end - start + 1, exc, span
            )
            continue
        if span < getattr(chain, "_vgame_log_span", chunk):  # a narrower span answered: keep it
            chain._vgame_log_span = span  # type: ignore[attr-defined]
        for raw in raws:
            ev = decoder.decode(raw)
            if ev is not None and _matches(ev, filters):
                out.append(ev)
        start = end + 1
    out.sort(key=lambda e: (e.block_number, e.log_index))
    return out


@dataclass
class EventPoller:
    """New events since the last poll, for an agent's loop (works on every backend).

    ``poll()`` returns what happened in blocks not seen yet; ``follow()`` yields events forever
    (or until ``stop()`` says so), sleeping ``interval`` seconds between empty polls.
    """

    chain: Chain
    address: str
    names: Iterable[str] | None = None  # None: every event of the contract
    from_block: int = 0  # first block not seen yet
    filters: dict[str, Any] = field(default_factory=dict)
    decoder: EventDecoder = field(default_factory=EventDecoder)

    def poll(self) -> list[ContractEvent]:
        latest = self.chain.block_number()
        if latest < self.from_block:
            return []
        wanted = set(self.names) if self.names is not None else None
        events = get_events(
            self.chain,
            self.address,
            None if wanted is None or len(wanted) != 1 else next(iter(wanted)),
            self.from_block,
            latest,
            decoder=self.decoder,
            **({} if wanted is None or len(wanted) != 1 else self.filters),
        )
        if wanted is None or len(wanted) != 1:
            events = [
                e for e in events if (wanted is None or e.name in wanted) and _matches_loose(e, self.filters)
            ]
        self.from_block = latest + 1
        return events

    def follow(
        self, interval: float = 1.0, stop: Callable[[], bool] | None = None
    ) -> Iterator[ContractEvent]:
        while stop is None or not stop():
            batch = self.poll()
            yield from batch
            if not batch:
                time.sleep(interval)


def _matches_loose(ev: ContractEvent, filters: dict[str, Any]) -> bool:
    """Filters apply to the events that have the field; others pass (mixed-event polling)."""
    relevant = {k: v for k, v in filters.items() if hasattr(ev, k)}
    return _matches(ev, relevant)
