"""The transcript writer's thread: steps reach the disk in order, errors reach the caller, and a
failure never leaves a later step's leaf behind a missing one (the crash-resume invariant)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from game.chunkleaf import chunk_leaf
from game.errors import TranscriptError
from game.training.log import sparse as sparse_mod
from game.training.log.formats import new_step_log
from game.training.log.sparse import SparseStepLog
from game.training.native import library
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig
from game.training.transcript import stepwriter
from game.training.transcript.layout import CHUNK_HASHES_NAME, LEAVES_NAME
from game.training.transcript.pipeline import WRITE_AHEAD
from game.training.transcript.reader import Transcript
from game.training.transcript.writer import TranscriptWriter
from tests.training.helpers import file_tree, random_sparse_log


def _cfg() -> TaskConfig:
    return TaskConfig.for_preset("mlp-digits", model={"hidden": 16}, steps=8, checkpoint_interval=2)


def _state(step: int) -> tuple[bytes, bytes]:
    """Stand-in state bytes of ``step`` and their hash (the writer checks one against the other)."""
    data = f"state {step}".encode()
    return leaf_of(data), data


def _append(writer: TranscriptWriter, step: int, **overrides: Any) -> None:
    leaf, data = _state(step)
    args: dict[str, Any] = {"state_hash": leaf, "checkpoint": data if writer.wants_checkpoint(step) else None}
    args.update(overrides)
    writer.append_step(step, step_log=new_step_log(writer.cfg.log_format, step), **args)


def _append_state(writer: TranscriptWriter, step: int) -> None:
    """:func:`_append` with the state's bytes: the writer hashes them (and keeps them as the checkpoint)."""
    writer.append_state(step, memoryview(_state(step)[1]), new_step_log(writer.cfg.log_format, step))


def _writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before_chunk: Callable[[int], None]
) -> TranscriptWriter:
    """A writer of ``_cfg()`` whose thread calls ``before_chunk(step)`` before it writes a step's files
    (in Python, or in the C call that also compresses and hashes, which asks for the step's paths first)."""
    writer = TranscriptWriter.create(tmp_path / "t", _cfg(), "cpu-1t")
    honest, honest_paths = writer._put_files, writer._step_paths

    def put_files(step: int, *args: Any) -> None:
        before_chunk(step)
        honest(step, *args)

    def step_paths(step: int, checkpoint: bool) -> Any:
        before_chunk(step)
        return honest_paths(step, checkpoint)

    monkeypatch.setattr(writer, "_put_files", put_files)
    monkeypatch.setattr(writer, "_step_paths", step_paths)
    return writer


def _disk_full_at(bad: int) -> Callable[[int], None]:
    def before_chunk(step: int) -> None:
        if step == bad:
            raise OSError(28, "No space left on device")

    return before_chunk


def _on_disk(out: Path, name: str) -> list[bytes]:
    data = (out / name).read_bytes()
    return [data[i : i + 32] for i in range(0, len(data), 32)]


def test_flush_putsEveryAcceptedStepOnDisk_inOrder(tmp_path: Path) -> None:
    cfg = _cfg()
    writer = TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t")
    for step in range(cfg.steps + 1):
        _append(writer, step)
    writer.flush()
    assert _on_disk(tmp_path / "t", LEAVES_NAME) == [_state(s)[0] for s in range(cfg.steps + 1)]
    writer.finish()
    t = Transcript(tmp_path / "t")
    t.verify()
    assert t.checkpoint_steps() == [0, 2, 4, 6, 8]
    assert t.load_checkpoint(4) == _state(4)[1]


def test_aFailedWrite_isRaisedNamingTheStep_andNoLaterLeafLands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg()
    writer = _writer(tmp_path, monkeypatch, _disk_full_at(3))
    with pytest.raises(TranscriptError, match=r"writing step 3 .* No space left on device"):
        for step in range(cfg.steps + 1):  # raised by a later append, or by flush at the latest
            _append(writer, step)
        writer.flush()
    with pytest.raises(TranscriptError, match="writing step 3"):  # and again: the writer is broken
        writer.close()
    out = tmp_path / "t"
    assert _on_disk(out, LEAVES_NAME) == [_state(s)[0] for s in range(3)]
    assert len(_on_disk(out, CHUNK_HASHES_NAME)) == 3
    resumed = TranscriptWriter.resume(out, cfg)
    assert resumed.num_done == 3  # the run goes on from the first step that is not on disk


