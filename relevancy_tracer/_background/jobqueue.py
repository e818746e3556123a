"""The job queue: a bounded queue whose jobs run on the background loop.

Used by the tracer (one evaluation per sampled call) and by ``relevancy-tracer serve`` in its
in-process mode. (A *fleet worker*, ``relevancy-tracer worker``, is a process reading the Redis
Stream: :class:`~relevancy_tracer.service.fleet_worker.FleetWorker`, not this.)

Modelled on the OpenTelemetry SDK's BatchProcessor (bounded queue, daemon thread, fork handling)
and sentry-python's transport worker (submit / flush / kill, losses counted by reason):

* :meth:`JobQueue.submit` never blocks: it appends to a bounded deque under a short lock, wakes the
  dispatcher only when it is idle, and returns a bool. A refused job is finished at once with
  status ``dropped`` (reason ``queue_full``, ``shutdown`` or ``thread_start_failed``), or, with
  admission by capacity (``capacity``, :class:`~relevancy_tracer._background.capacity.Capacity`),
  with status ``capacity`` (reason ``sample`` or ``expected_wait``): O(1) reads of estimates
  the loop maintains.
* The dispatcher is a task on a :class:`~relevancy_tracer._background.loop.BackgroundLoop` (the
  process's one background loop; a private one when the queue is used alone). It runs at most
  ``concurrency`` jobs at once. A job's ``deadline`` is when its result is due (``math.inf``:
  never, as for ``serve``'s accepted spans). A running job gets ``job.timeout``
  (``evaluation_timeout``), and a job past its limit ends with status ``timeout``, its error
  naming the limit that applied and its value.
* A job that can be *deferred* (``job.deferrable``: the answer span's hold) is told at its
  ``deadline`` (``job.defer()``), running or still queued, and goes on: its result is written
  elsewhere, never thrown away. Its result stays useful until ``job.due`` (``evaluation_timeout``
  after the call), and once started it runs for up to ``job.timeout``. For other jobs ``due``
  is the ``deadline``, and a running job stops at the earlier of its deadline and its timeout.
* A queued job that can no longer finish by its ``due`` is not started: it ends with status
  ``capacity``, reason ``deadline``, its error naming the limit (``job.deadline_name``, e.g.
  ``hold_timeout (60 s)``). A deferrable job still queued at its deadline is deferred if it is
  expected to finish by its ``due`` (:meth:`Capacity.expected_finish
  <relevancy_tracer._background.capacity.Capacity.expected_finish>` for its place in the
  queue), and otherwise ended there, so its answer span says ``capacity`` at once rather than
  ``deferred`` now and ``capacity`` later.
* If the loop's thread cannot be started (a container's process limit), the job is dropped with
  reason ``thread_start_failed`` (its span is ended, the drop counted); the next submit tries
  again.
* :meth:`flush` waits, up to its timeout, until every submitted job has finished;
  :meth:`shutdown` stops intake, flushes, then cancels what is still running and finishes what
  is still queued with status ``shutdown``. Both return within their timeout plus a fraction of
  a second, whatever the jobs' endpoints do.
* :meth:`reset_after_fork` gives a forked child an empty queue (the parent's jobs stay the
  parent's).

Jobs implement :class:`Job`: the queue calls ``await job.run()`` and, for every outcome it
decides itself, ``job.finish(status, error, reason)``; ``finish`` must be idempotent and cheap.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from typing import Optional, Protocol

from .._logging import log_failure
from .capacity import Capacity
from .loop import BackgroundLoop, LoopStartError
from ..result import Status

logger = logging.getLogger("relevancy_tracer")

#: Seconds allowed beyond a caller's timeout for cancelling and finishing what is left.
GRACE = 0.5


class Job(Protocol):
    #: monotonic time (s) by which the job's result is due (``math.inf``: none)
    deadline: float
    #: the setting that set ``deadline`` and its value in seconds (named in errors)
    deadline_name: str
    deadline_limit: float
    #: longest a running job may take (s): ``evaluation_timeout``
    timeout: float
    #: the job keeps running past ``deadline`` after ``defer()`` (its result goes elsewhere)
    deferrable: bool
    #: monotonic time after which a queued job is not started (its result no longer useful;
    #: optional, default ``deadline``; later than ``deadline`` only for a deferrable job), and
    #: the setting that set it and its value (named in errors; default the deadline's)
    due: float
    due_name: str
    due_limit: float
    #: the call's 128-bit trace id (0: none), for the admission's fair sample
    trace_id: int

    async def run(self) -> None:
        """Do the work; must finish the job itself on success."""
        ...

    def finish(self, status: str, error: Optional[str] = None, reason: Optional[str] = None) -> None:
        """End the job with ``status`` (idempotent)."""
        ...

    def defer(self) -> None:
        """The deadline passed while the job runs or waits (only called when ``deferrable``);
        idempotent."""
        ...


def _limit(job: Job) -> tuple[str, float]:
    """(name, seconds) of a job's deadline setting."""
    return getattr(job, "deadline_name", "deadline"), float(getattr(job, "deadline_limit", 0.0))


