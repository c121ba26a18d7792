"""The auditor's read-ahead: each step's log as the transcript gives it, the next one read on a
thread of its own, a read's error raised only when its step is asked for."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from game.errors import TranscriptError
from game.training.log.formats import ChunkLog
from game.training.transcript.readahead import ReadAhead
from game.training.transcript.reader import Transcript
from game.training.transcript.writer import TranscriptWriter

from .test_transcript import _append, _cfg

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


def test_logsInOrder_areTheTranscripts_theNextReadOnItsThread_noneReadPastLast(
    transcript: Transcript, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = {s: _chunk(transcript, transcript.read_log(s), s) for s in range(1, STEPS + 1)}
    calls = _reads(transcript, monkeypatch)
    with ReadAhead(transcript, last=STEPS - 1) as logs:
        got = {s: _chunk(transcript, logs.read_log(s), s) for s in range(1, STEPS)}
    assert got == {s: want[s] for s in range(1, STEPS)}
    # step 1 on the caller's thread, each later one read ahead, each once, none past ``last``
    ahead = {s: name for s, name in calls if s > 1}
    assert len(calls) == STEPS - 1 and (1, threading.current_thread().name) in calls
    assert sorted(ahead) == list(range(2, STEPS))
    assert all(name.startswith("vgame-read-ahead") for name in ahead.values())


def test_aReadAheadsError_isRaisedWhenItsStepIsAsked_notBefore(transcript: Transcript) -> None:
    chunk = transcript.chunk_path(3)
    chunk.write_bytes(chunk.read_bytes() + b"x")  # no longer the chunk its hash records
    with ReadAhead(transcript, last=STEPS) as logs:
        logs.read_log(1)
        logs.read_log(2)  # step 3's read fails on the thread meanwhile
        with pytest.raises(TranscriptError, match="step 3"):
            logs.read_log(3)
        assert logs.read_log(4).step == 4  # and the reads go on after it


def test_aStepAskedOutOfOrder_isReadThen_andTheOneAheadDropped(
    transcript: Transcript, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _chunk(transcript, transcript.read_log(4), 4)
    calls = _reads(transcript, monkeypatch)
    main = threading.current_thread().name
    with ReadAhead(transcript, last=STEPS) as logs:
        logs.read_log(1)
        assert _chunk(transcript, logs.read_log(4), 4) == want
    assert (4, main) in calls  # step 2, read ahead, was not the one asked for
