"""The transcript writer's C call (``writer.c``): the same chunk bytes, leaves and files as the Python
writer, for every codec, and it steps aside where its libraries would give other bytes."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from game.chunkleaf import PIECE_BYTES, chunk_leaf
from game.training.engine.train import train
from game.training.log import codec as chunkcodec
from game.training.log.codec import CODECS, LZMA_AUTO_MAX, ZLIB_BEST_MAX, ZLIB_BLOCK
from game.training.log.sparse import SparseStepLog
from game.training.native import library, writerlib
from game.training.state import leafhash, leafnative
from game.training.state.leafhash import CHUNK, leaf_of, level_sizes
from game.training.task.config import TaskConfig
from game.training.transcript import stepwriter
from game.training.transcript.reader import Transcript
from game.training.transcript.writer import TranscriptWriter
from tests.training.helpers import ZLIB_BLOCK_CASES, file_tree, random_sparse_log

SPEC = bytes(range(32))

needs_writer = pytest.mark.skipif(
    not stepwriter.available(), reason="no C compiler, or no zlib, liblzma or OpenSSL headers"
)


def _log(step: int, codec: str, records: int, seed: int = 0) -> SparseStepLog:
    """A sparse log of ``records`` records, sizes and gaps like a training step's."""
    return random_sparse_log(
        step,
        codec=codec,
        records=records,
        seed=seed,
        max_count=20000,
        max_entries=60,
        index_stride=3,
        ops=("aten.mm.default", "aten.addmm.default", "aten.convolution.default"),
    )


@needs_writer
@settings(max_examples=60, deadline=None)
@given(payload=st.binary(min_size=0, max_size=6000), codec=st.sampled_from(["zlib", "lzma"]))
def test_theCCodecs_giveTheBytesOfPythons(payload: bytes, codec: str) -> None:
    assert stepwriter.compress(payload, codec) == chunkcodec.compress_with(payload, codec)


@needs_writer
@settings(max_examples=60, deadline=None)
@given(case=ZLIB_BLOCK_CASES)
def test_theCZlibInBlocks_givesTheBytesOfPythons_onAnyThreads(case: tuple[bytes, int, int, int]) -> None:
    payload, block, level, threads = case
    got = stepwriter.compress(payload, "zlib", level=level, block=block, threads=threads)
    assert got == chunkcodec.zlib_blocks(payload, level, block)


@needs_writer
def test_aLargePayload_theCZlibIsPythons_onOneThreadOrMany() -> None:
    rng = np.random.default_rng(7)
    payload = rng.geometric(0.3, size=ZLIB_BEST_MAX + 3 * ZLIB_BLOCK + 11).astype(np.uint8).tobytes()
    want = chunkcodec.compress_with(payload, "zlib")
    assert want == chunkcodec.zlib_blocks(payload, 1, ZLIB_BLOCK)
    for threads in (1, 3, 64):
        assert stepwriter.compress(payload, "zlib", threads=threads) == want


@needs_writer
@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 128 * CHUNK, 128 * CHUNK + 1, 600_123])
def test_theCLeaf_isPythons(size: int) -> None:
    """``vg_leaf`` against :func:`leafhash.leaf_of`: one chunk or less, two levels, three levels
    (129 chunks and more), chunk edges and a ragged last chunk."""
    state = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8)
    digest = np.empty(32, dtype=np.uint8)
    lib = writerlib.running()
    assert lib is not None
    assert lib.vg_leaf(state.ctypes.data, size, digest.ctypes.data) == 0
    assert digest.tobytes() == leaf_of(state)


@pytest.mark.parametrize(
    "differs", [lambda n: n <= CHUNK, lambda n: len(level_sizes(n)) >= 3], ids=["tiny", "three-levels"]
)
def test_whereTheCLeafWouldDiffer_theWriterStaysInPython(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, differs: Callable[[int], bool]
) -> None:
    """The probe compares the library's leaf with Python's on a tiny state and on one of three
    levels: a difference in either (here, Python's leaf made to differ) keeps every step in Python."""
    if not library.available():
        pytest.skip("no C compiler on this machine")
    honest = leafhash.leaf_of

    def leaf_of_elsewhere(data: Any) -> bytes:
        return bytes(32) if differs(len(memoryview(data).cast("B"))) else honest(data)

    monkeypatch.setattr(writerlib, "_lib", None)
    monkeypatch.setattr(writerlib, "_tried", False)
    monkeypatch.setattr(leafhash, "leaf_of", leaf_of_elsewhere)
    with caplog.at_level(logging.INFO, logger=writerlib.__name__):
        assert not stepwriter.available()
    if "unavailable" not in caplog.text:  # the library built: the probe turned it down
        assert "differs from leafhash's" in caplog.text