def test_aFailedWrite_leavingTheWithBlock_isSeenOnce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer's own failure, raised in its ``with`` block, is not logged again on the way out
    (`vgame train` printed it twice); under another error it is logged, once."""
    cfg = _cfg()
    with (
        pytest.raises(TranscriptError, match="writing step 3"),
        _writer(tmp_path / "a", monkeypatch, _disk_full_at(3)) as writer,
    ):
        for step in range(cfg.steps + 1):
            _append(writer, step)
        writer.flush()
    assert "writing step 3" not in caplog.text
    with pytest.raises(KeyError), _writer(tmp_path / "b", monkeypatch, _disk_full_at(3)) as writer:
        for step in range(4):
            _append(writer, step)
        raise KeyError("the caller's own error")
    assert caplog.text.count("writing step 3") == 1


def test_close_thenMoreSteps_startsTheThreadAgain_andLosesNone(tmp_path: Path) -> None:
    """``close`` stops the thread once every step is written; a later append starts a new one,
    which takes the steps from where the first stopped."""
    cfg = _cfg()
    writer = TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t")
    for part in (range(0, 4), range(4, 5), range(5, cfg.steps + 1)):
        for step in part:
            _append(writer, step)
        writer.close()
        assert _on_disk(tmp_path / "t", LEAVES_NAME) == [_state(s)[0] for s in range(part.stop)]
    assert writer.leaves == [_state(s)[0] for s in range(cfg.steps + 1)]
    writer.finish()
    Transcript(tmp_path / "t").verify()


def test_anErrorOfTheCaller_stillWritesTheQueuedSteps(tmp_path: Path) -> None:
    cfg = _cfg()
    with (
        pytest.raises(RuntimeError, match="the trainer stopped"),
        TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t") as writer,
    ):
        for step in range(WRITE_AHEAD + 3):
            _append(writer, step)
        raise RuntimeError("the trainer stopped")
    assert _on_disk(tmp_path / "t", LEAVES_NAME) == [_state(s)[0] for s in range(WRITE_AHEAD + 3)]


def test_checkpointBytesThatDoNotHashToTheLeaf_areRefusedNamingTheStep(tmp_path: Path) -> None:
    cfg = _cfg()
    writer = TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t")
    _append(writer, 0)
    _append(writer, 1)
    _append(writer, 2, checkpoint=b"other bytes")
    with pytest.raises(TranscriptError, match="checkpoint bytes of step 2 do not hash"):
        writer.flush()
    assert len(_on_disk(tmp_path / "t", LEAVES_NAME)) == 2
    assert len(_on_disk(tmp_path / "t", CHUNK_HASHES_NAME)) == 2  # checked before any file of the step


def test_appendStep_refusesOutOfOrderSteps_andAMissingCheckpoint_atOnce(tmp_path: Path) -> None:
    cfg = _cfg()
    writer = TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t")
    with pytest.raises(TranscriptError, match="expected step 0, got 1"):
        _append(writer, 1)
    with pytest.raises(TranscriptError, match="step 0 is a checkpoint step"):
        _append(writer, 0, checkpoint=None)
    _append(writer, 0)
    writer.close()


def test_appendState_hashesOnTheThread_andWritesTheSameBytesAsTheCheckpoint(tmp_path: Path) -> None:
    """Steps queued with their state bytes get the same leaves, checkpoints and roots as steps queued
    with their hashes, mixed in one run; ``leaves`` waits for the thread's hashes."""
    cfg = _cfg()
    roots = []
    for k, by_bytes in enumerate(({2, 3, 4, 6}, set(range(cfg.steps + 1)), set())):
        out = tmp_path / f"t{k}"
        writer = TranscriptWriter.create(out, cfg, "cpu-1t")
        for step in range(cfg.steps + 1):
            if step in by_bytes:
                data = memoryview(bytearray(_state(step)[1]))
                writer.append_state(step, data, new_step_log(cfg.log_format, step))
            else:
                _append(writer, step)
        assert writer.num_done == cfg.steps + 1
        assert writer.leaves == [_state(s)[0] for s in range(cfg.steps + 1)]
        manifest = writer.finish()
        roots.append(manifest.state_root)
        t = Transcript(out)
        t.verify()
        assert t.checkpoint_steps() == [0, 2, 4, 6, 8]
        assert [t.load_checkpoint(s) for s in (2, 4)] == [_state(2)[1], _state(4)[1]]
    assert roots[0] == roots[1] == roots[2]


