"""The background loop: a daemon thread owning the package's one asyncio loop.

Everything asynchronous the package does runs on the process's :class:`BackgroundLoop` (owned by
the tracer's runtime, :mod:`relevancy_tracer.tracing.runtime`): the job queue dispatches evaluations on it, and sync
``score()``/``evaluate()`` and the CLI run their coroutines on it. One long-lived loop keeps the
async HTTP clients bound to it alive, with their connection pools, and closes them before the
loop ends (:func:`register_loop_closer`).

Guarantees:

* **Start is checked.** :meth:`BackgroundLoop.loop` publishes a loop only once its thread runs;
  when a thread cannot be started (a container's process limit) it raises
  :class:`LoopStartError`, and the next call tries again.
* **Stop is bounded.** :meth:`BackgroundLoop.stop` returns within its timeout whatever the
  loop's tasks do: closers get part of the budget, tasks are cancelled, the thread is joined for
  what is left (it is a daemon: it never blocks interpreter exit).
* **Fork.** :meth:`reset_after_fork` forgets the parent's thread and loop in a child (the
  runtime calls it from its one ``os.register_at_fork`` hook); the child's loop starts on first
  use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import weakref
from typing import Any, Awaitable, Callable, Optional, TypeVar

T = TypeVar("T")

#: Coroutines that release what a finishing event loop owns (HTTP client sessions bound to
#: it); run in that loop by :func:`run_loop_closers` before it closes.
_closers: list[Callable[[], Awaitable[None]]] = []

#: Loops created by :class:`BackgroundLoop`: resources bound to them (an aiohttp session) may be
#: long-lived, because this package closes them with the loop.
_owned: "weakref.WeakSet[asyncio.AbstractEventLoop]" = weakref.WeakSet()



#: Tasks of the loops a forked child inherited and abandoned (see ``reset_after_fork``).
_ABANDONED: list = []

class LoopStartError(RuntimeError):
    """The loop's thread could not be started (e.g. the process may not create threads)."""


def is_owned_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """True for a loop of a :class:`BackgroundLoop` (closed by this package, with its closers)."""
    return loop in _owned


def register_loop_closer(closer: Callable[[], Awaitable[None]]) -> None:
    """Run ``await closer()`` in every loop this package owns, before that loop closes."""
    _closers.append(closer)


async def run_loop_closers() -> None:
    """Run the registered closers in the current loop (errors are ignored)."""
    for closer in list(_closers):
        try:
            await closer()
        except Exception:
            pass


#: Starts threads; replaced in tests to simulate a process that may not create threads.
def _start_thread(thread: threading.Thread) -> None:
    thread.start()


class BackgroundLoop:
    """A lazily started asyncio loop in a daemon thread named ``name``.

    Args:
        name: the thread's name. start_timeout: seconds to wait for a new thread to run its loop.
    """

    def __init__(self, name: str, start_timeout: float = 5.0):
        self._name = name
        self._start_timeout = start_timeout
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None

    def reset_after_fork(self) -> None:
        """In a forked child: forget the parent's thread and loop (they do not exist here).

        The parent's pending tasks are kept referenced, never collected: collecting one would
        run its ``finally`` blocks in the child (on the child's renewed queue) and make asyncio
        print "Task was destroyed but it is pending!" to the app's stderr. They are at most the
        parent's in-flight evaluations and their dispatcher, per fork."""
        old = self._loop
        if old is not None:
            try:
                tasks = asyncio.all_tasks(old)
                for task in tasks:
                    task._log_destroy_pending = False  # type: ignore[attr-defined]
                _ABANDONED.append(tasks)
            except Exception:  # pragma: no cover - never fail a fork over a log line
                pass
        self._lock = threading.Lock()
        self._loop = None
        self._thread = None

    @property
    def running(self) -> bool:
        """True while the loop's thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, started on first use (and again after a stop or a fork).

        Raises :class:`LoopStartError` when the thread cannot be started.
        """
        loop = self._loop
        if loop is not None and self.running:
            return loop
        with self._lock:
            if self._loop is not None and self.running:
                return self._loop
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                try:
                    loop.run_forever()
                finally:
                    try:
                        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                        for task in pending:
                            task.cancel()
                        if pending:
                            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                        loop.run_until_complete(loop.shutdown_asyncgens())
                    except Exception:  # pragma: no cover - never fail a daemon thread's exit
                        pass
                    finally:
                        loop.close()

            thread = threading.Thread(target=run, name=self._name, daemon=True)
            try:
                _start_thread(thread)
            except Exception as exc:  # RuntimeError: can't start new thread
                loop.close()
                raise LoopStartError(f"cannot start the {self._name} thread: {exc}") from exc
            if not ready.wait(self._start_timeout):
                raise LoopStartError(f"the {self._name} thread did not start its loop in {self._start_timeout:g} s")
            _owned.add(loop)
            self._loop, self._thread = loop, thread
            return loop

    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, factory: Callable[[], Awaitable[T]]) -> "concurrent.futures.Future[T]":
        """Schedule ``factory()`` on the loop; a concurrent future of its result.

        Raises :class:`LoopStartError` when the loop cannot be started.
        """
        loop = self.loop()  # first: a failed start must not leave an un-awaited coroutine behind
        return asyncio.run_coroutine_threadsafe(_call(factory), loop)

    def run(self, factory: Callable[[], Awaitable[T]], timeout: Optional[float] = None) -> T:
        """Run ``factory()`` on the loop and wait for its result (blocking the caller)."""
        if self.in_loop_thread():
            raise RuntimeError("BackgroundLoop.run() called from the loop's own thread would deadlock")
        return self.submit(factory).result(timeout)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> bool:
        """``callback(*args)`` in the loop's thread, if the loop runs; False otherwise."""
        loop = self._loop
        if loop is None or not self.running or loop.is_closed():
            return False
        try:
            loop.call_soon_threadsafe(callback, *args)
            return True
        except RuntimeError:  # closed meanwhile
            return False

    def stop(self, timeout: float = 5.0) -> bool:
        """Run the closers, cancel every task, stop the loop and join its thread.

        Returns within about ``timeout`` seconds; True when the thread ended in time.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or not thread.is_alive() or loop.is_closed():
            return True
        if threading.current_thread() is thread:
            loop.call_soon(loop.stop)
            return False
        try:
            asyncio.run_coroutine_threadsafe(run_loop_closers(), loop).result(max(0.0, min(2.0, (deadline - time.monotonic()) / 2)))
        except Exception:
            pass
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:
            return True
        thread.join(max(0.0, deadline - time.monotonic()))
        return not thread.is_alive()


async def _call(factory: Callable[[], Awaitable[Any]]) -> Any:
    return await factory()


_process_loop = BackgroundLoop("relevancy-tracer")


def process_loop() -> BackgroundLoop:
    """The process's one background loop (shared by the tracer's job queue, ``score()``, ``evaluate()``
    and the CLI). Its thread starts on first use; a forked child gets a fresh one."""
    return _process_loop


def _renew_process_loop() -> None:
    _process_loop.reset_after_fork()


from . import fork as _fork  # noqa: E402  (the loop module is imported by everything; register once)

_fork.after_fork(_renew_process_loop)
