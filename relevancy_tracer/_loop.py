"""A daemon thread owning one asyncio event loop, restarted after ``os.fork``.

Used to run coroutines from sync code (``score()``, ``evaluate()``) on one long-lived loop, so
async HTTP clients bound to that loop keep their connection pools, and never get collected on
a closed loop. The tracer's worker owns its own instance.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from typing import Any, Awaitable, Callable, Optional, TypeVar

T = TypeVar("T")

#: Coroutines that release what a finishing event loop owns (HTTP client sessions bound to
#: it); run in that loop by :func:`run_loop_closers` before it closes.
_closers: list[Callable[[], Awaitable[None]]] = []


#: Loops created by :class:`BackgroundLoop`: this package runs the closers in them before they
#: close, so resources bound to them (an aiohttp session) may be long-lived.
_owned: "weakref.WeakSet[asyncio.AbstractEventLoop]" = weakref.WeakSet()


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


class BackgroundLoop:
    """Lazily started event loop in a daemon thread named ``name``."""

    def __init__(self, name: str):
        self._name = name
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._pid = os.getpid()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, started on first use (and again in a forked child)."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or not (self._thread and self._thread.is_alive()):
                self._pid = os.getpid()
                loop = asyncio.new_event_loop()
                _owned.add(loop)
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def run(self, factory: Callable[[], Awaitable[T]], timeout: Optional[float] = None) -> T:
        """Run ``factory()`` on the loop and wait for its result (blocking the caller)."""
        future = asyncio.run_coroutine_threadsafe(_call(factory), self.loop())
        return future.result(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and join its thread (pending tasks are cancelled)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or self._pid != os.getpid():
            return

        try:
            asyncio.run_coroutine_threadsafe(run_loop_closers(), loop).result(timeout)
        except Exception:
            pass

        def halt() -> None:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.call_soon(loop.stop)

        loop.call_soon_threadsafe(halt)
        thread.join(timeout)


async def _call(factory: Callable[[], Awaitable[Any]]) -> Any:
    return await factory()
