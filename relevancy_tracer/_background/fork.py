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
"""

from __future__ import annotations

import os
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


def run_after_fork() -> None:
    """Renew everything registered (what the at-fork hook runs in a child; tests call it)."""
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
