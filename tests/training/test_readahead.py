"""The auditor's read-ahead: each step's log as the transcript gives it, the next one read on a
thread of its own, a read's error raised only when its step is asked for."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from game.errors import TranscriptError
from game.training.log.formats import ChunkLog
from game.training.log.sparse import SparseStepLog
from game.training.transcript import readahead
from game.training.transcript.readahead import ReadAhead, depth_for
from game.training.transcript.reader import Transcript
from game.training.transcript.writer import TranscriptWriter

from .test_transcript import _append, _cfg, _state

STEPS = 5


@pytest.fixture
def transcript(tmp_path: Path) -> Transcript:
    with TranscriptWriter.create(tmp_path / "t", _cfg(), "cpu-1t") as writer:
        for step in range(STEPS + 1):
            _append(writer, step)
    return Transcript(tmp_path / "t")


def _reads(t: Transcript, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Every ``t.read_log`` call from now on: (step, thread name)."""
    calls: list[tuple[int, str]] = []
    real = t.read_log

    def read_log(step: int) -> ChunkLog:
        calls.append((step, threading.current_thread().name))
        return real(step)

    monkeypatch.setattr(t, "read_log", read_log)
    return calls


def _chunk(t: Transcript, log: ChunkLog, step: int) -> bytes:
    return log.encode(step, t.spec_hash)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_logsInOrder_areTheTranscripts_theNextOnesReadOnThreads_noneReadPastLast(
    transcript: Transcript, monkeypatch: pytest.MonkeyPatch, depth: int
) -> None:
    want = {s: _chunk(transcript, transcript.read_log(s), s) for s in range(1, STEPS + 1)}
    calls = _reads(transcript, monkeypatch)
    got = {}
    with ReadAhead(transcript, last=STEPS - 1, depth=depth) as logs:
        for s in range(1, STEPS):
            got[s] = _chunk(transcript, logs.read_log(s), s)
            # the ``depth`` steps after it asked for, and none beyond (nor past ``last``)
            assert [step for step, _ in logs._ahead] == list(range(s + 1, min(s + depth, STEPS - 1) + 1))
            assert max(step for step, _ in calls) <= min(s + depth, STEPS - 1)
    assert got == {s: want[s] for s in range(1, STEPS)}
    # step 1 on the caller's thread, each later one read ahead, each once
    ahead = {s: name for s, name in calls if s > 1}
    assert len(calls) == STEPS - 1 and (1, threading.current_thread().name) in calls
    assert sorted(ahead) == list(range(2, STEPS))
    assert all(name.startswith("vgame-read-ahead") for name in ahead.values())


def test_aGpuAuditor_readsTwoAhead_whereTheHostHasTheCores(monkeypatch: pytest.MonkeyPatch) -> None:
    for cores_less_one, want in ((1, 1), (2, 2), (15, 2)):
        monkeypatch.setattr(readahead, "compress_threads", lambda n=cores_less_one: n)
        assert depth_for(pin=True) == want
        assert depth_for(pin=False) == 1  # a CPU step takes far longer than a read


@pytest.mark.parametrize("depth", [1, 3])
def test_aReadAheadsError_isRaisedWhenItsStepIsAsked_notBefore(transcript: Transcript, depth: int) -> None:
    chunk = transcript.chunk_path(3)
    chunk.write_bytes(chunk.read_bytes() + b"x")  # no longer the chunk its hash records
    with ReadAhead(transcript, last=STEPS, depth=depth) as logs:
        logs.read_log(1)
        logs.read_log(2)  # step 3's read fails on the thread meanwhile
        with pytest.raises(TranscriptError, match="step 3"):
            logs.read_log(3)
        assert logs.read_log(4).step == 4  # and the reads go on after it


@pytest.mark.parametrize("depth", [1, 2])
def test_aStepAskedOutOfOrder_isReadThen_andTheOnesAheadDropped(
    transcript: Transcript, monkeypatch: pytest.MonkeyPatch, depth: int
) -> None:
    want = {s: _chunk(transcript, transcript.read_log(s), s) for s in (4, 5)}
    calls = _reads(transcript, monkeypatch)
    main = threading.current_thread().name
    with ReadAhead(transcript, last=STEPS, depth=depth) as logs:
        logs.read_log(1)
        assert _chunk(transcript, logs.read_log(4), 4) == want[4]
        assert _chunk(transcript, logs.read_log(5), 5) == want[5]
    assert (4, main) in calls  # the steps read ahead (2, 3) were not the one asked for
    assert (5, main) not in calls  # read ahead of step 4, as asked for next


# ---- pinned chunks (a GPU auditor's): page-locked memory needs a GPU, so a stand-in copies ----


