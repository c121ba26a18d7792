"""The transcript's file names (a format: they never change) and the files a step or the model needs."""

from __future__ import annotations

from pathlib import Path

from game.training.transcript.layout import (
    TranscriptPaths,
    checkpoint_file_step,
    checkpoint_relpath,
    checkpoint_step,
    chunk_file_step,
    chunk_relpath,
)
from game.training.transcript.reader import model_files, step_files


def test_paths_nameEveryFile_asFormatV1Does() -> None:
    paths = TranscriptPaths(Path("t"))
    assert paths.manifest == Path("t/manifest.json")
    assert paths.leaves == Path("t/leaves.bin")
    assert paths.chunk_hashes == Path("t/chunk_hashes.bin")
    assert paths.chunk(7) == Path("t/log/step-000000007.bin")
    assert paths.checkpoint(12) == Path("t/checkpoints/state-000000012.bin")
    assert chunk_relpath(7) == "log/step-000000007.bin"
    assert checkpoint_relpath(12) == "checkpoints/state-000000012.bin"


def test_fileSteps_readBackTheirNames_andNothingElse() -> None:
    assert chunk_file_step("step-000000031.bin") == 31
    assert checkpoint_file_step("state-000000031.bin") == 31
    assert checkpoint_step(checkpoint_relpath(31)) == 31
    for other in ("step-31.bin", "state-000000031.bin.tmp", ".step-000000031.bin.tmp", "leaves.bin"):
        assert chunk_file_step(other) is None
        assert checkpoint_file_step(other) is None
    assert checkpoint_step("log/state-000000031.bin") is None  # a checkpoint's name in another folder
    assert checkpoint_step("state-000000031.bin") is None


def test_stepFiles_takeTheNearestCheckpointBefore_andTheChunksFromThere() -> None:
    names = {
        "manifest.json",
        "leaves.bin",
        "chunk_hashes.bin",
        *(checkpoint_relpath(s) for s in (0, 4, 8)),
        *(chunk_relpath(s) for s in range(10)),
    }
    always = ["manifest.json", "leaves.bin", "chunk_hashes.bin"]
    assert step_files(names, None) == always
    assert step_files(names, 7) == [*always, chunk_relpath(7)]
    assert step_files(names, 7, rebuild=True) == [
        *always,
        chunk_relpath(7),
        checkpoint_relpath(4),
        chunk_relpath(5),
        chunk_relpath(6),
    ]
    assert step_files(names - {chunk_relpath(7)}, 7) == always  # what the archive lacks is left out


def test_modelFiles_areTheManifest_andTheFinalCheckpoint() -> None:
    assert model_files(9) == ("manifest.json", "checkpoints/state-000000009.bin")
