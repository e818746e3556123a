"""``relevancy-tracer worker``: one consumer of the Redis Stream that ``relevancy-tracer serve
--queue`` fills.

:class:`FleetWorker` consumes the stream as one consumer of the group: reclaims pending jobs
first (their worker died, or released them after a transient failure, see ``queue.py``), skips
jobs already done (a re-sent or reclaimed job whose evaluation id is recorded), scores, writes
(``writer.py``), force-flushes the exporters, and only then acknowledges; malformed jobs and
jobs failing on their ``max_deliveries``-th delivery go to the dead-letter stream.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Optional

from ..config import Settings
from ..result import Status
from .queue import OUT_OF_MEMORY, describe_redis_error
from .telemetry import ServiceTelemetry
from .writer import Scorer

logger = logging.getLogger("relevancy_tracer")

#: Engine statuses worth another delivery: the model was unreachable, failed (5xx, 429 after
#: the client's retries) or too slow. Other failures (invalid JSON after re-asking, unreadable
#: scores, invalid input) are the evaluation's outcome and are written as such at once.
TRANSIENT_STATUSES = (Status.MODEL_ERROR, Status.TIMEOUT)


def _redis_errors() -> tuple:
    import redis

    return (redis.RedisError,)


class FleetWorker:
    """A consumer of the Redis Stream: scores jobs and acknowledges them once exported.

    Every job taken ends in exactly one of: scored (or a final engine outcome such as
    ``invalid_json``) and acknowledged; already done and acknowledged; left pending for
    redelivery with backoff (a transient failure before its ``max_deliveries``-th delivery);
    moved to the dead-letter stream with its error (malformed, or a failure on its
    ``max_deliveries``-th delivery). A failing job never blocks another taken with it, and
    while a job is held its claim is extended, so no other worker takes it.

    Args:
        queue_url: the stream's Redis. settings: as for :class:`~relevancy_tracer.service.scoring_service.ScoringService`
            (``concurrency`` jobs are taken and scored at once; ``max_deliveries``;
            ``evaluation_timeout``). claim_idle: seconds (> 0) a held job may go without a claim
            extension before another worker reclaims it (extensions are sent every quarter of
            it; a released job waits ``claim_idle * 2 ** (deliveries - 1)``). consumer: the
            consumer name (default host and pid).

    Attributes:
        scored, skipped, failed, dead_lettered: jobs by how they ended (skipped: already done;
        failed: a final engine outcome other than scored, written and acknowledged); each job
        taken ends in exactly one of them or in lost. lost: pending jobs deleted from the stream
        (``XDEL``, ``XTRIM``) that this worker found and cleared (each counted by one worker of
        the fleet; the result of a held one is dropped). reclaimed: deliveries of pending jobs;
        retried: deliveries that failed transiently and left the job pending.
    """

    def __init__(self, queue_url: str, settings: Optional[Settings] = None, *, claim_idle: float = 30.0, consumer: Optional[str] = None):
        from .queue import RedisStreamQueue, consumer_name

        self.settings = settings or Settings.resolve()
        self.queue = RedisStreamQueue(queue_url, max_length=self.settings.queue_size, claim_idle=claim_idle)
        self.consumer = consumer or consumer_name()
        self.telemetry = ServiceTelemetry(queue_depth=self.queue.depth)
        self.scorer = Scorer.for_settings(self.settings, self.telemetry)
        self.scored = self.skipped = self.reclaimed = self.failed = self.retried = self.dead_lettered = self.lost = 0
        self._stop = threading.Event()
        self._held: dict[str, float] = {}  # entry id -> monotonic time until which its claim is extended
        # scored and exported, their acknowledgement failed (Redis unreachable): retried before
        # new jobs are taken, their claims extended meanwhile so no worker scores them again
        self._unacked: dict[str, tuple[Optional[str], Optional[str]]] = {}
        self._held_lock = threading.Lock()
        # held jobs found deleted from the stream by a claim extension (counted lost): their
        # results are dropped without another word
        self._deleted: set[str] = set()
        # a held job's claim is extended while it can still be in progress: the evaluation, the
        # writes and the exporters' flush (30 s); after that a wedged worker lets it go
        self._hold_limit = self.settings.evaluation_timeout + 60.0

    def stop(self) -> None:
        """Ask :meth:`run` to return after the jobs in hand (call from a signal handler)."""
        self._stop.set()

    def run(self, max_jobs: Optional[int] = None) -> None:
        """Consume until :meth:`stop` (or ``max_jobs`` jobs handled). A failing step (Redis
        unreachable) is retried after 1 s, doubling up to 30 s while it keeps failing."""
        loop = asyncio.new_event_loop()
        heartbeat = threading.Thread(target=self._extend_claims, name="relevancy-tracer-claims", daemon=True)
        heartbeat.start()
        try:
            handled = 0
            pause = 1.0
            while not self._stop.is_set() and (max_jobs is None or handled < max_jobs):
                try:
                    handled += loop.run_until_complete(self.step())
                    pause = 1.0
                except Exception as exc:  # Redis unreachable or full for a moment: retry, never crash the worker
                    if isinstance(exc, _redis_errors()):
                        logger.warning("relevancy-tracer worker: a step failed (%s); retrying in %.0f s", describe_redis_error(exc), pause)
                    else:
                        logger.warning("relevancy-tracer worker: a step failed; retrying in %.0f s", pause, exc_info=True)
                    self._stop.wait(pause)
                    pause = min(30.0, pause * 2)
        finally:
            self._stop.set()
            heartbeat.join(5.0)
            loop.close()
            self.telemetry.shutdown(10.0)
            self.queue.close()

    def _extend_claims(self) -> None:
        interval = self.queue.claim_idle / 4
        while not self._stop.wait(interval):
            now = time.monotonic()
            with self._held_lock:
                entry_ids = [entry_id for entry_id, until in self._held.items() if until > now]
            try:
                deleted = self.queue.extend(self.consumer, entry_ids)
            except Exception:
                logger.warning("relevancy-tracer worker: extending the claim of %d jobs failed", len(entry_ids), exc_info=True)
                continue
            if deleted:
                with self._held_lock:
                    self._deleted.update(deleted)
                    for entry_id in deleted:
                        self._held.pop(entry_id, None)
                self._lost(len(deleted), "held by this worker; their results will be dropped")

    def _lost(self, count: int, how: str) -> None:
        """``count`` pending jobs found deleted from the stream and cleared: counted, one log line."""
        self.lost += count
        self.telemetry.lost_jobs.add(count, {"error.type": "job_deleted"})
        logger.warning(
            "relevancy-tracer worker: %d jobs were deleted from the stream %s (XDEL or XTRIM) before they were finished (%s); counted lost",
            count, self.queue.stream, how,
        )

    def _hold(self, deliveries: list) -> None:
        until = time.monotonic() + self._hold_limit
        with self._held_lock:
            for delivery in deliveries:
                self._held[delivery.entry_id] = until

    def _release(self, deliveries: list) -> None:
        with self._held_lock:
            for delivery in deliveries:
                self._deleted.discard(delivery.entry_id)
                if delivery.entry_id not in self._unacked:
                    self._held.pop(delivery.entry_id, None)

    async def step(self, block_ms: int = 500) -> int:
        """Take up to ``concurrency`` jobs (reclaimed ones first), score, write, export and
        acknowledge them; returns how many were taken."""
        count = max(1, self.settings.concurrency)
        for entry_id, (evaluation_id, contexts_id) in list(self._unacked.items()):  # raises while Redis is unreachable
            self.queue.ack(entry_id, evaluation_id, contexts_id)
            del self._unacked[entry_id]
            with self._held_lock:
                self._held.pop(entry_id, None)
        deliveries = self.queue.reclaim(self.consumer, count, lambda n: self._lost(n, "pending, waiting to be reclaimed"))
        if deliveries:
            self.reclaimed += len(deliveries)
            self.telemetry.reclaimed.add(len(deliveries))
        else:
            deliveries = await asyncio.to_thread(self.queue.read, self.consumer, count, block_ms)
        self._hold(deliveries)
        try:
            await self._handle(deliveries)
        finally:
            self._release(deliveries)
        return len(deliveries)

    async def _handle(self, deliveries: list) -> None:
        limit = self.settings.max_deliveries
        todo = []
        for delivery in deliveries:
            if delivery.request is None:
                self._dead_letter(delivery, f"malformed job: {delivery.error}", "malformed")
            elif self.queue.is_done(delivery.request.evaluation_id):
                self.skipped += 1
                self._ack(delivery, None)
            elif delivery.deliveries > limit:  # every worker holding it stopped before finishing
                self._dead_letter(delivery, f"not acknowledged after {delivery.deliveries - 1} deliveries", "unacknowledged")
            else:
                todo.append(delivery)
        if not todo:
            return
        results = await asyncio.gather(*(self.scorer.score(d.request) for d in todo), return_exceptions=True)
        written = []
        for delivery, result in zip(todo, results):
            request = delivery.request
            if self._was_deleted(delivery):  # counted lost when found; nothing to retry or write
                continue
            if isinstance(result, BaseException):  # a bug on this job's input: never blocks the others
                if not isinstance(result, Exception):
                    raise result
                self._failed(delivery, f"scoring raised {type(result).__name__}", type(result).__name__)
                continue
            transient = result.status in TRANSIENT_STATUSES
            if transient and delivery.deliveries < limit:
                self._failed(delivery, result.status, result.status)
                continue
            if not await asyncio.to_thread(self._may_write, delivery):
                continue
            try:
                await asyncio.to_thread(self.scorer.write, request, result)
            except Exception as exc:  # an annotation write failed after retries
                self._failed(delivery, f"writing the result failed: {type(exc).__name__}", "write_failed")
                continue
            written.append((delivery, result, transient))
        if written and not await asyncio.to_thread(self.telemetry.force_flush, 30.0):
            for delivery, _, _ in written:
                self._failed(delivery, "the exporters did not flush", "export_failed")
            return
        for delivery, result, transient in written:
            if transient:  # its max_deliveries-th failure: final (the error span is written)
                self._dead_letter(delivery, f"{result.status} on delivery {delivery.deliveries} of {limit}", result.status)
                continue
            self._ack(delivery, delivery.request.evaluation_id)
            if result.status == Status.SCORED:
                self.scored += 1
            else:
                self.failed += 1

    def _was_deleted(self, delivery: Any) -> bool:
        with self._held_lock:
            deleted = delivery.entry_id in self._deleted
        if deleted:
            self.telemetry.dropped_results.add(1, {"error.type": "job_deleted"})
        return deleted

    def _may_write(self, delivery: Any) -> bool:
        """Whether this worker still holds ``delivery``'s job and it is not done (checked
        atomically in Redis, :meth:`RedisStreamQueue.may_write`). A job another worker took
        while this one was paused past ``claim_idle``, or finished, is dropped here: counted
        as skipped, its result never written. Redis unreachable or full: written (as before
        the check), the acknowledgement settles it."""
        evaluation_id = delivery.request.evaluation_id if delivery.request is not None else None
        try:
            state = self.queue.may_write(self.consumer, delivery.entry_id, evaluation_id)
        except Exception as exc:
            logger.warning(
                "relevancy-tracer worker: cannot check that job %s is still held (%s); writing its result",
                delivery.entry_id, describe_redis_error(exc),
            )
            return True
        if state == "held":
            return True
        if state in ("deleted", "gone"):  # deleted from the stream while this worker scored it
            self.telemetry.dropped_results.add(1, {"error.type": "job_deleted"})
            if state == "deleted":  # cleared by this check ("gone": by another worker, who counted it)
                self._lost(1, "held by this worker; its result is dropped")
            return False
        self.skipped += 1
        self.telemetry.dropped_results.add(1, {"error.type": "job_" + state})
        with self._held_lock:
            self._held.pop(delivery.entry_id, None)
        logger.warning(
            "relevancy-tracer worker: job %s was %s by another worker while this one scored it"
            " (paused longer than --claim-idle?); its result is dropped",
            delivery.entry_id, "finished" if state == "done" else "reclaimed",
        )
        return False

    def _failed(self, delivery: Any, error: str, error_type: str) -> None:
        """A failure of one delivery: pending for redelivery with backoff, or dead-lettered on
        the ``max_deliveries``-th."""
        if delivery.deliveries >= self.settings.max_deliveries:
            self._dead_letter(delivery, f"{error} on delivery {delivery.deliveries} of {self.settings.max_deliveries}", error_type)
            return
        self.retried += 1
        self.telemetry.retried.add(1, {"error.type": error_type})
        logger.warning("relevancy-tracer worker: job %s failed (%s) on delivery %d of %d; redelivered in %.0f s", delivery.entry_id, error, delivery.deliveries, self.settings.max_deliveries, self.queue.retry_delay(delivery.deliveries))

    def _ack(self, delivery: Any, evaluation_id: Optional[str]) -> None:
        """Acknowledge one job; never raises. Redis at ``maxmemory``: acknowledged without its
        done marker (see :meth:`RedisStreamQueue.ack`). Redis unreachable: kept, its claim
        extended, and retried before the next jobs are taken (:meth:`step`): it is not
        delivered again, so not scored twice."""
        contexts_id = delivery.request.contexts_id if delivery.request is not None else None
        try:
            if not self.queue.ack(delivery.entry_id, evaluation_id, contexts_id):
                logger.warning("relevancy-tracer worker: job %s acknowledged without its done marker: %s", delivery.entry_id, OUT_OF_MEMORY)
        except Exception as exc:
            with self._held_lock:
                self._unacked[delivery.entry_id] = (evaluation_id, contexts_id)
                self._held[delivery.entry_id] = float("inf")
            logger.warning("relevancy-tracer worker: acknowledging job %s failed (%s); retried before the next jobs are taken (it stays claimed by this worker)", delivery.entry_id, describe_redis_error(exc))

    def _dead_letter(self, delivery: Any, error: str, error_type: str) -> None:
        try:
            self.queue.dead_letter(delivery, error, self.consumer)
        except Exception as exc:  # Redis full (XADD refused) or unreachable: nothing changed
            self.telemetry.retried.add(1, {"error.type": "dead_letter_failed"})
            logger.warning("relevancy-tracer worker: moving job %s to %s failed (%s); it stays pending and is moved on a later delivery (%s)", delivery.entry_id, self.queue.dead_letter_stream, describe_redis_error(exc), error)
            return
        self.dead_lettered += 1
        self.telemetry.dead_lettered.add(1, {"error.type": error_type})
        logger.warning("relevancy-tracer worker: job %s moved to %s: %s", delivery.entry_id, self.queue.dead_letter_stream, error)