@pytest.fixture
def stand_in_pin(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """``Tensor.pin_memory`` as a copy (page-locked memory needs a GPU); the tensors it made."""
    made: list[torch.Tensor] = []

    def pin_memory(self: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        made.append(self.clone())
        return made[-1]

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    return made


def _listing_log(step: int) -> SparseStepLog:
    """A sparse log with entries in two of its three records."""
    log = SparseStepLog(step)
    log.append(0, "aten.mm.default", 100, torch.tensor([3, 7, 50 + step]))
    log.append(1, "aten.add.Tensor", 10, torch.zeros(0, dtype=torch.int64))
    log.append(4, "aten.mm.default", 64, torch.tensor([0, 63]))
    return log


@pytest.fixture
def listing(tmp_path: Path) -> Transcript:
    """A sparse transcript whose chunks list entries."""
    cfg = _cfg()
    assert cfg.log_format == "sparse"
    with TranscriptWriter.create(tmp_path / "t", cfg, "cpu-1t") as writer:
        for step in range(STEPS + 1):
            leaf, data = _state(step)
            checkpoint = data if writer.wants_checkpoint(step) else None
            writer.append_step(step, step_log=_listing_log(step), state_hash=leaf, checkpoint=checkpoint)
    return Transcript(tmp_path / "t")


def test_aPinnedChunk_keepsItsRecordsEntriesAndBytes_itsEntriesInThePinnedCopy(
    listing: Transcript, stand_in_pin: list[torch.Tensor]
) -> None:
    log = listing.read_log(2)
    assert isinstance(log, SparseStepLog)
    rows = log.decoded_rows()
    assert rows is not None and log.pinned_positions() is None
    before = (
        _chunk(listing, log, 2),
        rows.positions.copy(),
        [(e.record, e.positions.tolist()) for e in log.entries()],
    )
    log = listing.read_log(2)
    assert isinstance(log, SparseStepLog)
    log.pin()
    pinned = log.pinned_positions()
    assert pinned is not None and len(stand_in_pin) == 1
    rows = log.decoded_rows()
    assert rows is not None and np.shares_memory(rows.positions, pinned.numpy())
    assert rows.positions.tolist() == before[1].tolist()
    # the records read the pinned copy: the same records, entries and chunk bytes
    assert [(e.record, e.positions.tolist()) for e in log.entries()] == before[2]
    assert _chunk(listing, log, 2) == before[0]
    log.pin()  # once is enough
    assert len(stand_in_pin) == 1
    log.append(9, "aten.mm.default", 4, torch.tensor([1]))  # changed: no longer the decoded chunk
    assert log.decoded_rows() is None and log.pinned_positions() is None


def test_aLogNotAsDecoded_isNotPinned(listing: Transcript, stand_in_pin: list[torch.Tensor]) -> None:
    built = _listing_log(3)
    built.pin()  # built here: its entries are tensors of its own, not one decoded array
    read = listing.read_log(3)
    assert isinstance(read, SparseStepLog)
    read.entries()  # turned into records one by one, which hold the decoded array's views
    read.pin()
    empty = SparseStepLog.decode(
        SparseStepLog(1).encode(1, listing.spec_hash), step=1, spec_hash=listing.spec_hash
    )
    empty.pin()  # nothing listed: nothing to copy
    assert stand_in_pin == []
    assert (
        built.pinned_positions() is None
        and read.pinned_positions() is None
        and empty.pinned_positions() is None
    )


@pytest.mark.parametrize("pin", [True, False])
def test_readAhead_pinsEachChunk_onItsThread_onlyWhereAsked(
    listing: Transcript, stand_in_pin: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch, pin: bool
) -> None:
    threads: dict[int, str] = {}
    real = SparseStepLog.pin

    def spied(self: SparseStepLog) -> None:
        assert self.step is not None
        threads[self.step] = threading.current_thread().name
        real(self)

    monkeypatch.setattr(SparseStepLog, "pin", spied)
    want = {s: _chunk(listing, listing.read_log(s), s) for s in range(1, STEPS + 1)}
    with ReadAhead(listing, last=STEPS, pin=pin) as logs:
        got = [logs.read_log(s) for s in range(1, STEPS + 1)]
    assert {s: _chunk(listing, log, s) for s, log in enumerate(got, start=1)} == want
    pinned = [isinstance(log, SparseStepLog) and log.pinned_positions() is not None for log in got]
    assert pinned == [pin] * STEPS
    if pin:  # step 1 on the caller's thread, each later one beside the step before
        assert threads.pop(1) == threading.current_thread().name
        assert sorted(threads) == list(range(2, STEPS + 1))
        assert all(name.startswith("vgame-read-ahead") for name in threads.values())
    else:
        assert threads == {}
