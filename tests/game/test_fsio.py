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


def test_atomicWrite_withAMode_holdsItFromTheFirstByte_overACrashesLeftover(tmp_path: Path) -> None:
    import stat

    from game.fsio import atomic_write, temp_name

    path = tmp_path / "secret.key"
    leftover = temp_name(path)
    leftover.write_bytes(b"half")
    leftover.chmod(0o644)  # a crash's temporary file, readable by all
    atomic_write(path, b"key\n", mode=0o600)
    assert path.read_bytes() == b"key\n" and not leftover.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