@needs_writer
@pytest.mark.parametrize("codec", ["auto", "zlib", "lzma", "stored"])
@pytest.mark.parametrize("records", [0, 8, 120], ids=["empty", "small", "past-lzma-auto-max"])
def test_aStepWrittenByTheCCall_isTheOneThePythonWriterWrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str, records: int
) -> None:
    """Same files byte for byte (chunk, chunk hashes, checkpoint, leaves), for every codec and for
    payloads on both sides of ``LZMA_AUTO_MAX``, whether the C library's thread wrote them
    (``ring``), the C call on the Python thread (``c``) or Python; and each C way wrote every step."""
    cfg = TaskConfig.for_preset("mlp-digits", steps=6, checkpoint_interval=3)
    taken: dict[str, list[bool]] = {"ring": [], "c": []}
    way = "ring"
    honest_finish, honest_push, honest_start = (
        stepwriter.finish_step,
        stepwriter.Ring.push,
        stepwriter.Ring.start,
    )

    def finish_step(*args: Any) -> bytes | None:
        leaf = honest_finish(*args)
        taken[way].append(leaf is not None)
        return leaf

    def push(ring: stepwriter.Ring, *args: Any) -> int:
        taken[way].append(True)
        return honest_push(ring, *args)

    def start() -> stepwriter.Ring | None:
        return None if way == "c" else honest_start()

    monkeypatch.setattr(stepwriter, "finish_step", finish_step)
    monkeypatch.setattr(stepwriter.Ring, "push", push)
    monkeypatch.setattr(stepwriter.Ring, "start", start)
    sizes = set()
    trees = []
    for way in ("ring", "c", "python"):
        out = tmp_path / way
        with stepwriter.disabled() if way == "python" else contextlib.nullcontext():
            writer = TranscriptWriter.create(out, cfg, "cpu-1t")
            for step in range(cfg.steps + 1):
                log = _log(step, codec, records, seed=step)
                chunk = log.prepare(step, cfg.spec_hash()).compressible
                assert chunk is not None
                sizes.add(len(chunk.payload))
                state = np.random.default_rng(step).integers(0, 256, size=4096 + step, dtype=np.uint8)
                writer.append_state(step, memoryview(state.tobytes()), log)
            writer.finish()
        Transcript(out).verify()
        trees.append(file_tree(out))
    assert trees[0] == trees[1] == trees[2]
    assert taken == {"ring": [True] * (cfg.steps + 1), "c": [True] * (cfg.steps + 1)}
    assert sum(name.startswith("checkpoints/") for name in trees[0]) == 3
    if records == 120:
        assert min(sizes) > LZMA_AUTO_MAX
    elif records == 8:
        assert max(sizes) <= LZMA_AUTO_MAX


