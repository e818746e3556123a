"""The background worker: a bounded queue and one daemon thread owning an asyncio loop.

Modelled on the OpenTelemetry SDK's BatchProcessor (bounded deque, daemon thread, fork
handling) and sentry-python's transport worker (submit / flush / kill, losses counted by
reason):

* :meth:`Worker.submit` never blocks: it appends to a bounded deque under a short lock, wakes
  the loop only when it is idle, and returns a bool. A refused job is finished at once by the
  worker with status ``dropped`` (reason ``queue_full`` or ``shutdown``).
* The loop runs at most ``concurrency`` jobs at once, each under a deadline
  (``min(job.timeout, job.deadline - now)``); queued jobs whose deadline passes are finished
  with status ``timeout`` when it passes (a reaper watches the head of the queue).
* :meth:`flush` waits, up to a timeout, until every submitted job has finished;
  :meth:`shutdown` stops intake, flushes, then cancels what is still running and finishes what
  is still queued with status ``shutdown``, and stops the thread.
* After ``os.fork`` the child gets an empty worker (the parent's jobs stay the parent's); its
  thread starts on the child's first submit.

Jobs implement :class:`Job`: the worker calls ``await job.run()`` and, for every outcome it
decides itself, ``job.finish(status, error)``; ``finish`` must be idempotent and cheap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections import deque
from typing import Optional, Protocol

from ._loop import run_loop_closers
from .result import Status

logger = logging.getLogger("relevancy_tracer")


class Job(Protocol):
    #: monotonic time (s) after which the job is abandoned (status ``timeout``)
    deadline: float
    #: longest a running job may take (s)
    timeout: float

    async def run(self) -> None:
        """Do the work; must finish the job itself on success."""
        ...

    def finish(self, status: str, error: Optional[str] = None, reason: Optional[str] = None) -> None:
        """End the job with ``status`` (idempotent)."""
        ...


class Worker:
    """Runs jobs in the background. See the module docstring.

    Args:
        queue_size: most jobs queued (not counting running ones); more are dropped.
        concurrency: most jobs running at once.
        name: name of the daemon thread.
    """

    def __init__(self, *, queue_size: int = 1000, concurrency: int = 2, name: str = "relevancy-tracer-worker"):
        self.queue_size = queue_size
        self.concurrency = concurrency
        self.name = name
        self._reset()
        if hasattr(os, "register_at_fork"):
            weak_reset = weakref.WeakMethod(self._reset)

            def after_in_child() -> None:
                reset = weak_reset()
                if reset is not None:
                    reset()

            os.register_at_fork(after_in_child=after_in_child)

    def _reset(self) -> None:
        """Fresh state (at construction, and in a forked child)."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: deque = deque()
        self._pending = 0  # queued + running
        self._closed = False
        self._waiting = False  # the dispatcher sleeps until woken
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._wake: Optional[asyncio.Event] = None
        self._running: set = set()
        self._pid = os.getpid()

    # ------------------------------------------------------------------ caller side

    @property
    def depth(self) -> int:
        """Jobs queued or running."""
        return self._pending

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, job: Job) -> bool:
        """Queue ``job`` without blocking. False when refused (the job is then finished as dropped)."""
        if self._pid != os.getpid():  # forked without the at-fork hook (e.g. os.fork in a C extension)
            self._reset()
        with self._lock:
            if self._closed:
                reason = "shutdown"
            elif len(self._queue) >= self.queue_size:
                reason = "queue_full"
            else:
                reason = None
                self._queue.append(job)
                self._pending += 1
                wake = self._waiting
                self._waiting = False
                loop = self._loop
        if reason is not None:
            job.finish(Status.DROPPED, f"evaluation dropped: {reason}", reason=reason)
            return False
        if loop is None:
            self._start()
        elif wake:
            loop.call_soon_threadsafe(self._wake_set)
        return True

    def _start(self) -> None:
        with self._lock:
            if self._loop is not None or self._closed:
                return
            loop = asyncio.new_event_loop()
            self._loop = loop
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            try:
                loop.run_until_complete(self._dispatch())
            except Exception:  # pragma: no cover - a bug in the dispatcher
                logger.exception("relevancy-tracer: worker loop failed")
            finally:
                try:
                    loop.run_until_complete(loop.shutdown_asyncgens())
                    loop.run_until_complete(loop.shutdown_default_executor())
                finally:
                    loop.close()

        thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread = thread
        thread.start()
        started.wait(5)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every submitted job has finished; False when ``timeout`` (s) passed first."""
        if self._thread is not None and threading.current_thread() is self._thread:
            return False  # would deadlock
        deadline = time.monotonic() + max(0.0, timeout)
        with self._idle:
            while self._pending > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def shutdown(self, timeout: float = 30.0) -> bool:
        """Stop intake, flush for up to ``timeout`` s, then cancel and finish what is left.

        Every job ends exactly once: running ones are cancelled and queued ones finished with
        status ``shutdown``. Returns True when everything finished before the deadline.
        """
        with self._lock:
            if self._closed:
                return self._pending == 0
            self._closed = True
        deadline = time.monotonic() + max(0.0, timeout)
        clean = self.flush(timeout)
        loop, thread = self._loop, self._thread
        if not clean:
            with self._lock:
                leftovers = list(self._queue)
                self._queue.clear()
            for job in leftovers:
                self._safe_finish(job, Status.SHUTDOWN, "shut down before the evaluation started")
                self._done()
            if loop is not None and not loop.is_closed():
                try:
                    asyncio.run_coroutine_threadsafe(self._cancel_running(), loop).result(max(1.0, deadline - time.monotonic() + 1.0))
                except Exception:
                    pass
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake_set)  # the dispatcher sees _closed and returns
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(1.0, deadline - time.monotonic()))
        return clean

    # ------------------------------------------------------------------ loop side

    def _wake_set(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _done(self) -> None:
        with self._idle:
            self._pending -= 1
            if self._pending <= 0:
                self._pending = 0
                self._idle.notify_all()

    @staticmethod
    def _safe_finish(job: Job, status: str, error: Optional[str] = None) -> None:
        try:
            job.finish(status, error)
        except Exception:  # pragma: no cover - finish must not raise; never let it kill the loop
            logger.exception("relevancy-tracer: finishing a job failed")

    def _expire_due(self) -> Optional[float]:
        """Finish queued jobs past their deadline; the next head deadline, if any."""
        now = time.monotonic()
        expired = []
        with self._lock:
            while self._queue and self._queue[0].deadline <= now:
                expired.append(self._queue.popleft())
            head = self._queue[0].deadline if self._queue else None
        for job in expired:
            self._safe_finish(job, Status.TIMEOUT, "evaluation not started before its deadline")
            self._done()
        return head

    async def _reap(self) -> None:
        while True:
            head = self._expire_due()
            await asyncio.sleep(1.0 if head is None else min(1.0, max(0.01, head - time.monotonic())))

    async def _next_job(self) -> Optional[Job]:
        """The next queued job, waiting for one; None once closed and empty."""
        assert self._wake is not None
        while True:
            self._expire_due()
            with self._lock:
                if self._queue:
                    return self._queue.popleft()
                if self._closed:
                    return None
                # Only this thread touches the event; submit() wakes it via call_soon_threadsafe,
                # which runs after this await starts, so no wake-up is lost.
                self._waiting = True
                self._wake.clear()
            await self._wake.wait()

    async def _dispatch(self) -> None:
        self._wake = asyncio.Event()
        slots = asyncio.Semaphore(self.concurrency)
        reaper = asyncio.ensure_future(self._reap())
        try:
            while True:
                await slots.acquire()
                job = await self._next_job()
                if job is None:
                    return
                task = asyncio.ensure_future(self._run(job, slots))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
        finally:
            reaper.cancel()
            if self._running:
                await asyncio.gather(*list(self._running), return_exceptions=True)
            await run_loop_closers()  # e.g. HTTP sessions bound to this loop

    async def _run(self, job: Job, slots: asyncio.Semaphore) -> None:
        try:
            budget = min(job.timeout, job.deadline - time.monotonic())
            if budget <= 0:
                self._safe_finish(job, Status.TIMEOUT, "evaluation not started before its deadline")
                return
            await asyncio.wait_for(job.run(), budget)
        except asyncio.TimeoutError:
            self._safe_finish(job, Status.TIMEOUT, f"evaluation exceeded its deadline ({job.timeout:g} s)")
        except asyncio.CancelledError:
            self._safe_finish(job, Status.SHUTDOWN, "cancelled at shutdown")
        except Exception as exc:
            logger.exception("relevancy-tracer: evaluation job failed")
            self._safe_finish(job, Status.ERROR, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            slots.release()
            self._done()

    async def _cancel_running(self) -> None:
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
