"""Starting the ``vgame`` processes that a test stops with a signal."""

from __future__ import annotations

import signal

#: The signals the tests send a node or ``vgame train`` to stop it the way a person or a service
#: manager would.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_signals() -> None:
    """``preexec_fn`` for such a process: the stop signals at their default disposition. A suite run
    under ``nohup`` or from a script's ``&`` starts with SIGHUP or SIGINT ignored, a child inherits
    that, and Python then installs no handler for it: the test's signal would do nothing."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
