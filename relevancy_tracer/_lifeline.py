"""Child servers that cannot outlive the process that started them.

:func:`spawn` starts a command (``phoenix serve`` for the demo, ``redis-server`` for the tests)
behind a small watcher process, ``python -m relevancy_tracer._lifeline FD -- COMMAND...``:

* The parent keeps the write end of a pipe (the *lifeline*); only the watcher holds the read
  end. When the parent dies for any reason (exit, exception, SIGKILL, a native crash such as a
  segfault in a C extension, the OOM killer), the kernel closes its end and the watcher reads
  end-of-file. The watcher then sends SIGTERM to the command's process group, waits up to
  ``grace`` seconds, sends SIGKILL, and exits.
* On Linux the command is also started with ``PR_SET_PDEATHSIG`` = SIGKILL towards the
  watcher, so the command dies even when the watcher itself is killed with SIGKILL. (The
  watcher is single-threaded, which is what makes ``preexec_fn`` safe there; it would not be
  in the app's own process.)
* The watcher and the command share one new session and process group: the parent's
  ``killpg`` (see :meth:`Child.stop`) reaches both, and the terminal's Ctrl-C does not reach the
  command before the parent's own cleanup runs.

The technique is the "lifeline pipe" (the child watches a pipe inherited from its parent for
EOF), as used by e.g. Chromium's zygote and Erlang ports; ``PR_SET_PDEATHSIG`` is prctl(2).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from typing import IO, Any, Mapping, Optional, Sequence, Union

_PR_SET_PDEATHSIG = 1
_Output = Union[None, int, IO[Any]]


class Child:
    """A command started by :func:`spawn`.

    Attributes:
        process: the watcher's :class:`subprocess.Popen` (its pid is the process group id of
            the watcher and the command). pid: that pid.
    """

    def __init__(self, process: subprocess.Popen, lifeline: int):
        self.process = process
        self.pid = process.pid
        self._lifeline = lifeline

    def poll(self) -> Optional[int]:
        """The exit status (the command's, passed on by the watcher), or None while it runs."""
        return self.process.poll()

    @property
    def returncode(self) -> Optional[int]:
        return self.process.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for the command to exit. Raises :class:`subprocess.TimeoutExpired`."""
        return self.process.wait(timeout)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the process group, then SIGKILL it after ``grace`` seconds; close the lifeline."""
        try:
            if self.process.poll() is None:
                try:
                    os.killpg(self.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    self.process.wait(grace)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(self.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self.process.wait(10)
        finally:
            self._close_lifeline()

    def _close_lifeline(self) -> None:
        if self._lifeline >= 0:
            try:
                os.close(self._lifeline)
            except OSError:
                pass
            self._lifeline = -1


def spawn(
    command: Sequence[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    stdin: _Output = subprocess.DEVNULL,
    stdout: _Output = None,
    stderr: _Output = None,
    grace: float = 20.0,
) -> Child:
    """Start ``command`` so that it dies with this process (see the module docstring).

    Args:
        command: the program and its arguments.
        env, cwd, stdin, stdout, stderr: as for :class:`subprocess.Popen` (they apply to the
            command; the watcher writes nothing).
        grace: seconds between SIGTERM and SIGKILL when the parent has gone.

    Returns:
        A :class:`Child`; call :meth:`Child.stop` to stop the command.

    Raises:
        OSError: the watcher could not be started. A command that cannot be executed makes
        the watcher exit with status 127 (see :meth:`Child.poll`).
    """
    read_end, write_end = os.pipe()  # both non-inheritable: only pass_fds hands one on
    try:
        watcher = [sys.executable, "-m", "relevancy_tracer._lifeline", str(read_end), f"{grace:g}", "--", *command]
        process = subprocess.Popen(
            watcher,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pass_fds=(read_end,),
            start_new_session=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return Child(process, write_end)


def _die_with_parent() -> None:
    """In the command, before exec (Linux): SIGKILL when the watcher dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _watch(lifeline: int, grace: float, command: list[str]) -> int:
    terminated = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; SIGINT reaches us only via killpg
    try:
        child = subprocess.Popen(command, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    except OSError as exc:
        print(f"relevancy_tracer._lifeline: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    parent_gone = False
    while child.poll() is None:
        if terminated:
            break  # killpg already sent SIGTERM to the command too: just wait for it below
        try:
            ready, _, _ = select.select([lifeline], [], [], 0.5)
        except InterruptedError:
            continue
        if ready and not os.read(lifeline, 4096):
            parent_gone = True
            break
    if child.poll() is None:
        if parent_gone:
            try:
                os.killpg(os.getpgrp(), signal.SIGTERM)  # the command and anything it started
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if child.poll() is None:
            child.kill()
        child.wait()
    code = child.returncode
    return 128 - code if code < 0 else code


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m relevancy_tracer._lifeline FD GRACE -- COMMAND...`` (used by :func:`spawn`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[2] != "--":
        print("usage: python -m relevancy_tracer._lifeline FD GRACE -- COMMAND...", file=sys.stderr)
        return 2
    return _watch(int(args[0]), float(args[1]), args[3:])


if __name__ == "__main__":
    sys.exit(main())
