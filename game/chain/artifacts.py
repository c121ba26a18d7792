"""The committed build output of the contracts (ABI + bytecode), so Python users need no compiler.

``contracts/build.mjs`` writes ``game/chain/artifacts/<Name>.json`` as
``{contractName, abi, bytecode, deployedBytecode, immutableRanges, compiler}``; CI checks a fresh
compile matches.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from eth_utils import function_signature_to_4byte_selector

from game.errors import ConfigError

GAME_CONTRACT = "VerificationGame"


@dataclass(frozen=True)
class Artifact:
    """One compiled contract."""

    contract_name: str
    abi: tuple[dict[str, Any], ...]
    bytecode: bytes  # creation code (constructor included)
    deployed_bytecode: bytes  # runtime code, what ``eth_getCode`` returns after deployment
    compiler: Any  # compiler version/settings as the build recorded them
    #: (start, length) of each immutable in the runtime code: zeros in ``deployed_bytecode``, the
    #: values the constructor wrote in the deployed code.
    immutable_ranges: tuple[tuple[int, int], ...] = ()

    def is_runtime_code(self, code: bytes) -> bool:
        """Whether ``code`` (``eth_getCode``) is this contract's runtime code, whatever the values of
        its immutables."""
        if len(code) != len(self.deployed_bytecode):
            return False
        masked = bytearray(code)
        for start, length in self.immutable_ranges:
            masked[start : start + length] = bytes(length)
        return bytes(masked) == self.deployed_bytecode

    def items(self, kind: str) -> list[dict[str, Any]]:
        """ABI entries of one ``type`` ("function", "event", "error", ...)."""
        return [dict(e) for e in self.abi if e.get("type") == kind]

    def entry(self, kind: str, name: str) -> dict[str, Any]:
        for e in self.abi:
            if e.get("type") == kind and e.get("name") == name:
                return dict(e)
        raise ConfigError(f"{self.contract_name} has no {kind} named {name!r}")

    @property
    def abi_list(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.abi]


def _hex(value: Any) -> bytes:
    if isinstance(value, dict):  # solc's {"object": "..."} shape
        value = value.get("object", "")
    text = str(value or "")
    return bytes.fromhex(text[2:] if text.startswith("0x") else text)


@functools.cache
def load_artifact(name: str = GAME_CONTRACT) -> Artifact:
    """Read ``game/chain/artifacts/<name>.json`` (cached: it never changes at run time)."""
    try:
        text = resources.files("game.chain").joinpath("artifacts", f"{name}.json").read_text()
    except (FileNotFoundError, OSError) as exc:
        raise ConfigError(
            f"no build output for contract {name!r} in game/chain/artifacts; run `make contracts`"
        ) from exc
    raw = json.loads(text)
    return Artifact(
        contract_name=raw.get("contractName", name),
        abi=tuple(raw["abi"]),
        bytecode=_hex(raw["bytecode"]),
        deployed_bytecode=_hex(raw.get("deployedBytecode", "")),
        compiler=raw.get("compiler"),
        immutable_ranges=tuple((int(start), int(length)) for start, length in raw.get("immutableRanges", [])),
    )


def abi_signature(entry: dict[str, Any]) -> str:
    """Canonical ``name(type,...)`` of an ABI function/event/error (tuples expanded)."""
    return f"{entry['name']}({','.join(_canonical_type(i) for i in entry.get('inputs', []))})"


def abi_selector(entry: dict[str, Any]) -> bytes:
    return bytes(function_signature_to_4byte_selector(abi_signature(entry)))


def abi_types(entry: dict[str, Any]) -> list[str]:
    return [_canonical_type(i) for i in entry.get("inputs", [])]


def _canonical_type(param: dict[str, Any]) -> str:
    typ = str(param["type"])
    if typ.startswith("tuple"):
        inner = ",".join(_canonical_type(c) for c in param.get("components", []))
        return f"({inner}){typ[len('tuple') :]}"
    return typ
