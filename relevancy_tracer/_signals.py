"""SIGINT and SIGTERM for the commands: stop the way the command chooses, keep what it finished."""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Optional


class StopSignals:
    """While active (in the main thread), SIGINT and SIGTERM call ``stop`` instead of raising
    KeyboardInterrupt or killing the process, so the command ends the way it chooses and
    keeps what it finished. A SIGINT the parent ignores (a background job) stays ignored.
    ``signum`` is the first signal received (None: none); ``exit_status`` is 128 + signum.
    Outside the main thread (where Python cannot install handlers) it does nothing."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._stop: Optional[Callable[[], None]] = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._received)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            # None: a handler installed outside Python, which cannot be put back; default then
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def _received(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if self._stop is not None:
            self._stop()

    def on_stop(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` on the next signal (now, if one already came)."""
        self._stop = stop
        if self.signum is not None:
            stop()

    @property
    def exit_status(self) -> int:
        """128 + the first signal's number (130 for SIGINT, 143 for SIGTERM); 128 when none came."""
        return 128 + (self.signum or 0)


def stop_on_signals(stop: Callable[[], None]) -> None:
    """SIGTERM (Docker, systemd, Kubernetes) and SIGINT call ``stop`` for the rest of the
    process's life (long-running commands: ``serve``, ``worker``); main thread only."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: stop())