def _due(job: Job) -> float:
    """Monotonic time after which a queued ``job`` is not started."""
    return max(job.deadline, getattr(job, "due", job.deadline)) if getattr(job, "deferrable", False) else job.deadline


def _due_limit(job: Job) -> tuple[str, float]:
    """(name, seconds) of the setting that set a job's ``due``."""
    if getattr(job, "deferrable", False) and hasattr(job, "due_name"):
        return job.due_name, float(job.due_limit)
    return _limit(job)


class JobQueue:
    """Runs jobs in the background. See the module docstring.

    Args:
        queue_size: most jobs queued (not counting running ones); more are dropped.
        concurrency: most jobs running at once.
        name: name of the loop thread when the queue owns its loop.
        loop: the background loop to run on (default: a private one, stopped by :meth:`shutdown`).
        capacity: admission by capacity for :meth:`submit` (default: none; every job that fits
            the queue is taken).
    """

    def __init__(self, *, queue_size: int = 1000, concurrency: int = 2, name: str = "relevancy-tracer-worker", loop: Optional[BackgroundLoop] = None, capacity: Optional[Capacity] = None):
        self.queue_size = queue_size
        self.concurrency = concurrency
        self.name = name
        self.capacity = capacity
        self._own_loop = loop is None
        self._loop = loop or BackgroundLoop(name)
        self.reset_after_fork()

    def reset_after_fork(self) -> None:
        """Fresh state (at construction, and in a forked child)."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: deque = deque()
        self._pending = 0  # queued + running
        self._closed = False
        self._dispatching = False  # a dispatcher task exists on the loop
        self._waiting = False  # the dispatcher sleeps until woken
        self._wake: Optional[asyncio.Event] = None
        self._running: set = set()
        self._dispatcher: Optional[asyncio.Future] = None
        self._deadlines_seen = -math.inf  # queued jobs with a deadline up to this were handled
        if self._own_loop:
            self._loop.reset_after_fork()

    # ------------------------------------------------------------------ caller side

    @property
    def depth(self) -> int:
        """Jobs queued or running."""
        return self._pending

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, job: Job) -> bool:
        """Queue ``job`` without blocking. False when refused (the job is then finished as
        dropped, or as ``capacity`` when admission by capacity sheds it)."""
        shed: Optional[str] = None
        with self._lock:
            if self._closed:
                reason: Optional[str] = "shutdown"
            elif len(self._queue) >= self.queue_size:
                reason = "queue_full"
            else:
                reason = None
                capacity = self.capacity
                if capacity is not None:
                    shed = capacity.admit(getattr(job, "trace_id", 0), self._pending)
                if shed is None:
                    self._queue.append(job)
                    self._pending += 1
                    start, wake = self._claim_dispatch()
        if reason is not None:
            self._safe_finish(job, Status.DROPPED, f"evaluation dropped: {reason}", reason)
            return False
        if shed is not None:
            self._safe_finish(job, Status.CAPACITY, _shed_message(shed, job), shed)
            return False
        return self._dispatch_queued(start, wake)

    def submit_all(self, jobs: list, *, admit_when_empty: bool = False) -> bool:
        """Queue every job or none (the service refuses a whole export request atomically, so
        a refused request queued nothing and can be re-sent as is). Never blocks. False when
        there is not room for all of them (nothing is queued or finished). With
        ``admit_when_empty``, more than ``queue_size`` jobs are taken when the queue is empty
        (a batch larger than the bound would otherwise be refused forever)."""
        if not jobs:
            return True
        with self._lock:
            if self._closed:
                return False
            if len(self._queue) + len(jobs) > self.queue_size and not (admit_when_empty and not self._queue):
                return False
            self._queue.extend(jobs)
            self._pending += len(jobs)
            start, wake = self._claim_dispatch()
        return self._dispatch_queued(start, wake)

    def _claim_dispatch(self) -> tuple[bool, bool]:
        """Under the lock, after queueing: (start a dispatcher, wake the sleeping one)."""
        wake = self._waiting
        self._waiting = False
        start = not self._dispatching or not self._loop.running
        if start:
            self._dispatching = True
        return start, wake

    def _dispatch_queued(self, start: bool, wake: bool) -> bool:
        """Outside the lock: start or wake the dispatcher; False when its thread cannot start."""
        if start:
            return self._start_dispatcher()
        if wake:
            self._loop.call_soon(self._wake_set)
        return True

    @property
    def room(self) -> int:
        """Jobs the queue can still take."""
        return max(0, self.queue_size - len(self._queue))

    def _start_dispatcher(self) -> bool:
        try:
            self._dispatcher = self._loop.submit(self._dispatch)  # type: ignore[assignment]
            return True
        except LoopStartError as exc:
            logger.warning("relevancy-tracer: %s; queued evaluations are dropped (reason thread_start_failed)", exc)
            with self._lock:
                self._dispatching = False
                dropped = list(self._queue)
                self._queue.clear()
            for job in dropped:
                self._safe_finish(job, Status.DROPPED, "evaluation dropped: the worker thread could not start", "thread_start_failed")
                self._done()
            return False

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every submitted job has finished; False when ``timeout`` (s) passed first."""
        if self._loop.in_loop_thread():
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
        status ``shutdown``. Returns within ``timeout`` + :data:`GRACE` seconds; True when every
        job finished before the deadline.
        """
        with self._lock:
            if self._closed:
                return self._pending == 0
            self._closed = True
        deadline = time.monotonic() + max(0.0, timeout)
        clean = self.flush(timeout)
        if not clean:
            with self._lock:
                leftovers = list(self._queue)
                self._queue.clear()
            for job in leftovers:
                self._safe_finish(job, Status.SHUTDOWN, "shut down before the evaluation started")
                self._done()
            try:
                future = self._loop.submit(self._cancel_running)
                future.result(max(0.05, min(GRACE / 2, deadline + GRACE / 2 - time.monotonic())))
            except Exception:
                pass
            # jobs still not finished (their cancellation is stuck): finish them from here
            for task, job in list(self._running_jobs()):
                self._safe_finish(job, Status.SHUTDOWN, "cancelled at shutdown")
        self._loop.call_soon(self._wake_set)  # the dispatcher sees _closed and returns
        if self._own_loop:
            self._loop.stop(max(0.05, deadline + GRACE - time.monotonic()))
        return clean

    # ------------------------------------------------------------------ loop side

    def _running_jobs(self) -> list:
        return [(task, getattr(task, "_relevancy_job", None)) for task in list(self._running) if getattr(task, "_relevancy_job", None) is not None]

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
    def _safe_finish(job: Job, status: str, error: Optional[str] = None, reason: Optional[str] = None) -> None:
        try:
            job.finish(status, error, reason)
        except Exception:  # pragma: no cover - finish must not raise; never let it kill the loop
            logger.exception("relevancy-tracer: finishing a job failed")

    def _expire_due(self) -> Optional[float]:
        """At each queued job's deadline: defer it (deferrable and expected to finish by its
        ``due``) or finish it (status ``capacity``, reason ``deadline``: never started); finish
        deferred ones past their ``due``. Returns the next time something is due, if any.

        Cost: O(jobs past their deadline still queued), under the lock; deadlines are in queue
        order (one setting per queue), so the scan stops at the first job not yet due."""
        now = time.monotonic()
        expired: list = []
        to_defer: list = []
        crossed_before = self._deadlines_seen
        with self._lock:
            self._deadlines_seen = now
            kept: list = []
            ahead = len(self._running)
            capacity = self.capacity
            while self._queue and self._queue[0].deadline <= now:
                job = self._queue.popleft()
                due = _due(job)
                if due <= now:
                    expired.append((job, job.deadline > crossed_before))
                elif job.deadline > crossed_before:  # its hold ends now
                    if capacity is not None and now + capacity.expected_finish(ahead) > due:
                        expired.append((job, True))
                        continue
                    to_defer.append(job)
                    kept.append(job)
                    ahead += 1
                else:  # deferred earlier, still useful: waits for a slot
                    kept.append(job)
                    ahead += 1
            self._queue.extendleft(reversed(kept))
            nexts = [_due(kept[0])] if kept else []
            rest = self._queue[len(kept)].deadline if len(self._queue) > len(kept) else None
            if rest is not None:
                nexts.append(rest)
        for job in to_defer:
            self._defer(job)
        for job, at_deadline in expired:
            self._not_started(job, at_deadline)
            self._done()
        head = min(nexts) if nexts else None
        return head if head is not None and head != math.inf else None

    def _not_started(self, job: Job, at_deadline: bool = True) -> None:
        name, limit = _limit(job) if at_deadline else _due_limit(job)
        self._safe_finish(job, Status.CAPACITY, f"evaluation not started: it could not finish within {name} ({limit:g} s)", "deadline")

    async def _reap(self) -> None:
        while True:
            head = self._expire_due()
            capacity = self.capacity
            if capacity is not None:
                capacity.update()
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
                    slots.release()
                    return
                task = asyncio.ensure_future(self._run(job, slots, len(self._running) + 1 >= self.concurrency))
                task._relevancy_job = job  # type: ignore[attr-defined]
                self._running.add(task)
                task.add_done_callback(self._running.discard)
        finally:
            reaper.cancel()
            with self._lock:
                self._dispatching = False
                self._waiting = False
            if self._running:
                await asyncio.gather(*list(self._running), return_exceptions=True)

    async def _run(self, job: Job, slots: asyncio.Semaphore, busy: bool) -> None:
        """Run one job; ``busy``: every slot is taken with it (its duration measures capacity)."""
        started = time.monotonic()
        timer: Optional[asyncio.TimerHandle] = None
        ran = False
        limit_name, limit = "evaluation_timeout", float(job.timeout)
        try:
            deferrable = getattr(job, "deferrable", False)
            remaining = _due(job) - started
            capacity = self.capacity
            # an idle scorer with nothing else queued starts it anyway (it keeps measuring)
            idle = len(self._running) <= 1 and not self._queue
            if remaining <= 0 or (capacity is not None and not capacity.worth_starting(remaining, idle)):
                self._not_started(job, at_deadline=job.deadline > started)
                return
            budget = float(job.timeout)
            if deferrable:
                held = job.deadline - started
                if held <= 0:
                    self._defer(job)  # its hold ended while it waited (already told: idempotent)
                elif held != math.inf:
                    timer = asyncio.get_running_loop().call_later(held, self._defer, job)
            elif remaining < budget:
                budget = remaining
                limit_name, limit = _limit(job)
            ran = True
            await asyncio.wait_for(job.run(), budget)
        except asyncio.TimeoutError:
            self._safe_finish(job, Status.TIMEOUT, f"evaluation exceeded {limit_name} ({limit:g} s)", limit_name)
        except asyncio.CancelledError:
            ran = False
            self._safe_finish(job, Status.SHUTDOWN, "cancelled at shutdown")
        except Exception as exc:
            log_failure("evaluation job failed", False)
            self._safe_finish(job, Status.ERROR, f"internal error: {type(exc).__name__}")
        finally:
            if timer is not None:
                timer.cancel()
            if ran and self.capacity is not None:
                self.capacity.observe(time.monotonic() - started, busy)
            slots.release()
            self._done()

    @staticmethod
    def _defer(job: Job) -> None:
        try:
            job.defer()
        except Exception:  # pragma: no cover - defer must not raise; never let it kill the loop
            logger.exception("relevancy-tracer: deferring a job failed")

    async def _cancel_running(self) -> None:
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=GRACE / 2)


def _shed_message(reason: str, job: Job) -> str:
    name, limit = _limit(job)
    if reason == "sample":
        return "not scored: over the scorer's capacity (outside the effective sample ratio)"
    return f"not scored: the expected wait plus evaluation exceeds {name} ({limit:g} s)"
