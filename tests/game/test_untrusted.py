"""Someone else's JSON: nested too deep for the C decoder's stack, it is refused before it is parsed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from game import untrusted
from game.errors import TranscriptError
from game.training.transcript.manifest import Manifest

DEEP = b"[" * 200_000 + b"]" * 200_000


def test_theRecursionLimitThatMadeDeepJsonASegfault_isWhatTheChainLibrariesSet() -> None:
    import game.judge  # noqa: F401  (web3 and py-evm, with py_ecc)

    assert sys.getrecursionlimit() >= 100_000  # why the decoder could run off the C stack


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab'),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=20,
    )
)
def test_nesting_isTheDocumentsDepth_bracketsInsideStringsNotCounted(doc: object) -> None:
    def depth(x: object) -> int:
        if isinstance(x, list):
            return 1 + max((depth(v) for v in x), default=0)
        if isinstance(x, dict):
            return 1 + max((depth(v) for v in x.values()), default=0)
        return 0

    data = json.dumps(doc).encode()
    assert untrusted.nesting(data) == depth(doc)
    assert untrusted.loads(data) == doc


def test_aDocumentNestedTooDeep_isADecodeError_beforeTheDecoderRecurses() -> None:
    import game.judge  # noqa: F401  (the recursion limit raised, as in a node)

    with pytest.raises(json.JSONDecodeError, match="nested deeper than 64 levels"):
        untrusted.loads(DEEP)
    assert untrusted.loads(b"[" * 64 + b"]" * 64) is not None


def test_aTrainersManifestNestedTooDeep_isADamagedTranscript_notADeadProcess(tmp_path: Path) -> None:
    import game.judge  # noqa: F401

    with pytest.raises(TranscriptError, match="is not valid JSON"):
        Manifest.from_json(DEEP, tmp_path / "manifest.json")