@needs_writer
@pytest.mark.parametrize(
    ("payload", "codecs"),
    [
        (bytes(3000), ("zlib", "lzma")),
        (np.random.default_rng(2).bytes(3000), ("stored",)),
        (np.random.default_rng(3).bytes(LZMA_AUTO_MAX + 1), ("stored",)),
        (bytes(LZMA_AUTO_MAX + 1), ("zlib",)),
        (np.random.default_rng(4).geometric(0.3, ZLIB_BEST_MAX + 99).astype(np.uint8).tobytes(), ("zlib",)),
        (np.random.default_rng(5).bytes(3 * PIECE_BYTES + 7), ("stored",)),
    ],
    ids=[
        "compressible",
        "incompressible",
        "incompressible-large",
        "compressible-large",
        "zlib-in-blocks",
        "four-pieces",
    ],
)
def test_theCCall_keepsTheSmallestCodec_asPythonDoes(
    tmp_path: Path, payload: bytes, codecs: tuple[str, ...]
) -> None:
    """``auto`` keeps the fewest bytes (lzma only up to ``LZMA_AUTO_MAX``, no compression when
    nothing is gained); the chunk's codec byte says which, and the chunk is Python's, byte for byte.
    Its log-tree leaf is :mod:`game.chunkleaf`'s, a chunk of several pieces too."""
    head = b"head" + bytes(8)
    chunk = chunkcodec.Compressible(head, 6, payload, "auto")
    paths = stepwriter.StepPaths(
        chunk=bytes(tmp_path / "chunk"), chunk_tmp=bytes(tmp_path / ".chunk.tmp"), log_dir=bytes(tmp_path),
        hashes=bytes(tmp_path / "hashes"), checkpoint=None, checkpoint_tmp=None, checkpoint_dir=None,
        leaves=bytes(tmp_path / "leaves"),
    )  # fmt: skip
    leaf = stepwriter.finish_step(chunk, b"the state", paths)
    written = (tmp_path / "chunk").read_bytes()
    assert written == chunk.finish()
    assert written[6] in {CODECS[c] for c in codecs}
    assert leaf == leaf_of(b"the state") == (tmp_path / "leaves").read_bytes()
    assert (tmp_path / "hashes").read_bytes() == chunk_leaf(written)


@needs_writer
def test_aTrainingRun_writesTheSameTranscriptWithOrWithoutTheCCall(tmp_path: Path) -> None:
    """Real steps of cnn-digits, checkpoints among them: the same roots and files either way."""
    cfg = TaskConfig.for_preset("cnn-digits", steps=5, checkpoint_interval=2)
    results = []
    for way in ("c", "python"):
        with stepwriter.disabled() if way == "python" else contextlib.nullcontext():
            results.append(train(cfg, "cpu-1t", tmp_path / way))
    assert (results[0].state_root, results[0].log_root) == (results[1].state_root, results[1].log_root)
    trees = [file_tree(tmp_path / way) for way in ("c", "python")]
    del trees[0]["manifest.json"], trees[1]["manifest.json"]
    assert trees[0] == trees[1]


@needs_writer
def test_aStepTheRingCannotFinish_isWrittenInPython_andTheStepsAfterItToo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the C library cannot compress or hash a step (here: no codec asked for, as a codec that
    failed would leave it), that step and every later one are written in Python, in order, to the
    files the Python writer writes."""
    cfg = TaskConfig.for_preset("mlp-digits", steps=6, checkpoint_interval=3)
    honest = stepwriter.tried_codecs
    asked: list[int] = []

    def tried_codecs(codec: str, size: int) -> tuple[str, ...]:
        asked.append(size)
        return () if len(asked) == 3 else honest(codec, size)  # the third step the ring takes

    trees = []
    for way in ("ring", "python"):
        out = tmp_path / way
        with (
            monkeypatch.context() as patch,
            stepwriter.disabled() if way == "python" else contextlib.nullcontext(),
        ):
            patch.setattr(stepwriter, "tried_codecs", tried_codecs)
            writer = TranscriptWriter.create(out, cfg, "cpu-1t")
            for step in range(cfg.steps + 1):
                log = _log(step, "auto", 8, seed=step)
                writer.append_state(step, memoryview(f"state {step}".encode() * 50), log)
            writer.finish()
        Transcript(out).verify()
        trees.append(file_tree(out))
    assert trees[0] == trees[1]
    assert len(asked) >= 3  # the ring took steps 0-2 (later ones: the C call on the Python thread)


_EXIT_SCRIPT = """
import sys
import numpy as np
from game.training.task.config import TaskConfig
from game.training.transcript import stepwriter
from game.training.log.sparse import SparseStepLog
from game.training.transcript.writer import TranscriptWriter
from tests.training.test_stepwriter import _state

assert stepwriter.available()
cfg = TaskConfig.for_preset("mlp-digits", steps=20, checkpoint_interval=5)
writer = TranscriptWriter.create(sys.argv[1], cfg, "cpu-1t")
for step in range(cfg.steps + 1):
    writer.append_state(step, memoryview(_state(step)), SparseStepLog(step))
sys.exit(0)  # no close: the ring finishes its steps on the way out, with their buffers alive
"""


def _state(step: int) -> bytes:
    """1 MiB, and 128 MiB for the last step (20), which takes the ring's thread long after the
    script's last line."""
    return bytes([step]) * (1 << (27 if step == 20 else 20))


