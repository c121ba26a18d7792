"""One writer per directory: what `vgame train` and `vgame node` hold while they run."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from game.errors import DirectoryInUse, VGameError
from game.fsio import exclusive_directory

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")


def test_exclusiveDirectory_secondHolder_isRefusedUntilTheFirstLetsGo(tmp_path: Path) -> None:
    d = tmp_path / "made" / "here"
    with exclusive_directory(d, "busy: d") as held:
        assert held == d and d.is_dir()
        with pytest.raises(DirectoryInUse, match="busy: d"), exclusive_directory(d, "busy: d"):
            pass
    with exclusive_directory(d, "busy: d"):  # let go on leaving the block
        pass
    assert issubclass(DirectoryInUse, VGameError)


def test_exclusiveDirectory_heldByAKilledProcess_isFreeAgain(tmp_path: Path) -> None:
    holder = textwrap.dedent(
        f"""
        import sys, time
        from game.fsio import exclusive_directory
        with exclusive_directory({str(tmp_path)!r}, "held"):
            print("held", flush=True)
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryInUse), exclusive_directory(tmp_path, "held elsewhere"):
            pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with exclusive_directory(tmp_path, "no stale lock after kill -9"):
        pass
