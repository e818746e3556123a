"""The package's one ``os.register_at_fork`` hook.

A child process created by ``os.fork`` (gunicorn and uWSGI workers, multiprocessing's ``fork``
start method) inherits the parent's memory but none of its threads: a lock held by a parent
thread at the moment of the fork stays locked forever in the child, and a loop or HTTP client
bound to a parent thread is dead. So every object of this package that owns a lock, a thread, a
loop or a client registers how to renew itself, and one hook renews all of them in the child
before the child's code continues:

* :func:`after_fork` registers a module-level function (module singletons);
* :func:`renew_after_fork` registers an object and its renewal function (held weakly: a
  collected object is forgotten).

Functions run first, in registration order, then objects. A renewal that raises is ignored (the
child must not fail because of the tracer).

Before any of them, :func:`forget_dead_imports` repairs the import system: the worker imports
lazily (the ``openai`` client, a scoring method's modules) on its own thread, and a fork in the
middle of such an import leaves the child a half-executed module in ``sys.modules`` and a module
lock owned by a thread that does not exist there; every later import of that module would get
the partial module ("partially initialized module 'openai'") or wait forever. The child
forgets both, so the module is imported again, whole, when it is next needed.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[[], None])

_functions: list[Callable[[], None]] = []
_objects: "weakref.WeakKeyDictionary[Any, Callable[[Any], None]]" = weakref.WeakKeyDictionary()


def after_fork(function: F) -> F:
    """Call ``function()`` in every forked child (usable as a decorator)."""
    _functions.append(function)
    return function


def renew_after_fork(obj: Any, renew: Callable[[Any], None]) -> None:
    """Call ``renew(obj)`` in every forked child while ``obj`` is alive."""
    _objects[obj] = renew


def forget_dead_imports() -> list[str]:
    """In a forked child: forget the imports that were in progress on threads the fork did not
    copy (every thread but the one that forked, and those started since by at-fork hooks).

    For each module lock (``importlib._bootstrap``'s per-module locks, CPython 3.10-3.13) owned
    by such a thread: the lock is dropped, so the next import makes a new one, and the module,
    if it is in ``sys.modules`` still initializing, is removed, so it is imported again whole.
    Modules whose import finished are kept. Imports in progress on the forking thread itself
    (a fork run by a module's top-level code) are left alone. Returns the names of the
    modules removed. Never raises (an interpreter without these internals is left as it is)."""
    removed: list[str] = []
    try:
        from importlib import _bootstrap

        alive = {thread.ident for thread in threading.enumerate()}
        alive.add(threading.get_ident())
        dead: set[int] = set()
        for name, ref in list(_bootstrap._module_locks.items()):
            lock = ref()
            owner = getattr(lock, "owner", None)
            if lock is None or owner is None or owner in alive or not lock.count:
                continue
            dead.add(owner)
            _bootstrap._module_locks.pop(name, None)
            module = sys.modules.get(name)
            if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
                del sys.modules[name]
                removed.append(name)
        blocking = getattr(_bootstrap, "_blocking_on", None)
        for owner in dead:  # the dead threads' "waiting for" entries (deadlock detection)
            waiting = blocking.get(owner) if blocking is not None else None
            if isinstance(waiting, list):  # 3.12+: a list of locks per thread
                waiting.clear()
            elif waiting is not None and isinstance(blocking, dict):  # 3.10-3.11: one lock
                blocking.pop(owner, None)
    except Exception:
        pass
    return removed


def run_after_fork() -> None:
    """Renew everything registered (what the at-fork hook runs in a child; tests call it)."""
    forget_dead_imports()
    for function in list(_functions):
        try:
            function()
        except Exception:
            pass
    for obj, renew in list(_objects.items()):
        try:
            renew(obj)
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=run_after_fork)