def test_appendState_afterAFailedWrite_hasNoLeaf_andLeavesRaises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg()
    writer = _writer(tmp_path, monkeypatch, _disk_full_at(1))
    writer.append_state(0, memoryview(_state(0)[1]), new_step_log(cfg.log_format, 0))
    writer.append_state(1, memoryview(_state(1)[1]), new_step_log(cfg.log_format, 1))
    with pytest.raises(TranscriptError, match="writing step 1"):
        writer.leaves  # noqa: B018 (the property waits for the thread)
    assert _on_disk(tmp_path / "t", LEAVES_NAME) == [_state(0)[0]]


def test_ctrlC_whileWaitingForTheThread_leavesTheStepOut_andCloseStillWrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt inside a queue's lock could leave it held and hang ``close`` (a ``vgame
    train`` did after Ctrl-C). The writer holds no lock across Python code: a Ctrl-C while a step
    waits for room comes out with the step not taken, and ``close`` writes the ones taken."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        writer = _writer(tmp_path, monkeypatch, lambda step: time.sleep(0.3))
        for step in range(WRITE_AHEAD + 1):  # the thread writes one, WRITE_AHEAD wait: no room
            _append(writer, step)
        main = threading.main_thread().ident
        assert main is not None
        timer = threading.Timer(0.1, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            _append(writer, WRITE_AHEAD + 1)  # waits for room; the signal comes meanwhile
        timer.join()
        assert writer.num_done == WRITE_AHEAD + 1  # the step was not taken
        _append(writer, WRITE_AHEAD + 1)  # and can be appended again
        writer.close()  # returns: nothing was left held
        assert _on_disk(tmp_path / "t", LEAVES_NAME) == [_state(s)[0] for s in range(WRITE_AHEAD + 2)]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_aStateTheThreadHashesAtOnce_stillGetsItsLeaf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread may write a step before the caller's ``append_state`` returns; the leaf's place
    must already be there."""
    cfg = _cfg()
    writer = TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t")

    class WakeAndWait:
        """The thread's wake-up, which returns once the thread has written every step."""

        def __init__(self, wake: Any) -> None:
            self.wake = wake

        def get(self) -> None:
            self.wake.get()

        def put(self, item: None) -> None:
            self.wake.put(item)
            while writer._written < writer.num_done:
                time.sleep(0.001)

    monkeypatch.setattr(writer, "_wake", WakeAndWait(writer._wake))
    with stepwriter.disabled():  # else the C library's thread takes them, not the Python one
        for step in range(3):
            writer.append_state(step, memoryview(_state(step)[1]), new_step_log(cfg.log_format, step))
        assert writer.leaves == [_state(s)[0] for s in range(3)]
        writer.close()


def test_withoutTheCLibrary_onePythonThreadWritesEveryStep(tmp_path: Path) -> None:
    """Steps queued with their state's bytes go to the C library's thread where it runs; where it
    does not, the Python thread takes them, one thread for the whole run (not one a step)."""
    cfg = _cfg()
    with stepwriter.disabled():
        writer = TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t")
        threads = set()
        for step in range(cfg.steps + 1):
            _append_state(writer, step)
            threads.add(writer._thread)
        writer.close()
    assert len(threads) == 1 and None not in threads
    assert _on_disk(tmp_path / "t", LEAVES_NAME) == [_state(s)[0] for s in range(cfg.steps + 1)]


def test_stepsByHashAndByState_mixed_landInOrder_whicheverThreadTakesThem(tmp_path: Path) -> None:
    """A step queued by its hash goes to the Python thread, one with its state's bytes to the C
    library's: each waits for the other's steps before it, so the leaves land in step order."""
    cfg = _cfg()
    writer = TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t")
    for step in range(cfg.steps + 1):
        if step in (2, 3, 6):
            _append(writer, step)
        else:
            _append_state(writer, step)
    writer.finish()
    assert _on_disk(tmp_path / "t", LEAVES_NAME) == [_state(s)[0] for s in range(cfg.steps + 1)]
    Transcript(tmp_path / "t").verify()


class _OnDevice:
    """A state hashed where it lives (as :class:`~game.training.state.device_leaf.DeviceLeaf` on a GPU),
    standing in for one: its leaf, and the bytes it says it hashed, when asked."""

    def __init__(self, step: int, leaf: bytes | None = None) -> None:
        self.data = _state(step)[1]
        self._leaf = leaf if leaf is not None else _state(step)[0]
        self.asked: list[str] = []

    def leaf(self) -> bytes:
        self.asked.append("leaf")
        return self._leaf

    def canonical_bytes(self) -> bytearray:
        self.asked.append("bytes")
        return bytearray(self.data)


def test_appendPending_waitsOnTheThread_andWritesWhatAppendStateWrites(tmp_path: Path) -> None:
    """Steps whose states were hashed on their device leave the same files as steps queued with
    their bytes; their bytes are copied back only on checkpoint steps."""
    cfg = _cfg()
    trees, pendings = [], []
    for way in ("state", "pending"):
        out = tmp_path / way
        writer = TranscriptWriter.create(out, cfg, "cpu-1t")
        for step in range(cfg.steps + 1):
            if way == "state":
                _append_state(writer, step)
            else:
                pendings.append(_OnDevice(step))
                writer.append_pending(step, pendings[-1], new_step_log(cfg.log_format, step))
        writer.finish()
        Transcript(out).verify()
        trees.append(file_tree(out))
    assert trees[0] == trees[1]
    assert [p.asked for p in pendings] == [
        ["leaf", "bytes"] if writer.wants_checkpoint(step) else ["leaf"] for step in range(cfg.steps + 1)
    ]


@pytest.mark.parametrize("way", ["pending", "state"])
def test_aLargeLogsPayload_isBuiltOnTheWritersThread_whenItsStateWasHashedOnItsDevice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """A GPU trainer's step (``append_pending``) leaves a large log's payload to the writer's
    thread (``BUILD_LATER_MIN``); a step queued with its state's bytes builds it where the C
    library's thread can take the step whole. Either way the transcript is the one of logs built
    at once."""
    cfg = _cfg()
    logs = {s: random_sparse_log(s, records=8, seed=s) for s in range(cfg.steps + 1)}
    built: dict[int, str] = {}
    real = SparseStepLog._compressible

    def spied(self: SparseStepLog, step: int, *a: Any) -> Any:
        built[step] = threading.current_thread().name
        return real(self, step, *a)

    trees = []
    for later in (False, True):
        if later:
            monkeypatch.setattr(sparse_mod, "BUILD_LATER_MIN", 1)
            monkeypatch.setattr(SparseStepLog, "_compressible", spied)
        out = tmp_path / f"{way}-{later}"
        writer = TranscriptWriter.create(out, cfg, "cpu-1t")
        for step, log in logs.items():
            if way == "pending":
                writer.append_pending(step, _OnDevice(step), log)
            else:
                writer.append_state(step, memoryview(_state(step)[1]), log)
        writer.finish()
        Transcript(out).verify()
        trees.append(file_tree(out))
    assert trees[0] == trees[1]
    caller = threading.current_thread().name
    if way == "pending":
        assert set(built.values()) == {"vgame-transcript"}
    elif stepwriter.available():  # the C library's thread takes the step with its payload
        assert set(built.values()) == {caller}
    assert sorted(built) == sorted(logs)


def test_appendPending_checkpointBytesThatDoNotHashToItsLeaf_areRefused(tmp_path: Path) -> None:
    """The device's leaf is held to the host's hash of the bytes a judge will be given."""
    cfg = _cfg()
    writer = TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t")
    _append(writer, 0)
    _append(writer, 1)
    writer.append_pending(2, _OnDevice(2, leaf=_state(3)[0]), new_step_log(cfg.log_format, 2))
    with pytest.raises(TranscriptError, match="checkpoint bytes of step 2 do not hash"):
        writer.flush()
    assert len(_on_disk(tmp_path / "t", LEAVES_NAME)) == 2


def _files_way(way: str) -> contextlib.AbstractContextManager[None]:
    """The step's files written by the C call (``c``), by the C call that also compresses and
    hashes (``c-whole``, for steps queued with their state's bytes) or by the Python moves
    (``python``)."""
    if way != "python" and not library.available():
        pytest.skip("no C compiler on this machine")
    if way == "c-whole" and not stepwriter.available():
        pytest.skip("no zlib, liblzma or OpenSSL headers on this machine")
    return library.disabled() if way == "python" else contextlib.nullcontext()


def test_theStepsFiles_areTheSameWrittenInCOrInPython(tmp_path: Path) -> None:
    """Both ways leave the same files, byte for byte, and no temporary file (a step queued with its
    hash or with its state's bytes, checkpoint steps among them)."""
    cfg = _cfg()
    trees = []
    for way in ("c", "python"):
        out = tmp_path / way
        with _files_way(way):
            writer = TranscriptWriter.create(out, cfg, "cpu-1t")
            for step in range(cfg.steps + 1):
                if step % 3 == 1:
                    writer.append_state(step, memoryview(_state(step)[1]), new_step_log(cfg.log_format, step))
                else:
                    _append(writer, step)
            writer.finish()
        Transcript(out).verify()
        trees.append(file_tree(out))
    assert trees[0] == trees[1]
    assert {name for name in trees[0] if name.endswith(".tmp")} == set()
    assert sum(name.startswith("checkpoints/") for name in trees[0]) == 5


@pytest.mark.parametrize("way", ["c", "c-whole", "python"])
@pytest.mark.parametrize(
    "broken", ["log", CHUNK_HASHES_NAME, LEAVES_NAME], ids=["log-directory", "chunk-hashes", "leaves"]
)
def test_aFileThatCannotBeWritten_failsTheStepNamingIt_andNothingAfterItLands(
    tmp_path: Path, way: str, broken: str
) -> None:
    """A real failure, not a patched one: ``broken`` is made something a step cannot write to (a
    file where the log directory was, a directory where an append-only file was) before checkpoint
    step 4. The error names the step and the file; what the step writes after that file (module
    docstring: chunk, chunk hash, checkpoint, leaf) is not written; steps 0-3 stay as they were."""
    cfg = _cfg()
    out = tmp_path / "t"
    bad = 4
    assert cfg.checkpoint_interval == 2
    with _files_way(way):
        writer = TranscriptWriter.create(out, cfg, "cpu-1t")
        append = _append_state if way == "c-whole" else _append
        for step in range(bad):
            append(writer, step)
        writer.flush()
        leaves, hashes = _on_disk(out, LEAVES_NAME), _on_disk(out, CHUNK_HASHES_NAME)
        target = out / broken
        if target.is_dir():
            shutil.rmtree(target)
            target.write_bytes(b"")
        else:
            target.unlink()
            target.mkdir()
        append(writer, bad)
        with pytest.raises(TranscriptError, match=rf"writing step {bad} .*{broken}"):
            writer.flush()
    if broken != LEAVES_NAME:
        assert _on_disk(out, LEAVES_NAME) == leaves
    if broken == "log":
        assert _on_disk(out, CHUNK_HASHES_NAME) == hashes
    if broken == LEAVES_NAME:  # everything before the leaf landed
        chunk = (out / "log" / f"step-{bad:09d}.bin").read_bytes()
        assert _on_disk(out, CHUNK_HASHES_NAME) == [*hashes, chunk_leaf(chunk)]
    checkpoint = out / "checkpoints" / f"state-{bad:09d}.bin"
    assert checkpoint.exists() == (broken == LEAVES_NAME)
    assert [p.name for p in out.rglob("*.tmp")] == []