@needs_writer
def test_aProcessThatExitsWithoutClose_stillHasEveryStepTheRingTook(tmp_path: Path) -> None:
    out = tmp_path / "t"
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).parents[2],  # the script imports this module
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = TaskConfig.for_preset("mlp-digits", steps=20, checkpoint_interval=5)
    leaves = (out / "leaves.bin").read_bytes()
    expected = [leaf_of(_state(s)) for s in range(cfg.steps + 1)]
    assert [leaves[i : i + 32] for i in range(0, len(leaves), 32)] == expected
    resumed = TranscriptWriter.resume(out, cfg)
    assert resumed.num_done == cfg.steps + 1


def test_whereTheCCodecsWouldGiveOtherBytes_theWriterStaysInPython(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe at load: a zlib of another version (here, a level the writer does not use) keeps
    every step in Python, and says why."""
    if not library.available():
        pytest.skip("no C compiler on this machine")
    monkeypatch.setattr(writerlib, "_lib", None)
    monkeypatch.setattr(writerlib, "_tried", False)
    monkeypatch.setattr(stepwriter, "compress_with", lambda payload, codec: b"other bytes")
    with caplog.at_level(logging.INFO, logger=writerlib.__name__):
        assert not stepwriter.available()
    assert stepwriter.finish_step(_log(0, "auto", 3).prepare(0, SPEC).compressible, b"s", _no_paths()) is None
    if "unavailable" not in caplog.text:  # the library built: the probe turned it down
        assert "gives other bytes than Python's" in caplog.text


def test_whereTheCZlibInBlocksWouldGiveOtherBytes_theWriterStaysInPython(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe covers the blocks too: a large payload's chunk would otherwise differ by writer."""
    if not library.available():
        pytest.skip("no C compiler on this machine")
    monkeypatch.setattr(writerlib, "_lib", None)
    monkeypatch.setattr(writerlib, "_tried", False)
    monkeypatch.setattr(stepwriter, "zlib_blocks", lambda payload, level, block: b"other bytes")
    with caplog.at_level(logging.INFO, logger=writerlib.__name__):
        assert not stepwriter.available()
    if "unavailable" not in caplog.text:
        assert "its zlib in blocks gives other bytes" in caplog.text


def test_switchedOff_theWriterStaysInPython(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writerlib, "_lib", None)
    monkeypatch.setattr(writerlib, "_tried", False)
    monkeypatch.setenv(stepwriter.ENV_SWITCH, "0")
    assert not stepwriter.available()


def _no_paths() -> stepwriter.StepPaths:
    return stepwriter.StepPaths(
        b"/nonexistent/c", b"/nonexistent/.c.tmp", b"/nonexistent", b"", None, None, None, b""
    )


def test_leaf_isLeafOf_inCOrInPython() -> None:
    """``leafnative.leaf`` (one C call, the GIL released, where the library runs) is the leaf the
    Python definition gives, for one to three levels, and the Python one without the library."""
    data = np.random.default_rng(5).integers(0, 256, 600_001, dtype=np.uint8)
    for n in (0, 1, 4096, 4097, 600_001):
        assert leafnative.leaf(data[:n]) == leaf_of(data[:n].tobytes())
        assert leafnative.leaf(memoryview(data[:n].tobytes())) == leaf_of(data[:n].tobytes())
        with library.disabled():
            assert leafnative.leaf(data[:n]) == leaf_of(data[:n].tobytes())


@needs_writer
def test_aProbeRegisteredAfterTheLoad_stillTurnsTheLibraryDown(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that registers its probe once the library is in use (imported late) has it run at
    once: where it disagrees, the library is not used from then on, and the leaf is Python's."""
    for name in ("_probes", "_lib", "_held", "_why"):
        value = getattr(writerlib, name)
        monkeypatch.setattr(writerlib, name, list(value) if name == "_probes" else value)
    writerlib.add_probe(lambda lib: "a late probe disagrees", order=2)
    assert not stepwriter.available()
    assert stepwriter.describe() == "python (a late probe disagrees)"
    assert leafnative.leaf(b"the state") == leaf_of(b"the state")
